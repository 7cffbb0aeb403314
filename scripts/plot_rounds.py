"""Accuracy, mean response length and (where sampled with log-probs) entropy per round.

Each series is a recipe run folder and the name of its eval stage; round 0 is `eval-sft`,
round r the stage `<eval>` (r = 1) or `<eval>-r<r>`, as `reasoner run` names them (or eval
folders listed one by one, comma-separated, round 0 first). With a
samples stage as well, its infer manifest's `token_entropy` gives the entropy per token of the
model after each round, measured on the samples the next round draws from it (round 0: SFT).

    python scripts/plot_rounds.py --out docs/img/prorl.png --title "ProRL" \
        --run "resets=runs/quickstart:eval-prorl:samples-prorl" \
        --run "no resets=runs/prorl-anchored:eval-prorl:samples-prorl"

Prints a markdown table (pass@1 with its 95% interval, mean tokens, entropy) and writes the plot.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Series:
    label: str
    rounds: list[int] = field(default_factory=list)
    acc: list[float] = field(default_factory=list)
    lo: list[float] = field(default_factory=list)
    hi: list[float] = field(default_factory=list)
    tokens: list[float] = field(default_factory=list)
    entropy: dict[int, float] = field(default_factory=dict)  # round -> its model's entropy


def stage(run: Path, name: str, r: int) -> Path:
    return run / (name if r == 1 else f"{name}-r{r}")


def read(spec: str) -> Series:
    label, rest = spec.split("=", 1)
    s, samples = Series(label), []
    if ":" in rest:
        run_s, eval_name, *samples = rest.split(":")
        run = Path(run_s)
        evals = [run / "eval-sft"]
        r = 1
        while (stage(run, eval_name, r) / "report.json").exists():
            evals.append(stage(run, eval_name, r))
            r += 1
    else:  # eval folders given one by one, round 0 first
        evals = [Path(d) for d in rest.split(",")]
    for k, folder in enumerate(evals):
        report = json.loads((folder / "report.json").read_text())
        lo, hi = report["pass@1_ci95"]
        s.rounds.append(k)
        s.acc.append(100 * report["pass@1"])
        s.lo.append(100 * lo)
        s.hi.append(100 * hi)
        s.tokens.append(report["mean_response_tokens"])
    for r in range(1, len(evals) + 1):
        manifest = stage(run, samples[0], r) / "manifest.json" if samples else None
        if manifest is not None and manifest.exists():
            counts = json.loads(manifest.read_text()).get("counts", {})
            if "token_entropy" in counts:
                s.entropy[r - 1] = counts["token_entropy"]
    return s


def table(series: list[Series]) -> str:
    lines = ["| run | round | pass@1 % (95% CI) | mean tokens | entropy (nats/token) |",
             "|---|---|---|---|---|"]
    for s in series:
        for k in s.rounds:
            ent = f"{s.entropy[k]:.3f}" if k in s.entropy else ""
            lines.append(f"| {s.label} | {'SFT' if k == 0 else k} | {s.acc[k]:.1f} "
                         f"({s.lo[k]:.1f}-{s.hi[k]:.1f}) | {s.tokens[k]:.1f} | {ent} |")
    return "\n".join(lines)


def plot(series: list[Series], title: str, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = 3 if any(s.entropy for s in series) else 2
    fig, axes = plt.subplots(1, panels, figsize=(4.2 * panels, 3.4))
    for s in series:
        err = [[a - lo for a, lo in zip(s.acc, s.lo, strict=True)], [hi - a for a, hi in zip(s.acc, s.hi, strict=True)]]
        axes[0].errorbar(s.rounds, s.acc, yerr=err, marker="o", capsize=3, label=s.label)
        axes[1].plot(s.rounds, s.tokens, marker="o", label=s.label)
        if panels == 3 and s.entropy:
            rounds = sorted(s.entropy)
            axes[2].plot(rounds, [s.entropy[r] for r in rounds], marker="o", label=s.label)
    names = ["pass@1 % (95% CI)", "mean response tokens", "entropy per token of that model"]
    for ax, name in zip(axes, names, strict=False):
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("round (0 = SFT)")
        ax.set_xticks(sorted({r for s in series for r in s.rounds}))
        ax.grid(alpha=0.3)
    for ax in axes[1:]:
        ax.set_ylim(0, ax.get_ylim()[1] * 1.15)
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", action="append", required=True,
                    help="LABEL=RUN_DIR:EVAL_STAGE[:SAMPLES_STAGE] or LABEL=EVAL_DIR,EVAL_DIR,... "
                    "(repeatable)")
    ap.add_argument("--out", type=Path, required=True, help="PNG to write")
    ap.add_argument("--title", default="")
    args = ap.parse_args()
    series = [read(spec) for spec in args.run]
    print(table(series))
    plot(series, args.title, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
