"""How each objective copes with aged data: trained for 1x, 4x and 16x the quickstart's steps on
the same round-1 rollout set, evaluated against SFT and against itself at 1x, with its
off-policy diagnostics plotted step by step (issue 53).

    python scripts/staleness.py [--run-dir runs/quickstart] [--epochs 1,4,16] [--seed 0]
        [--objectives pcl rft oreal dapo dapo-tis dapo-icepop m2po discounted gspo cispo oapl] [--out-dir DIR]
    python scripts/staleness.py --report RUN_DIR [RUN_DIR ...] [--out-dir DIR]

What it runs: the quickstart recipe up to its round-1 Verified shard (`reasoner run ...
--until verified`: data, SFT, its eval, samples, verify; finished stages are skipped), then for
each objective ONE train-offline run of max(epochs) x N steps (N: the quickstart rl stage's
steps, 250 at its 8,000 samples) from the SFT model on that shard, with a checkpoint every N
steps, and an eval of the checkpoints at each multiple. One run evaluated at its checkpoints
equals separate 1x, 4x and 16x runs only under a constant learning rate (the batch order
depends on seed, epoch and step alone, never on the run's length): the runs here keep the
quickstart's peak lr, 3e-5, throughout (min_lr = lr, no warm-up), so "1x" is not the quickstart's
own rl stage, whose lr decays to 3e-6. Each objective's settings are its quickstart recipe's;
pcl and rft compare with the starting model's log-probs (objective.diagnostics=starting, one
scoring pass), the others with their own pi_old (recomputed: the samples were drawn at T 0.6).

Writes OUT/staleness.md (pass@1 with its interval, paired differences vs SFT and vs the
objective at 1x, the last logged diagnostics) and OUT/staleness.png (KL, chi-square, the share
of tokens with rho outside [1/2, 2] and the spread of the samples' geometric-mean ratio, each a
trailing mean over 25 steps, against the lag in multiples of N). The full run's CPU time:
docs/train-offline.md ("Aged data").

An arm takes most of an hour on a laptop CPU, so arms are run one invocation at a time, over
days, and on more than one seed (one run folder per seed). `--report` runs nothing: it gathers
every finished arm (its training run complete and each of its evals written) of the run folders
given, one seed each, into one table (a seed column) and one plot, and names the arms it skipped.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "configs" / "quickstart"
OBJECTIVES = ["pcl", "rft", "oreal", "dapo", "dapo-tis", "dapo-icepop", "m2po", "discounted",
              "gspo", "cispo", "oapl"]
# arms that are an objective with a correction: name -> (objective, what its section changes);
# m2po is M2PO's objective: dapo's clips opened (above e^20, the largest ratio once the
# log-ratio is clamped to [-20, 20]) and its mask
OPEN = {"eps_low": 1.0, "eps_high": 1e9, "clip_ratio_c": 1e9}
CORRECTED = {"dapo-tis": ("dapo", {"correction": {"name": "token-tis", "cap": 2.0}}),
             "dapo-icepop": ("dapo", {"correction": {"name": "icepop", "low": 0.5, "high": 5.0}}),
             "m2po": ("dapo", {**OPEN, "correction": {"name": "m2-mask", "tau": 0.04}})}
PLOTTED = ["offpolicy_kl_k3", "offpolicy_chi2", "offpolicy_ratio_outside",
           "offpolicy_seq_ratio_std"]
NO_RATIO = {"pcl", "rft", "oreal"}  # their diagnostics compare with the starting model's


def reasoner(*args: str) -> None:
    cmd = [sys.executable, "-m", "reasoner", *args]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def objective_of(name: str) -> dict:
    """The objective section the quickstart trains `name` with: recipe_<name>.yaml's rl stage,
    or train_offline.yaml's own (pcl, the quickstart's); an arm of CORRECTED: its objective's
    section with the correction (and, for m2po, its clips opened)."""
    if name in CORRECTED:
        base, changes = CORRECTED[name]
        return {**objective_of(base), **changes}
    if name == "pcl":
        return yaml.safe_load((QUICKSTART / "train_offline.yaml").read_text())["objective"]
    recipe = yaml.safe_load((QUICKSTART / f"recipe_{name}.yaml").read_text())
    rl = next(s for s in recipe["stages"] if s["command"] == "train-offline")
    return rl["set"]["objective"]


def default_steps(verified: Path) -> int:
    """The quickstart rl stage's optimiser steps on this shard: epochs x ceil(samples / batch)
    (none is longer than its max_tokens)."""
    from reasoner import shards

    run = yaml.safe_load((QUICKSTART / "train_offline.yaml").read_text())["run"]
    samples = sum(1 for _ in shards.iter_rows(verified))
    return math.ceil(run["epochs"] * math.ceil(samples / run["global_batch"]))


def train(name: str, run_dir: Path, out: Path, steps: int, longest: int, seed: int) -> Path:
    obj = objective_of(name)
    if name in NO_RATIO:
        obj = {**obj, "diagnostics": "starting"}
    lr = yaml.safe_load((QUICKSTART / "train_offline.yaml").read_text())["optim"]["lr"]
    folder = out / f"rl-{name}"
    reasoner("train-offline", str(QUICKSTART / "train_offline.yaml"),
             f"model.name_or_path={run_dir / 'sft' / 'final'}", f"input_dir={run_dir / 'verified'}",
             f"output_dir={folder}", f"objective={json.dumps(obj)}", f"optim.min_lr={lr}",
             "optim.warmup_ratio=0.0", f"run.epochs={longest * steps}",  # enough; max_steps ends it
             f"run.max_steps={longest * steps}",
             f"run.save_every={steps}", f"run.keep_last={longest}", f"run.seed={seed}",
             "run.progress=false")
    return folder


def evaluate(model: Path, run_dir: Path, out: Path, problems: int | None, n: int | None) -> Path:
    data = {"path": str(run_dir / "data" / "test_problems"),
            **({"limit": problems} if problems else {})}
    reasoner("eval", "bench", str(QUICKSTART / "eval.yaml"), f"model.name_or_path={model}",
             f"data={json.dumps([data])}", f"output_dir={out}", "progress=false",
             *([f"sampling.n={n}"] if n else []))
    return out


def row(label: str, base: Path, other: Path) -> dict:
    from reasoner.eval.report import compare

    x = compare([base, other])["runs"][-1]
    return {"label": label, "pass": x["pass@1"], "ci": x["pass@1_ci95"], "diff": x["diff"],
            "diff_ci": x["diff_ci95"], "significant": x["significant"],
            "tokens": x["mean_response_tokens"]}


def pct(x: float) -> str:
    return f"{100 * x:.1f}"


def diff(d: dict) -> str:
    lo, hi = d["diff_ci"]
    star = " *" if d["significant"] else ""
    return f"{100 * d['diff']:+.1f} ({100 * lo:+.1f} to {100 * hi:+.1f}){star}"


def metrics(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def table(results: dict, evals: dict, sft: Path, mults: list[int], steps: int,
          seed: int | None = None) -> list[str]:
    """The table's rows of one run folder (`seed`: its seed, a column when given)."""
    lines = []
    for name, folder in results.items():
        logged = {int(r["step"]): r for r in metrics(folder)}
        for m in mults:
            ev = evals[name, m]
            vs_sft, vs_1 = row(name, sft, ev), row(name, evals[name, mults[0]], ev)
            r = logged.get(m * steps) or logged[max(logged)]
            diag = " | ".join(f"{r[k]:.4g}" if k in r else "" for k in PLOTTED)
            itself = "" if m == mults[0] else diff(vs_1)
            lines.append(f"| {name} | {'' if seed is None else f'{seed} | '}{m}x ({m * steps}) | "
                         f"{pct(vs_sft['pass'])} ({pct(vs_sft['ci'][0])}-{pct(vs_sft['ci'][1])}) | "
                         f"{diff(vs_sft)} | {itself} | {vs_sft['tokens']:.1f} | {diag} |")
    return lines


