"""Peak host memory per process and tokens/s of `reasoner sft` on long packed rows: 2 processes
sharing every row (run.sequence_parallel=2) against 2 processes each with rows of its own
(data parallel), with what `reasoner plan` predicts beside each.

The checkpoint is Qwen2.5-0.5B's width, heads and vocabulary (hidden 896, 14 query / 2 key-value
heads, vocab 151,936) at `--layers` depth, random weights, fp32; rows of `--seq-len` tokens
packed from synthetic SFT examples, one row per process per step (two steps: the second holds
the optimiser moments and the activations at once) in the data-parallel run, both
rows shared by both processes in the sequence-parallel one (the same tokens per step). Gradient
checkpointing is off: the activations are what sequence parallelism divides, and at 0.5B scale
on a 24 GiB host they dominate only when they are all kept. Each configuration also runs at a
few tokens per row (256): the peak there is everything but the activations, so the peak minus
it is the activation part.

    python scripts/bench_sequence_parallel.py              # writes runs/bench_sp/report.json
    (12,288-token rows: at 16,384 the data-parallel arm needs ~12 GiB per process, and two of
    them do not fit a 24 GiB host)
    python scripts/bench_sequence_parallel.py --seq-len 4096 --layers 2   # a quick look

Targets (issue 38): peak per process with sequence parallelism <= 0.65 x data parallel, its
activation part <= 0.55 x, the plan within +-15% of each peak.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_memory import MALLOC, build_checkpoint, measure  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=12288)  # 16,384 does not fit 24 GiB
    parser.add_argument("--sequence-parallel", type=int, default=2)
    parser.add_argument("--chunk", type=int, default=1024, help="run.logprob_chunk")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "bench_sp")
    a = parser.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    model = a.out / f"qwen2-{a.layers}l"
    build_checkpoint(model, a.layers)
    examples = max(64, 3 * a.seq_len // 100)  # ~150 tokens each: two full rows and more
    data = a.out / f"data-{examples}"
    if not data.exists():
        from reasoner.config import SynthConfig
        from reasoner.data import synthetic

        synthetic.run(SynthConfig.model_validate({"output_dir": str(data),
                                                  "num_train": examples, "num_test": 4}))
    from reasoner.models.footprint import host_peak_gib

    sp = a.sequence_parallel
    rows = {}
    for name, extra in (("data-parallel", []), ("sequence-parallel", [f"run.sequence_parallel={sp}"])):
        for seq_len in (a.seq_len, 256):
            common = [f"seq_len={seq_len}", f"max_tokens={min(seq_len, 256)}",
                      f"data.limit={examples}", "run.global_batch=2", "run.micro_batch=1",
                      "run.max_steps=2", "run.gradient_checkpointing=false",
                      f"run.logprob_chunk={a.chunk}", *extra]
            label = f"{name}-{seq_len}"
            peaks = [r["peak_gib"] for r in measure(2, model, data / "sft", a.out, common, False,
                                                    MALLOC, label)]
            metrics = json.loads((a.out / f"sft-{label}" / "metrics.jsonl").read_text()
                                 .splitlines()[-1])
            plan = host_peak_gib(model, 2, seq_len, 1, False,
                                 sequence_parallel=sp if extra else 1, logprob_chunk=a.chunk)
            rows[label] = {"peak_gib": max(peaks), "plan_gib": plan,
                           "tokens_per_s": metrics["tokens_per_s"]}
    dp, spr = rows[f"data-parallel-{a.seq_len}"], rows[f"sequence-parallel-{a.seq_len}"]
    act = {n: rows[f"{n}-{a.seq_len}"]["peak_gib"] - rows[f"{n}-256"]["peak_gib"]
           for n in ("data-parallel", "sequence-parallel")}
    result = {
        "model": str(model), "layers": a.layers, "seq_len": a.seq_len, "sequence_parallel": sp,
        "runs": rows, "activation_gib": act,
        "peak_ratio": spr["peak_gib"] / dp["peak_gib"],
        "activation_ratio": act["sequence-parallel"] / act["data-parallel"],
        "tokens_per_s_ratio": spr["tokens_per_s"] / dp["tokens_per_s"],
        "plan_error": {n: r["plan_gib"] / r["peak_gib"] - 1 for n, r in rows.items()},
    }
    (a.out / "report.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
