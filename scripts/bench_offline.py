"""Benchmark: train-offline samples/s, packed vs padded, on Verified rollouts with heavy-tailed
response lengths (long-CoT shaped: log-normal, a few very long samples), one run.

    python scripts/bench_offline.py [--steps 8] [--samples 256] [--out runs/bench_offline]

Same tiny model, rollouts, objective (pcl), global batch and machine for both modes. Packed:
samples bin-packed into `--seq-len`-token rows with a block-diagonal mask (sdpa on CPU,
flash-attention varlen on GPU). Padded: one sample per row, rows sorted by length inside each
global batch and padded to the longest of their micro-batch. Prints a markdown table of
samples/s, tokens/s, padding waste and the packed/padded ratio. Ratios matter, not absolute
times: the machines are shared and noisy.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
from pathlib import Path

from reasoner import shards, train_offline
from reasoner.config import OfflineConfig, TinyConfig, TinyModelConfig
from reasoner.data import packing
from reasoner.models import build_tiny, load_tokenizer
from reasoner.records import Verified
from reasoner.training import schedule


def heavy_tailed_rollouts(out: Path, tokenizer, samples: int, seed: int, max_len: int) -> list[int]:
    """A Verified shard of random-token responses, log-normal lengths (median 120 tokens);
    returns each sample's prompt + response tokens."""
    rng = random.Random(seed)
    vocab = [i for i in range(len(tokenizer)) if i not in tokenizer.all_special_ids]
    rows, lengths = [], []
    for i in range(samples):
        gid, k = divmod(i, 8)
        n = int(min(max_len, max(8, rng.lognormvariate(math.log(120), 1.0))))
        ids = [rng.choice(vocab) for _ in range(n)]
        prompt = f"problem {gid}: what is it?"
        reward = 1.0 if (k + gid) % 3 == 0 else -1.0
        rows.append(Verified(
            id=f"p{gid}", sample_idx=k, problem="q", answer="1", prompt=prompt,
            response=tokenizer.decode(ids), prompt_tokens=8, response_tokens=n, finish_reason="stop",
            seed=0, model="tiny", token_ids=ids, extracted="1",
            verdict="correct" if reward > 0 else "incorrect", reward=reward, verifier="rule",
            group_size=8, group_accuracy=0.375, reasoning_tokens=n))
        lengths.append(n + len(tokenizer(prompt, add_special_tokens=False)["input_ids"]))
    shards.write_rows(out, rows)
    shards.finish(out, {"samples": len(rows)})
    return lengths


def run_mode(model: Path, data: Path, out: Path, packed: bool, args) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    cfg = OfflineConfig.model_validate({
        "model": {"name_or_path": str(model)}, "input_dir": str(data), "output_dir": str(out),
        "packing": packed, "seq_len": args.seq_len, "max_tokens": args.seq_len,
        "optim": {"lr": 1e-5, "min_lr": 1e-5},
        "run": {"global_batch": args.global_batch, "micro_batch": 1 if packed else args.padded_rows,
                "max_steps": args.steps, "progress": False, "resume": "never"}})
    train_offline.run(cfg)
    counts = json.loads((out / "manifest.json").read_text())["counts"]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = counts["steps"]
    return {"samples_per_s": steps * args.global_batch / counts["seconds"],
            "tokens_per_s": rows[-1]["tokens_per_s"], "seconds": counts["seconds"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--samples", type=int, default=256)
    p.add_argument("--global-batch", type=int, default=32, help="samples per optimiser step")
    p.add_argument("--seq-len", type=int, default=2048, help="packed row length (and max sample)")
    p.add_argument("--padded-rows", type=int, default=8, help="padded mode: samples per forward")
    p.add_argument("--out", type=Path, default=Path("runs/bench_offline"))
    args = p.parse_args()

    model = build_tiny(TinyConfig(output_dir=args.out / "model", overwrite=True, model=TinyModelConfig(
        hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=384, max_position_embeddings=4096, vocab_size=512)))
    tok = load_tokenizer(str(model))
    data = args.out / "verified"
    shutil.rmtree(data, ignore_errors=True)
    lengths = heavy_tailed_rollouts(data, tok, args.samples, 0, args.seq_len - 64)
    # token slots the two modes fill, over the same global batches the trainer draws
    real = padded_cells = packed_cells = 0
    for step in range(args.steps):
        idx = schedule.global_batch_rows(len(lengths), args.global_batch, 0, step)
        sizes = sorted(lengths[i] for i in idx)
        real += sum(sizes)
        padded_cells += sum(max(sizes[i:i + args.padded_rows]) * len(sizes[i:i + args.padded_rows])
                            for i in range(0, len(sizes), args.padded_rows))
        packed_cells += len(packing.pack(sizes, args.seq_len)) * args.seq_len
    results = {mode: run_mode(model, data, args.out / mode, mode == "packed", args)
               for mode in ("padded", "packed")}
    q = sorted(lengths)
    print(f"\nsample tokens: median {q[len(q) // 2]}, p90 {q[int(0.9 * len(q))]}, max {q[-1]}; "
          f"{args.samples} samples, global batch {args.global_batch}, {args.steps} steps\n")
    print("| mode | samples/s | tokens/s | token slots used |")
    print("|---|---|---|---|")
    print(f"| padded ({args.padded_rows} length-sorted samples per forward) | "
          f"{results['padded']['samples_per_s']:.1f} | {results['padded']['tokens_per_s']:,.0f} | "
          f"{real / padded_cells:.2f} |")
    print(f"| packed ({args.seq_len}-token rows) | {results['packed']['samples_per_s']:.1f} | "
          f"{results['packed']['tokens_per_s']:,.0f} | {real / packed_cells:.2f} |")
    ratio = results["packed"]["samples_per_s"] / results["padded"]["samples_per_s"]
    print(f"\npacked / padded samples/s: {ratio:.2f}x (target on GPU: >= 1.5x)")


if __name__ == "__main__":
    main()
