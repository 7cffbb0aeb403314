"""Peak host memory per process of `reasoner sft`: 1 process vs 2 (FSDP2 over gloo), and what
`reasoner plan` predicts for each.

A random-weight Qwen2 checkpoint in the shape of Qwen2.5-0.5B (494M parameters, fp32 on disk)
trains for two steps on short synthetic rows, each step accumulating two micro-batches per
process (four on one): between them FSDP2 must keep its gradients sharded. Each process records its peak RSS (VmHWM;
`ru_maxrss` would start at torchrun's own peak) from start to end: loading, sharding, the steps
and the final checkpoint.

    python scripts/bench_memory.py                 # writes runs/bench_memory/report.json
    python scripts/bench_memory.py --layers 4      # a smaller model, for a quick look
    python scripts/bench_memory.py --untied        # untied embeddings, as Qwen2.5-32B
    python scripts/bench_memory.py --lora          # LoRA against full training, 1 process each

Target (issue 15): with 2 processes each one's peak <= 0.6 x the 1-process peak, and the
plan's prediction within +-25% of each measured peak. With --lora (issue 41): LoRA's peak and
tokens/s against full training's on one process, each beside the plan's peak (goal +-20%).

Both runs use glibc with its mmap threshold fixed at 1 MiB (MALLOC_MMAP_THRESHOLD_): left
dynamic, it rises to 32 MiB after the first large free, and freed tensors below that stay in
the heap, fragmented between the gradient and optimiser shards, counted in RSS though no
tensor holds them (about 1 GiB per process here; a device's caching allocator reuses such
blocks instead). Fixed, RSS follows the tensors the plan counts. `--malloc-as-is` measures
without it (0.634 on 2026-12-03, against 0.530 with it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLES, GLOBAL_BATCH = 64, 4  # rows per step: 2 micro-batches on each of 2 processes, 4 on 1


def build_checkpoint(folder: Path, layers: int, tied: bool = True) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from reasoner.config import TemplateConfig
    from reasoner.models import tiny

    if (folder / "config.json").exists():
        return
    torch.manual_seed(0)
    tok = tiny.build_tokenizer(tiny.default_corpus(n=300), 2000, TemplateConfig())
    config = Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=layers,
                         num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                         max_position_embeddings=4096, tie_word_embeddings=tied,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model = Qwen2ForCausalLM(config)
    model.generation_config = tiny.generation_config(tok)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)


def sft_args(model: Path, data: Path, out: Path) -> list[str]:
    return [str(REPO / "configs/quickstart/sft.yaml"), f"model.name_or_path={model}",
            f"data.path={data}", f"output_dir={out}", f"data.limit={EXAMPLES}", "seq_len=256",
            "max_tokens=256", f"run.global_batch={GLOBAL_BATCH}", "run.max_steps=2",
            "run.progress=false",
            "run.save_every=1000", "run.gradient_checkpointing=true", "model.device=cpu",
            "run.keep_last=1"]


class PhaseTrace:
    """RSS sampled every few milliseconds, each sample labelled with the phase of the run it
    fell in (load, forward, backward, optimizer, save...): where the peak happens."""

    def __init__(self) -> None:
        import threading

        self.phase, self.peaks = "start", {}
        self._page = os.sysconf("SC_PAGE_SIZE")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        with open("/proc/self/statm") as f:
            while not self._stop.wait(0.002):
                f.seek(0)
                rss = int(f.read().split()[1]) * self._page / 2**30
                self.peaks[self.phase] = max(self.peaks.get(self.phase, 0.0), rss)

    def wrap(self, owner: object, name: str, label: str) -> None:
        inner = getattr(owner, name)

        def traced(*a, **k):
            outer, self.phase = self.phase, label
            try:
                return inner(*a, **k)
            finally:
                self.phase = outer
        setattr(owner, name, traced)

    def install(self) -> None:
        import torch

        from reasoner import sft, training
        from reasoner.models import logprobs
        from reasoner.training import checkpoints

        self.wrap(training, "load_policy", "load")
        self.wrap(training, "start", "optimizer+state setup")
        self.wrap(sft, "step_loss", "forward")
        self.wrap(logprobs, "token_logprobs", "forward: log-probs")
        self.wrap(torch.autograd, "backward", "backward")
        self.wrap(training, "optimizer_step", "optimizer step")
        self.wrap(checkpoints, "save_checkpoint", "checkpoint save")

    def close(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        return {k: round(v, 3) for k, v in self.peaks.items()}


def worker(args: list[str], report: Path, trace: bool = False) -> None:
    """Inside each process: run sft, then write this rank's peak RSS (and, with --trace, the
    peak within each phase)."""
    from reasoner.cli import app
    from reasoner.device import peak_rss_bytes

    tracer = PhaseTrace() if trace else None
    if tracer:
        tracer.install()
    try:
        rc = app(["sft", *args], standalone_mode=False)
        if rc:
            sys.exit(rc)
    finally:
        rank = int(os.environ.get("RANK", "0"))
        peak = peak_rss_bytes() / 2**30
        row = {"peak_gib": peak, **({"phases": tracer.close()} if tracer else {})}
        (report.parent / f"{report.stem}-rank{rank}.json").write_text(json.dumps(row))


MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(2**20)}  # see the top: RSS = the tensors held


def measure(nproc: int, model: Path, data: Path, out: Path, extra: list[str],
            trace: bool, malloc: dict[str, str] = MALLOC, label: str = "") -> list[dict]:
    """Each process's peak of one `reasoner sft` run on `nproc` processes (`label` names its
    folder, when two runs use as many processes)."""
    label = label or str(nproc)
    report = out / f"rss-{label}"
    shutil.rmtree(out / f"sft-{label}", ignore_errors=True)  # else a rerun finds it finished
    cmd = [sys.executable, __file__, "--worker", str(report), *(["--trace"] if trace else []),
           "--", *sft_args(model, data, out / f"sft-{label}"), *extra]
    if nproc > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
               "--master_port=29631", *cmd[1:]]
    env = {**os.environ, "OMP_NUM_THREADS": "1", **malloc}
    started = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.exit(done.stderr[-3000:])
    print(f"{label} ({nproc} process(es)): {time.perf_counter() - started:.0f}s", file=sys.stderr)
    return [json.loads((out / f"rss-{label}-rank{r}.json").read_text()) for r in range(nproc)]


LORA = {"r": 16, "alpha": 32, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj",
                                                 "gate_proj", "up_proj", "down_proj"]}


def compare_lora(model: Path, data: Path, out: Path, overrides: list[str], trace: bool,
                 malloc: dict[str, str]) -> dict:
    """Full training and LoRA, one process each: peak RSS, tokens/s (the last step's running
    figure, from metrics.jsonl) and the plan's peak for each."""
    from reasoner.models.footprint import host_peak_gib
    from reasoner.models.shapes import count_parameters, shape_of

    lora = "model.lora={" + ", ".join(f"{k}: {v}" for k, v in LORA.items()).replace("'", "") + "}"
    adapters = shape_of(str(model)).lora_params(LORA["r"], LORA["target_modules"])
    result: dict = {"model": str(model), "parameters": count_parameters(model),
                    "adapter_parameters": adapters, "lora_settings": LORA, "overrides": overrides,
                    "malloc": malloc or "glibc defaults (dynamic mmap threshold)"}
    for label, extra, n in (("full", [], 0), ("lora", [lora], adapters)):
        rows = measure(1, model, data, out, [*overrides, *extra], trace, malloc, label)
        metrics = [json.loads(line) for line in
                   (out / f"sft-{label}" / "metrics.jsonl").read_text().splitlines()]
        plan = host_peak_gib(model, 1, seq_len=256, micro_batch=1, gradient_checkpointing=True,
                             adapters=n)
        result[label] = {"peak_gib": rows[0]["peak_gib"], "plan_gib": plan,
                         "plan_error": plan / rows[0]["peak_gib"] - 1,
                         "tokens_per_s": metrics[-1]["tokens_per_s"],
                         **({"phases": rows[0]["phases"]} if trace else {})}
    result["peak_ratio_lora_vs_full"] = result["lora"]["peak_gib"] / result["full"]["peak_gib"]
    result["tokens_per_s_ratio_lora_vs_full"] = (result["lora"]["tokens_per_s"]
                                                 / result["full"]["tokens_per_s"])
    return result


