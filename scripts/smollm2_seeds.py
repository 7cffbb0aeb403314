"""The CPU real-model recipe (configs/smollm2_cpu) on several seeds, and the table of docs/real-models.md.

    python scripts/smollm2_seeds.py [--seeds 0 1] [--root runs] [--check] [--table-only]

Runs `bash scripts/smollm2_cpu.sh ROOT/smollm2-seedS seed=S` for each seed (finished stages
are skipped, so a rerun only prints the table) and prints, per seed: the starting model's
pass@1 and the trained model's, under flexible extraction (a box-less answer's last number
counts) and strict extraction (a \\boxed{} or answer tags only), each difference with its
paired-bootstrap 95% interval over the 200 held-out problems, and the wall time of the seed's
stages. With --check it exits 1 when a seed's flexible or strict interval does not lie above 0.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def pct(x: float) -> str:
    return f"{100 * x:.1f}"


def interval(diff: float, ci: list[float]) -> str:
    return f"{100 * diff:+.1f} ({100 * ci[0]:+.1f} to {100 * ci[1]:+.1f})" + (" *" if ci[0] > 0
                                                                               else "")


def row(seed: int, run_dir: Path) -> tuple[str, bool]:
    start, rl = json.loads((run_dir / "compare" / "compare.json").read_text())["runs"]
    stages = json.loads((run_dir / "pipeline.json").read_text())["stages"]
    minutes = sum(s.get("seconds", 0.0) for s in stages.values()) / 60
    cells = [str(seed),
             f"{pct(start['pass@1'])} / {pct(start['strict_pass@1'])}",
             f"{pct(rl['pass@1'])} / {pct(rl['strict_pass@1'])}",
             interval(rl["diff"], rl["diff_ci95"]),
             interval(rl["strict_diff"], rl["strict_diff_ci95"]), f"{minutes:.0f} min"]
    above = rl["diff_ci95"][0] > 0 and rl["strict_diff_ci95"][0] > 0
    return "| " + " | ".join(cells) + " |", above


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--root", type=Path, default=Path("runs"))
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--table-only", action="store_true", help="print the table of finished runs")
    a = ap.parse_args()
    rows, ok = [], True
    for seed in a.seeds:
        run_dir = a.root / f"smollm2-seed{seed}"
        if not a.table_only:
            subprocess.run(["bash", str(REPO / "scripts/smollm2_cpu.sh"), str(run_dir),
                            f"seed={seed}"], check=True)
        line, above = row(seed, run_dir)
        rows.append(line)
        ok &= above
    print("| seed | start pass@1 % (flexible / strict) | after RL | Δ flexible (paired 95% CI) "
          "| Δ strict (paired 95% CI) | time |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))
    if a.check and not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
