"""Eval reports a person reads: markdown tables, PNG plots, side-by-side comparisons.

Plots need matplotlib (`pip install 'reasoner[plot]'`); without it they are skipped and the
report says so.
"""

from __future__ import annotations

import json
from pathlib import Path

from reasoner.errors import InputError
from reasoner.eval.metrics import paired_bootstrap_diff


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}"


def markdown(r: dict) -> str:
    lo, hi = r["pass@1_ci95"]
    lines = [
        f"# {r['benchmark']}: {r['model']}", "",
        f"{r['problems']} problems, k = {r['k']} samples each.", "",
        "| metric | value |", "|---|---|",
        f"| pass@1 (avg@{r['k']}) | {_pct(r['pass@1'])}% (95% CI {_pct(lo)}-{_pct(hi)}) |",
        *[f"| pass@{k} | {_pct(v)}% |" for k, v in r["pass@k"].items() if k != "1"],
        f"| maj@{r['k']} | {_pct(r['maj@k'])}% |",
        *([f"| pass@1 under strict extraction | {_pct(r['strict']['pass@1'])}% |"]
          if "strict" in r else []),
        f"| mean / median response tokens | {r['mean_response_tokens']:.0f} / "
        f"{r['median_response_tokens']:.0f} |",
        f"| truncation rate | {_pct(r['truncation_rate'])}% |",
        f"| no answer | {_pct(r['no_answer_rate'])}% |", "",
        "## Accuracy by response length", "", "| tokens | samples | accuracy |", "|---|---|---|",
        *[f"| {b['bucket']} | {b['samples']} | "
          f"{_pct(b['accuracy']) + '%' if b['samples'] else '-'} |"
          for b in r["accuracy_by_length"]], "",
        "## Problems", "", "| id | correct | mean tokens | majority answer | reference |",
        "|---|---|---|---|---|",
        *[f"| {p['id']} | {p['correct']}/{p['samples']} | {p['mean_tokens']:.0f} | "
          f"{p['majority_answer']} {'✓' if p['majority_correct'] else '✗'} | {p['reference']} |"
          for p in r["per_problem"]],
    ]
    return "\n".join(lines) + "\n"


def write_markdown(r: dict, path: Path) -> None:
    Path(path).write_text(markdown(r))


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def plots(r: dict, rows: list[dict], out: Path) -> list[str] | str:
    """accuracy_by_length.png, length_hist.png, pass_at_k.png; a note when matplotlib is absent."""
    plt = _pyplot()
    if plt is None:
        return "skipped: matplotlib is not installed (pip install 'reasoner[plot]')"
    made = []
    fig, ax = plt.subplots(figsize=(6, 3.5))
    buckets = [b for b in r["accuracy_by_length"] if b["samples"]]
    ax.bar([b["bucket"] for b in buckets], [100 * b["accuracy"] for b in buckets])
    ax.set(xlabel="response tokens", ylabel="accuracy (%)", title=f"{r['benchmark']}: accuracy by length")
    made.append(_save(fig, out / "accuracy_by_length.png", plt))
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ok = [x["response_tokens"] for x in rows if x["reward"] > 0]
    bad = [x["response_tokens"] for x in rows if x["reward"] <= 0]
    ax.hist([ok, bad], bins=30, label=["correct", "incorrect"], stacked=False)
    ax.set(xlabel="response tokens", ylabel="samples", title="response length")
    ax.legend()
    made.append(_save(fig, out / "length_hist.png", plt))
    made.append(_save(pass_at_k_figure(r, plt), out / "pass_at_k.png", plt))
    return made


def pass_at_k_figure(r: dict, plt):
    """pass@k against k on a log axis labelled at the k's only, titled with the model."""
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ks = [int(k) for k in r["pass@k"]]
    ax.plot(ks, [100 * v for v in r["pass@k"].values()], marker="o")
    ax.set(xscale="log", xlabel="k", ylabel="pass@k (%)",
           title=f"{r['benchmark']}: pass@k of {Path(str(r['model'])).name or r['model']}")
    ax.minorticks_off()  # a log axis puts 3x10^0-style minor labels between the k's
    ax.set_xticks(ks, [str(k) for k in ks])
    return fig


def _save(fig, path: Path, plt) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


def _strict_diff(base: dict, r: dict, common: list[str], resamples: int) -> dict:
    """With reports of `extraction: flexible`: pass@1 and its difference under strict
    extraction too, so that learning the format and learning the arithmetic are told apart."""
    if "strict" not in base or "strict" not in r:
        return {}
    acc = {q["id"]: q["accuracy_strict"] for q in r["per_problem"]}
    base_acc = {q["id"]: q["accuracy_strict"] for q in base["per_problem"]}
    lo, hi = paired_bootstrap_diff([base_acc[i] for i in common], [acc[i] for i in common],
                                   resamples) if r is not base else (0.0, 0.0)
    return {"strict_pass@1": r["strict"]["pass@1"],
            "strict_diff": r["strict"]["pass@1"] - base["strict"]["pass@1"],
            "strict_diff_ci95": [lo, hi]}


REPORT_KEYS = ("benchmark", "pass@1", "pass@1_ci95", "maj@k", "mean_response_tokens",
               "per_problem")