def main() -> None:
    if "--worker" in sys.argv:
        i = sys.argv.index("--worker")
        worker(sys.argv[sys.argv.index("--") + 1:], Path(sys.argv[i + 1]), "--trace" in sys.argv)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=24, help="decoder layers (24 = Qwen2.5-0.5B)")
    parser.add_argument("--untied", action="store_true",
                        help="separate input and output embeddings (Qwen2.5-32B's layout; 630M "
                        "parameters at 24 layers)")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "bench_memory")
    parser.add_argument("--trace", action="store_true",
                        help="also record each process's peak within each phase (load, forward, "
                        "backward, optimizer step, save)")
    parser.add_argument("--malloc-as-is", action="store_true",
                        help="leave glibc's mmap threshold dynamic (RSS then also counts freed "
                        "blocks the heap keeps)")
    parser.add_argument("--lora", action="store_true",
                        help="full training against LoRA (r 16, every linear layer), one "
                        "process each, instead of 1 against 2 processes")
    parser.add_argument("overrides", nargs="*",
                        help="extra `key=value` settings for both sft runs (e.g. model.dtype=bf16)")
    a = parser.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    suffix = "-untied" if a.untied else ""
    model = a.out / f"qwen2-{a.layers}l{suffix}"
    build_checkpoint(model, a.layers, tied=not a.untied)
    data = a.out / f"data-{EXAMPLES}"
    if not data.exists():
        from reasoner.config import SynthConfig
        from reasoner.data import synthetic

        synthetic.run(SynthConfig.model_validate({"output_dir": str(data),
                                                  "num_train": EXAMPLES, "num_test": 4}))
    data = data / "sft"
    malloc = {} if a.malloc_as_is else MALLOC
    if a.lora:
        result = compare_lora(model, data, a.out, a.overrides, a.trace, malloc)
        (a.out / f"report-lora{suffix}.json").write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result, indent=2))
        return
    runs = {n: measure(n, model, data, a.out, a.overrides, a.trace, malloc) for n in (1, 2)}
    one = [r["peak_gib"] for r in runs[1]]
    two = [r["peak_gib"] for r in runs[2]]
    from reasoner.models.footprint import host_peak_gib
    from reasoner.models.shapes import count_parameters

    predicted = {n: host_peak_gib(model, n, seq_len=256, micro_batch=1,
                                       gradient_checkpointing=True) for n in (1, 2)}
    result = {
        "model": str(model), "parameters": count_parameters(model),
        "peak_gib_1_process": one, "peak_gib_2_processes": two,
        "ratio_2_vs_1": max(two) / one[0],
        "micro_batches_per_step": {"1": GLOBAL_BATCH, "2": GLOBAL_BATCH // 2},
        "plan_gib": predicted,
        "plan_error": {"1": predicted[1] / one[0] - 1, "2": predicted[2] / max(two) - 1},
        "overrides": a.overrides,
        "malloc": malloc or "glibc defaults (dynamic mmap threshold)",
    }
    if a.trace:
        result["phases"] = {n: [r["phases"] for r in rows] for n, rows in runs.items()}
    (a.out / f"report{suffix}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