def header(steps: str, seeds: bool) -> list[str]:
    return [f"N = {steps} steps (the quickstart rl stage's); constant lr; Δ: paired bootstrap, "
            "points (95% CI); * the interval excludes 0", "",
            f"| objective | {'seed | ' if seeds else ''}steps | pass@1 % (95% CI) | Δ vs SFT | "
            "Δ vs itself at 1x | mean tokens | KL k3 | χ² | ρ outside [½, 2] | geo-ratio std |",
            "|---" * (11 if seeds else 10) + "|"]


def finished(out: Path, mults: list[int]) -> tuple[dict, dict, list[str]]:
    """The arms of `out` whose run finished and whose evals at every multiple are written
    (results, evals), and the names of those found unfinished."""
    results, evals, skipped = {}, {}, []
    for folder in sorted(out.glob("rl-*")):
        name = folder.name.removeprefix("rl-")
        reports = {m: out / f"eval-{name}-{m}x" for m in mults}
        if (folder / "final").is_dir() and all((r / "report.json").exists()
                                                 for r in reports.values()):
            results[name] = folder
            evals.update({(name, m): r for m, r in reports.items()})
        else:
            skipped.append(name)
    return results, evals, skipped


def report(run_dirs: list[Path], mults: list[int], out: Path) -> str:
    """One table and one plot of the finished arms of `run_dirs` (one seed each)."""
    rows, steps, plotted, said = [], [], {}, []
    for run_dir in run_dirs:
        seed = json.loads((run_dir / "pipeline.json").read_text())["recipe"]["seed"]
        results, evals, skipped = finished(run_dir / "staleness", mults)
        said += [f"seed {seed}: {name} unfinished, left out" for name in skipped]
        if not results:
            continue
        n = default_steps(run_dir / "verified")
        steps.append(str(n))
        rows += table(results, evals, run_dir / "eval-sft", mults, n, seed)
        plotted.update({(name, seed): (f, n) for name, f in results.items()})
    if not rows:
        raise SystemExit("no finished arm in " + ", ".join(map(str, run_dirs)))
    out.mkdir(parents=True, exist_ok=True)
    text = "\n".join(header(" / ".join(dict.fromkeys(steps)), True) + rows) + "\n"
    (out / "staleness.md").write_text(text)
    plot(plotted, mults, out / "staleness.png")
    return text + "".join(f"\n{line}" for line in said)


