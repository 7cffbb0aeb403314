"""Every offline objective on the same quickstart SFT model and the same verified rollouts.

    python scripts/compare_objectives.py [--run-dir runs/quickstart] [--seed 0] [--out FILE.md]

Runs configs/quickstart/recipe.yaml (pcl) and then recipe_<objective>.yaml for rft, oreal,
dapo, discounted, gspo, cispo and oapl into one run folder: data, SFT, samples and verified
rollouts are made once and skipped afterwards, so every objective trains on identical inputs
(one round each; pcl's second round, the quickstart's own, is shown as its own row). Prints
(and writes) one table: held-out pass@1 with its bootstrap interval, the paired-bootstrap
difference to SFT, mean response length, and train-offline time. How each fares on older
data (1x, 4x, 16x the steps on the same rollouts, with the off-policy diagnostics):
scripts/staleness.py.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPES = {"pcl": ("recipe.yaml", "rl", "eval-rl", "compare"),
           "rft": ("recipe_rft.yaml", "rl-rft", "eval-rft", "compare-rft"),
           "oreal": ("recipe_oreal.yaml", "rl-oreal", "eval-oreal", "compare-oreal"),
           "dapo": ("recipe_dapo.yaml", "rl-dapo", "eval-dapo", "compare-dapo"),
           "discounted": ("recipe_discounted.yaml", "rl-discounted", "eval-discounted",
                          "compare-discounted"),
           "gspo": ("recipe_gspo.yaml", "rl-gspo", "eval-gspo", "compare-gspo"),
           "cispo": ("recipe_cispo.yaml", "rl-cispo", "eval-cispo", "compare-cispo"),
           "oapl": ("recipe_oapl.yaml", "rl-oapl", "eval-oapl", "compare-oapl")}


RECIPES["pcl round 2"] = ("recipe.yaml", "rl-r2", "eval-rl-r2", "compare")


def pct(x: float) -> str:
    return f"{100 * x:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, default=Path("runs/quickstart"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--objectives", nargs="+", default=[n for n in RECIPES if " " not in n],
                        choices=[n for n in RECIPES if " " not in n])
    parser.add_argument("--out", type=Path, help="also write the table here (markdown)")
    args = parser.parse_args()

    for name in args.objectives:
        recipe = REPO / "configs" / "quickstart" / RECIPES[name][0]
        cmd = ["reasoner", "run", str(recipe), f"run_dir={args.run_dir}", f"seed={args.seed}"]
        if name != "pcl":  # one round each, on the rollouts of the SFT model
            cmd.append("rounds=1")
        print("$", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)

    from reasoner.eval.report import compare

    state = json.loads((args.run_dir / "pipeline.json").read_text())["stages"]
    sft = state["eval-sft"]["metrics"]
    lines = ["| objective | pass@1 % (95% CI) | Δ vs SFT, points (paired 95% CI) | mean tokens | train time |",
             "|---|---|---|---|---|",
             f"| SFT (start) | {pct(sft['pass@1'])} ({pct(sft['ci95'][0])}-{pct(sft['ci95'][1])}) | | "
             f"{sft['mean_tokens']:.1f} | |"]
    rows = [n for n in args.objectives]
    if "pcl" in rows and "eval-rl-r2" in state:
        rows.insert(rows.index("pcl") + 1, "pcl round 2")
    for name in rows:
        _, rl, ev, _ = RECIPES[name]
        m = state[ev]["metrics"]
        d = compare([args.run_dir / "eval-sft", args.run_dir / ev])["runs"][-1]
        lo, hi = d["diff_ci95"]
        lines.append(f"| {name} | {pct(m['pass@1'])} ({pct(m['ci95'][0])}-{pct(m['ci95'][1])}) | "
                     f"{100 * d['diff']:+.1f} ({100 * lo:+.1f} to {100 * hi:+.1f})"
                     f"{' *' if d['significant'] else ''} | {m['mean_tokens']:.1f} | "
                     f"{state[rl]['seconds']:.0f} s |")
    table = "\n".join(lines) + "\n\n\\* the paired interval excludes 0\n"
    print(table)
    if args.out:
        args.out.write_text(table)


if __name__ == "__main__":
    sys.exit(main())