def read_report(path: Path) -> dict:
    """An eval folder's report.json (or the file itself), checked: a wrong path or a file that
    is no eval report is one clear line, not a traceback."""
    file = path / "report.json" if path.is_dir() else path
    if not file.exists():
        hint = (f"{path} has no report.json: is it an eval folder (`reasoner eval` writes one)?"
                if path.is_dir() else f"{path}: no such eval folder or report.json")
        raise InputError(hint)
    try:
        report = json.loads(file.read_text())
    except json.JSONDecodeError as exc:
        raise InputError(f"{file} is not valid JSON ({exc})") from None
    lacking = [k for k in REPORT_KEYS if not isinstance(report, dict) or k not in report]
    if lacking:
        raise InputError(f"{file} is not an eval report: it lacks {', '.join(lacking)}")
    return report


COMPARED = {  # what must agree for two reports to measure the same thing, and how it is named
    "benchmark": lambda r: r.get("benchmark"),
    "k (samples per problem)": lambda r: r.get("k"),
    "template": lambda r: {k: v for k, v in ((r.get("config") or {}).get("template") or {}).items()
                           if k in ("system_prompt", "instruction", "use_chat_template", "preset")},
    "sampling.max_tokens": lambda r: ((r.get("config") or {}).get("sampling") or {}).get(
        "max_tokens"),
    "backend": lambda r: (r.get("config") or {}).get("backend"),
}


def comparability(reports: list[dict], names: list[str]) -> list[str]:
    """What differs between the reports beyond the model (each a phrase): a difference in pass@1
    between them then says nothing about the models alone."""
    found = []
    for what, read in COMPARED.items():
        values = [read(r) for r in reports]
        if any(v != values[0] for v in values[1:]):
            shown = ", ".join(f"{Path(n).name or n}: {v!r}" for n, v in zip(names, values,
                                                                             strict=True))
            found.append(f"{what} differs ({shown})")
    return found


def compare(paths: list[Path], out: Path | None = None, resamples: int = 1000) -> dict:
    """Reports side by side: pass@1 differences vs the first, with a paired bootstrap interval."""
    reports = [read_report(Path(p)) for p in paths]
    base = reports[0]
    base_acc = {p["id"]: p["accuracy"] for p in base["per_problem"]}
    rows = []
    for p, r in zip(paths, reports, strict=True):
        acc = {q["id"]: q["accuracy"] for q in r["per_problem"]}
        common = sorted(set(acc) & set(base_acc))
        diff = r["pass@1"] - base["pass@1"]
        lo, hi = paired_bootstrap_diff([base_acc[i] for i in common], [acc[i] for i in common],
                                       resamples) if r is not base else (0.0, 0.0)
        rows.append({"name": str(p), "benchmark": r["benchmark"], "pass@1": r["pass@1"],
                     "pass@1_ci95": r["pass@1_ci95"], "maj@k": r["maj@k"],
                     "mean_response_tokens": r["mean_response_tokens"], "diff": diff,
                     "diff_ci95": [lo, hi], "significant": r is not base and (lo > 0 or hi < 0),
                     "common_problems": len(common),
                     **_strict_diff(base, r, common, resamples)})
    md = ["| run | pass@1 | 95% CI | maj@k | mean tokens | Δ pass@1 vs first | Δ 95% CI | outside CI |",
          "|---|---|---|---|---|---|---|---|"]
    for k, x in enumerate(rows):
        diff = ("baseline | |" if k == 0 else
                f"{100 * x['diff']:+.1f} | {100 * x['diff_ci95'][0]:+.1f} to "
                f"{100 * x['diff_ci95'][1]:+.1f} | {'yes' if x['significant'] else 'no'}")
        md.append(f"| {x['name']} | {_pct(x['pass@1'])} | {_pct(x['pass@1_ci95'][0])}-"
                  f"{_pct(x['pass@1_ci95'][1])} | {_pct(x['maj@k'])} | {x['mean_response_tokens']:.0f}"
                  f" | {diff} |")
    if all("strict_diff" in x for x in rows):
        md += ["", "Under strict extraction (the same samples; an answer found only as the last "
               "number counts as none):", "",
               "| run | pass@1 strict | Δ vs first | Δ 95% CI |", "|---|---|---|---|"]
        md += [f"| {x['name']} | {_pct(x['strict_pass@1'])} | " + (
            "baseline | |" if k == 0 else
            f"{100 * x['strict_diff']:+.1f} | {100 * x['strict_diff_ci95'][0]:+.1f} to "
            f"{100 * x['strict_diff_ci95'][1]:+.1f} |") for k, x in enumerate(rows)]
    warnings = comparability(reports, [str(p) for p in paths])
    if warnings:
        md += ["", "**Not like for like:** " + "; ".join(warnings) + "."]
    result = {"runs": rows, "warnings": warnings, "markdown": "\n".join(md) + "\n"}
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "compare.json").write_text(json.dumps(result, indent=2) + "\n")
        (out / "compare.md").write_text(result["markdown"])
        plt = _pyplot()
        if plt is not None:
            fig, (ax, lx) = plt.subplots(1, 2, figsize=(10, 3.5))
            names = [Path(x["name"]).name or x["name"] for x in rows]
            vals = [100 * x["pass@1"] for x in rows]
            err = [[100 * (x["pass@1"] - x["pass@1_ci95"][0]) for x in rows],
                   [100 * (x["pass@1_ci95"][1] - x["pass@1"]) for x in rows]]
            ax.bar(names, vals, yerr=err, capsize=4)
            ax.set(ylabel="pass@1 (%)", title="accuracy (95% bootstrap CI)")
            lx.bar(names, [x["mean_response_tokens"] for x in rows], color="tab:orange")
            lx.set(ylabel="mean response tokens", title="response length")
            for a in (ax, lx):
                a.tick_params(axis="x", labelrotation=20)
            result["plot"] = _save(fig, out / "compare.png", plt)
    return result
