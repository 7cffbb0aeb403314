"""The quickstart on several seeds, one after the other, and the table docs/quickstart.md shows.

    python scripts/quickstart_seeds.py [--seeds 0 1 2] [--root runs] [--check] [recipe overrides...]

Runs `reasoner run configs/quickstart/recipe.yaml seed=S run_dir=ROOT/quickstart-seedS` for each
seed (finished stages are skipped, so a rerun only prints the table) and prints, per seed:
SFT's pass@1, each round's, the paired-bootstrap interval of each round minus SFT, and the
wall time of the seed's stages (the sum of pipeline.json's stage times). With --check it exits 1
when any round's paired interval does not lie above 0: the quickstart's claim, RL beats SFT,
as a benchmark with a bar (CI runs the recipe at a smaller scale, tests/integration/test_quickstart.py).
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def pct(x: float) -> str:
    return f"{100 * x:.1f}"


def row(seed: int, run_dir: Path) -> str:
    runs = json.loads((run_dir / "compare" / "compare.json").read_text())["runs"]
    stages = json.loads((run_dir / "pipeline.json").read_text())["stages"]
    seconds = sum(s.get("seconds", 0.0) for s in stages.values())
    sft, rounds = runs[0], runs[1:]
    cells = [str(seed), f"{pct(sft['pass@1'])} ({pct(sft['pass@1_ci95'][0])}–{pct(sft['pass@1_ci95'][1])})"]
    for r in rounds:
        lo, hi = r["diff_ci95"]
        cells.append(f"{pct(r['pass@1'])}, Δ {100 * r['diff']:+.1f} ({100 * lo:+.1f} to {100 * hi:+.1f})"
                     + (" *" if lo > 0 else ""))
    cells.append(f"{seconds / 60:.1f} min")
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--root", type=Path, default=Path("runs"))
    ap.add_argument("--check", action="store_true",
                    help="exit 1 unless every round of every seed beats SFT (paired interval above 0)")
    args, overrides = ap.parse_known_args()
    lines, misses = [], []
    for seed in args.seeds:
        run_dir = args.root / f"quickstart-seed{seed}"
        subprocess.run(["reasoner", "run", str(REPO / "configs/quickstart/recipe.yaml"),
                        f"seed={seed}", f"run_dir={run_dir}", *overrides], check=True)
        lines.append(row(seed, run_dir))
        runs = json.loads((run_dir / "compare" / "compare.json").read_text())["runs"]
        misses += [f"seed {seed}, round {k}" for k, r in enumerate(runs[1:], 1) if r["diff_ci95"][0] <= 0]
    rounds = lines[0].count("Δ")
    head = ["seed", "SFT pass@1 (95% CI)"] + [f"round {r + 1}: pass@1, Δ vs SFT (paired 95% CI)"
                                              for r in range(rounds)] + ["time"]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    print("\n".join(lines))
    print("\n* the paired interval lies above 0")
    if args.check and misses:
        raise SystemExit(f"RL does not beat SFT (paired interval not above 0): {', '.join(misses)}")


if __name__ == "__main__":
    main()
