"""Bytes each process receives per micro-batch for the embedding and lm-head, at 2 and 4
processes (gloo), in both layouts of `run.vocab_layout`, beside what `reasoner plan` predicts
(`models.vocab_layout.vocab_traffic_bytes`).

An untied Qwen2 (vocab 8192, hidden 256, the layout of Qwen2.5-32B) is sharded as the trainers
shard it, bf16 with the mixed-precision policy (fp16 too, in the test); each process scores 512 tokens, forward and
backward. Every torch.distributed collective is wrapped and counted by the bus model the plan
uses (broadcast / reduce: the payload; all-reduce: 2 (W-1)/W of it; all-gather /
reduce-scatter: (W-1)/W of the whole). A collective counts as the vocabulary's when it runs in
`vocab_parallel` or moves the embedding's or lm-head's parameters.

    python scripts/bench_comm.py            # prints the table, writes runs/bench_comm/report.json

Target (issue 31): vocab-parallel traffic grows with the processes and fsdp's does not; the
plan's prediction within +-25% of what was counted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VOCAB, HIDDEN, TOKENS = 8192, 256, 512


def bus_bytes(name: str, tensors: list, world: int) -> float:
    nbytes = lambda t: t.numel() * t.element_size()  # noqa: E731
    first = tensors[0]
    f = (world - 1) / world
    if name in ("all_gather_single", "all_gather_into_tensor"):
        return f * nbytes(first)  # the output
    if name == "all_gather":
        return f * sum(nbytes(t) for t in first) if isinstance(first, list) else 0.0
    if name in ("reduce_scatter_single", "reduce_scatter_tensor"):
        return f * nbytes(tensors[1])  # the input
    if name == "all_reduce":
        return 2 * f * nbytes(first)
    return float(nbytes(first))  # broadcast, reduce


def worker(layout: str, out: str, dtype_name: str = "bfloat16") -> None:
    import torch
    import torch.distributed as dist
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from reasoner import device as dev
    from reasoner.models.fsdp import shard_modules
    from reasoner.models.logprobs import PolicyLogprobs
    from reasoner.models.vocab_layout import VocabSplit

    counted = {"vocab": 0.0, "other": 0.0}
    vocab_numels: set[int] = set()

    def wrap(name, fn):
        def inner(*args, **kwargs):
            tensors = [a for a in (*args, *kwargs.values())
                       if isinstance(a, torch.Tensor | list)]
            world = dist.get_world_size()
            ours = any(f.filename.endswith("vocab_parallel.py")
                       for f in traceback.extract_stack(limit=8))
            sizes = {t.numel() for t in tensors if isinstance(t, torch.Tensor)}
            key = "vocab" if ours or sizes & vocab_numels else "other"
            counted[key] += bus_bytes(name, tensors, world)
            return fn(*args, **kwargs)
        return inner

    for name in ("all_gather_single", "all_gather_into_tensor", "all_gather",
                 "reduce_scatter_single", "reduce_scatter_tensor", "all_reduce", "reduce",
                 "broadcast"):
        setattr(dist, name, wrap(name, getattr(dist, name)))
    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=512,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      tie_word_embeddings=False)
    pol = PolicyLogprobs(Qwen2ForCausalLM(cfg), chunk_size=256)
    padded = -(-VOCAB // world) * world * HIDDEN  # FSDP2 pads dim 0 to a multiple of W
    vocab_numels.update({padded, padded // world})
    dtype = getattr(torch, dtype_name)
    got = shard_modules(pol, pol.model, dtype, VocabSplit(layout, TOKENS))
    assert got == layout, got
    g = torch.Generator().manual_seed(rank)
    ids = torch.randint(0, VOCAB, (1, TOKENS), generator=g)
    steps = 2
    for step in range(steps + 1):
        if step == 1:  # the first pass warms up (FSDP2's lazy init)
            counted.update(vocab=0.0, other=0.0)
        with dev.autocast(torch.device("cpu"), dtype):
            lp = pol(ids, torch.arange(TOKENS)[None], None, ids)
        lp.sum().backward()
        pol.zero_grad(set_to_none=True)
    dist.barrier()
    per_step = {k: v / steps for k, v in counted.items()}
    Path(f"{out}.{rank}").write_text(json.dumps(per_step))
    dist.destroy_process_group()


def measure(world: int, layout: str, folder: Path) -> dict:
    import socket

    out = folder / f"w{world}-{layout}.json"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={world}",
           f"--master_port={port}", __file__, "--worker", layout, str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if done.returncode:
        sys.exit(done.stderr[-3000:])
    rows = [json.loads(Path(f"{out}.{r}").read_text()) for r in range(world)]
    return {k: max(r[k] for r in rows) for k in rows[0]}


def main() -> None:
    from reasoner.models.vocab_layout import vocab_traffic_bytes

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", nargs="+", metavar="LAYOUT OUT [DTYPE]",
                        help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "bench_comm")
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    print(f"{'processes':>9} {'layout':>15} {'vocab MB':>9} {'plan MB':>8} {'plan/meas':>9} "
          f"{'layers MB':>9}")
    for world in (2, 4):
        for layout in ("vocab-parallel", "fsdp"):
            got = measure(world, layout, args.out)
            plan = vocab_traffic_bytes(layout, world, TOKENS, HIDDEN, VOCAB, True, 2, 2)
            rows.append({"processes": world, "layout": layout, "vocab_bytes": got["vocab"],
                         "plan_bytes": plan, "other_bytes": got["other"]})
            print(f"{world:>9} {layout:>15} {got['vocab'] / 1e6:>9.2f} {plan / 1e6:>8.2f} "
                  f"{plan / got['vocab']:>9.2f} {got['other'] / 1e6:>9.2f}")
    growth = {lay: next(r["vocab_bytes"] for r in rows if r["processes"] == 4 and r["layout"] == lay)
              / next(r["vocab_bytes"] for r in rows if r["processes"] == 2 and r["layout"] == lay)
              for lay in ("vocab-parallel", "fsdp")}
    print("growth 2 -> 4 processes: " + ", ".join(f"{k} x{v:.2f}" for k, v in growth.items()))
    (args.out / "report.json").write_text(json.dumps({"rows": rows, "growth": growth}, indent=2))


if __name__ == "__main__":
    main()
