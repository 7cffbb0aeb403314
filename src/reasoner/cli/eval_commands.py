"""`reasoner eval aime | bench | compare`: the evaluation commands of the CLI."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from reasoner.cli.common import (
    OverridesArg,
    done,
    fail,
    logs,
    results,
    run_stage,
    summary,
)
from reasoner.config import EvalConfig
from reasoner.pipeline.registry import STAGES


class Year(str, Enum):
    y2024 = "2024"
    y2025 = "2025"
    all = "all"


eval_app = typer.Typer(help="Evaluate models: AIME, any benchmark file, comparisons.",
                       no_args_is_help=True)

TargetArg = Annotated[str, typer.Argument(help="model (HF id or folder) or an eval config (YAML)",
                                          show_default=False)]


def _eval_config(name: str, target: str, benchmark: str | None, data: list, out: Path | None,
                 overrides: list[str] | None, explicit: bool = True) -> EvalConfig:
    """An EvalConfig from a YAML file, or from the recipe defaults plus a model id/folder.

    `data` replaces the config's sources when `explicit` (given with --data), else fills them
    only when the config names none. They go in before the overrides, so `data.0.split=test`
    or `data.0.fields.answer=gold` applies to the first --data.
    """
    from reasoner.config import load

    overrides = list(overrides or [])
    if target.endswith((".yaml", ".yml")):
        path: Path | None = Path(target)
    else:
        path = None
        model = Path(target.rstrip("/")).name or target
        overrides = [f"model.name_or_path={target}",
                     f"output_dir={out or Path('runs/eval') / benchmark / model}", *overrides]
    if benchmark is not None:  # else the YAML's own benchmark name stands
        overrides.append(f"benchmark={benchmark}")
    config = STAGES["eval"].config
    if data and not explicit:  # the given sources only where the config names none
        explicit = not run_stage(name, lambda: load(config, path, overrides)).data
    sources = ({"data": [d.model_dump(mode="json", exclude_defaults=True) for d in data]}
               if data and explicit else None)
    cfg = run_stage(name, lambda: load(config, path, overrides, sources))
    if out is not None:
        cfg.output_dir = out
    return cfg


def _eval_summary(out: Path) -> None:
    import json

    r = json.loads((out / "report.json").read_text())
    lo, hi = r["pass@1_ci95"]
    rows = [("benchmark", f"{r['benchmark']}: {r['problems']} problems x {r['k']} samples"),
            (f"pass@1 (avg@{r['k']})", f"{100 * r['pass@1']:.1f}%  (95% CI {100 * lo:.1f}-{100 * hi:.1f})")]
    rows += [(f"pass@{k}", f"{100 * v:.1f}%") for k, v in r["pass@k"].items() if k != "1"]
    rows += [(f"maj@{r['k']}", f"{100 * r['maj@k']:.1f}%"),
             ("response tokens", f"mean {r['mean_response_tokens']:.0f}, median "
                                 f"{r['median_response_tokens']:.0f}"),
             ("truncated", f"{100 * r['truncation_rate']:.1f}%"),
             ("report", f"{out / 'report.md'}"),
             ("plots", r["plots"] if isinstance(r["plots"], str) else ", ".join(r["plots"]))]
    summary(f"eval {r['benchmark']}", rows)


@eval_app.command("aime")
def eval_aime(
    target: TargetArg,
    overrides: OverridesArg = None,
    year: Annotated[Year, typer.Option("--year", help="which AIME")] = Year.all,
    data: Annotated[list[Path] | None, typer.Option(
        "--data", help="local AIME file(s) instead of the hub (one per year, in order)")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="output folder")] = None,
) -> None:
    """AIME 2024 / 2025 (30 problems each): avg@k, pass@k, maj@k, lengths, plots."""
    from reasoner.eval.benchmarks import AIME, AIME_NAMES, local

    year = Year(year).value
    years = ["2024", "2025"] if year == "all" else [year]
    if data and len(data) != len(years):
        fail("eval aime", "give one --data file per year")
    for i, y in enumerate(years):
        sources = run_stage(f"eval aime {y}", lambda i=i: [local(data[i])]) if data else AIME[y]
        sub = (out / AIME_NAMES[y]) if out and len(years) > 1 else out
        cfg = _eval_config(f"eval aime {y}", target, AIME_NAMES[y], sources, sub, overrides,
                           explicit=bool(data))
        result = run_stage(f"eval aime {y}", lambda cfg=cfg: STAGES["eval"].run(cfg))
        _eval_summary(result)
        done(f"eval aime {y}")


@eval_app.command("bench")
def eval_bench(
    target: TargetArg,
    overrides: OverridesArg = None,
    data: Annotated[list[Path] | None, typer.Option(
        "--data", help="problem file(s) (.jsonl, .json, .parquet), shard folder(s) or HF "
                       "dataset id(s); subset/split: data.0.subset=main data.0.split=test")] = None,
    field: Annotated[list[str] | None, typer.Option(
        "--field", help="map a field of every --data: OURS=THEIRS, e.g. answer=gold or "
                        "problem=question (repeatable); as data.N.fields in a config")] = None,
    name: Annotated[str | None, typer.Option("--name", help="benchmark name in reports")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="output folder")] = None,
) -> None:
    """Any problem file (GSM8K, AMC, Minerva, the synthetic test split), same metrics."""
    from reasoner.eval.benchmarks import field_mapping, local

    if field and not data:
        fail("eval bench", "--field maps the fields of --data: give --data too (or set "
                           "data.0.fields.OURS=THEIRS for the config's own sources)")
    fields = run_stage("eval bench", lambda: field_mapping(field or []))
    sources = run_stage("eval bench", lambda: [local(d, fields) for d in data or []])
    bench = name
    if bench is None and not target.endswith((".yaml", ".yml")):
        bench = Path(data[0]).stem if data else "bench"
    cfg = _eval_config("eval bench", target, bench, sources, out, overrides)
    result = run_stage("eval bench", lambda: STAGES["eval"].run(cfg))
    _eval_summary(result)
    done("eval bench")


@eval_app.command("compare")
def eval_compare(
    reports: Annotated[list[Path], typer.Argument(help="eval folders or report.json files")],
    folder: Annotated[Path | None, typer.Option("--out", help="write compare.md/json/png here")
                      ] = None,
) -> None:
    """Reports side by side, differences vs the first, paired-bootstrap significance."""
    from reasoner.eval.report import compare

    result = run_stage("eval compare", lambda: compare(reports, folder))
    for warning in result["warnings"]:
        logs().print(f"reasoner eval compare: warning: {warning}: the differences below are "
                     "not the models' alone", markup=False, highlight=False, soft_wrap=True)
    results().print(result["markdown"], markup=False, highlight=False, soft_wrap=True)
    done("eval compare")
