"""Full-scale rehearsals of the shipped training recipes (issue 52): each training stage's own
step on fake tensors at its real shapes and world size (`reasoner plan --rehearse`), its peak
per process beside the plan's lines, and its wall time here.

    OMP_NUM_THREADS=1 python scripts/bench_rehearsal.py              # every case below
    OMP_NUM_THREADS=1 python scripts/bench_rehearsal.py pcl-h100     # one of them
    python scripts/bench_rehearsal.py --layers 2 --row 8192           # reduced (seconds)

Writes runs/bench_rehearsal/report.json. Target: the plan's total within 10% of the
rehearsal's peak, and each line within 10% where both have it (the plan's 10% margin on top is
what the tracker cannot see). One case at a time: a 32B rehearsal takes 1-2 minutes and ~0.5
GiB of host memory.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# (name, recipe, devices, kind): PCL at its published scale on both device kinds
CASES = {"pcl-h100": ("configs/pcl_reasoner_v1_5/recipe.yaml", 64, "h100"),
         "pcl-910b": ("configs/pcl_reasoner_v1_5/recipe.yaml", 64, "910b"),
         # ... and on one node, where `auto` picks the vocabulary-parallel layout
         "pcl-8xh100": ("configs/pcl_reasoner_v1_5/recipe.yaml", 8, "h100"),
         "pcl-8xh200": ("configs/pcl_reasoner_v1_5/recipe.yaml", 8, "h200"),
         # OREAL-32B (policy and token RM) and ProRL / the discounted objective (a moving
         # reference) at the scales their recipes name
         "oreal-h100": ("configs/oreal/recipe.yaml", 32, "h100"),
         "oreal-910b": ("configs/oreal/recipe.yaml", 32, "910b"),
         "prorl-h100": ("configs/prorl/recipe.yaml", 32, "h100"),
         "discounted-h100": ("configs/discounted/recipe.yaml", 16, "h100"),
         # the one-GPU recipes, each on the card it names
         "gsm8k-0.5b-l4": ("configs/gsm8k_1gpu/recipe.yaml", 1, "l4"),
         "gsm8k-1.5b-h100": ("configs/gsm8k_1gpu/recipe_1p5b.yaml", 1, "h100"),
         "gsm8k-7b-lora-l4": ("configs/gsm8k_1gpu/recipe_7b_lora.yaml", 1, "l4")}


def main() -> int:
    from reasoner.pipeline import plan, rehearsal, rehearsal_report

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="*", help=f"of {', '.join(CASES)} (default: all)")
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default: all)")
    ap.add_argument("--row", type=int, default=None, help="tokens per row (default: seq_len)")
    ap.add_argument("--mfu", type=float, default=0.35)
    ap.add_argument("--out", type=Path, default=REPO / "runs" / "bench_rehearsal")
    args = ap.parse_args()
    unknown = [c for c in args.cases if c not in CASES]
    if unknown:
        ap.error(f"unknown case(s) {', '.join(unknown)}: choose from {', '.join(CASES)}")
    found = []
    for case in args.cases or list(CASES):
        recipe, devices, kind = CASES[case]
        seen = set()
        for est in plan.plan_recipe(REPO / recipe, devices, None, kind):
            same = (est.model, est.config.model_dump_json(exclude={
                "input_dir": True, "output_dir": True, "model": {"name_or_path"},
                "run": {"seed"}})) \
                if est.config else None
            if est.config is None or same in seen:  # a later round's stage, as the first's
                continue
            seen.add(same)
            began = time.perf_counter()
            r = rehearsal.rehearse(est.name, est.config, est.model, devices, kind, args.layers,
                                   args.row)
            print(f"\n[{case}] " + "\n".join(rehearsal_report.report(r, kind, args.mfu)),
                  flush=True)
            rows = rehearsal_report.compare(r, kind)
            off = rehearsal_report.mismatched(rows)
            print(f"  within 10% line by line: {'yes' if not off else 'no: ' + '; '.join(off)}")
            found.append({"case": case, "stage": est.name, "devices": devices, "kind": kind,
                          "layers": r.shape.layers, "row_tokens": r.row_tokens,
                          "sequence_parallel": r.config.run.sequence_parallel,
                          "vocab_layout": r.config.run.vocab_layout, "where": r.where,
                          "plan_gib": {k: p / 2**30 for k, p, _ in rows},
                          "rehearsed_gib": {k: s / 2**30 for k, _, s in rows},
                          "load_gib": r.load / 2**30, "flops": r.flops,
                          "collective_bytes": r.collectives, "mismatched": off,
                          "wall_s": round(time.perf_counter() - began, 1)})
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.json").write_text(json.dumps(found, indent=2) + "\n")
    return 1 if any(f["mismatched"] for f in found) else 0


if __name__ == "__main__":
    sys.exit(main())