def smoothed(values: list[float], window: int) -> list[float]:
    """The trailing mean of the last `window` values at each point (the first ones over fewer):
    a step's diagnostics are one global batch's, noisy from step to step."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v - (values[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out


def plot(arms: dict, mults: list[int], path: Path, window: int = 25):
    """The diagnostics of each arm against its lag in multiples of its N, so that seeds with
    different N line up at 1x, 4x, 16x; arms: (objective, seed) -> (run folder, N). One colour
    per objective, one line style per seed, each a trailing mean over `window` steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys([*OBJECTIVES, *CORRECTED]))
    # tab20 is ten hues, each dark then light: the darks first, so the first ten differ in hue
    palette = plt.get_cmap("tab20")
    colour = {n: palette((2 * i) % 20 + (2 * i) // 20 % 2) for i, n in enumerate(names)}
    styles = ["-", "--", ":", "-."]
    seeds = sorted({seed for _, seed in arms})
    fig, axes = plt.subplots(1, len(PLOTTED), figsize=(4.2 * len(PLOTTED), 3.8))
    for (name, seed), (folder, steps) in sorted(arms.items()):
        rows = [r for r in metrics(folder) if "offpolicy_kl_k3" in r]
        lag = [r["lag_steps"] / steps for r in rows]
        for ax, key in zip(axes, PLOTTED, strict=True):
            ax.plot(lag, smoothed([r[key] for r in rows], window), color=colour[name],
                    ls=styles[seeds.index(seed) % len(styles)], lw=1.2,
                    label=f"{name} (seed {seed})")
    for ax, key in zip(axes, PLOTTED, strict=True):
        ax.set_title(key.removeprefix("offpolicy_"))
        ax.set_xlabel("lag (multiples of N optimiser steps)")
        for m in mults:
            ax.axvline(m, color="grey", lw=0.5, ls=":")
    axes[0].set_yscale("log")
    axes[1].set_yscale("symlog", linthresh=1e-2)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center right", fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0, 0.9, 1))
    fig.savefig(path, dpi=120)
    return fig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, default=Path("runs/quickstart"))
    parser.add_argument("--out-dir", type=Path, help="default: RUN_DIR/staleness")
    parser.add_argument("--report", type=Path, nargs="+", metavar="RUN_DIR",
                        help="run nothing: one table of the finished arms of these run folders")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", default="1,4,16", help="multiples of N to evaluate")
    parser.add_argument("--objectives", nargs="+", default=OBJECTIVES,
                        choices=list(dict.fromkeys([*OBJECTIVES, *CORRECTED])))
    parser.add_argument("--steps", type=int, help="N; default: the quickstart rl stage's")
    parser.add_argument("--eval-problems", type=int, help="fewer held-out problems (smoke runs)")
    parser.add_argument("--eval-samples", type=int, help="samples per problem (default 8)")
    parser.add_argument("recipe_overrides", nargs="*", help="passed to `reasoner run` (e.g. "
                        "sft.run.max_steps=100 for a smoke run)")
    args = parser.parse_args()
    mults = sorted({int(m) for m in args.epochs.split(",")})
    if args.report:
        print(report(args.report, mults, args.out_dir or args.report[0] / "staleness"))
        return
    out = args.out_dir or args.run_dir / "staleness"
    reasoner("run", str(QUICKSTART / "recipe.yaml"), f"run_dir={args.run_dir}",
             f"seed={args.seed}", "rounds=1", *args.recipe_overrides, "--until", "verified")
    steps = args.steps or default_steps(args.run_dir / "verified")
    results, evals = {}, {}
    for name in args.objectives:
        results[name] = train(name, args.run_dir, out, steps, mults[-1], args.seed)
        for m in mults:
            model = results[name] / f"checkpoint-{m * steps}"
            evals[name, m] = evaluate(model, args.run_dir, out / f"eval-{name}-{m}x",
                                      args.eval_problems, args.eval_samples)
    sft = args.run_dir / "eval-sft"
    if args.eval_problems or args.eval_samples:  # SFT on the same problems and samples
        sft = evaluate(args.run_dir / "sft" / "final", args.run_dir, out / "eval-sft",
                       args.eval_problems, args.eval_samples)
    text = "\n".join(header(str(steps), False) + table(results, evals, sft, mults, steps)) + "\n"
    (out / "staleness.md").write_text(text)
    plot({(name, args.seed): (f, steps) for name, f in results.items()}, mults,
         out / "staleness.png")
    print(text)
    print(f"wrote {out / 'staleness.md'} and {out / 'staleness.png'}")


if __name__ == "__main__":
    sys.exit(main())
