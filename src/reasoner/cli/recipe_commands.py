"""`reasoner run | plan`: the whole-recipe commands (one stage's commands are in stage_commands.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from reasoner.cli.common import USER_ERRORS, OverridesArg, console, fail, run_stage


def run_recipe(
    recipe: Annotated[Path, typer.Argument(help="recipe YAML (stages, run_dir, rounds)",
                                           show_default=False)],
    overrides: OverridesArg = None,
    start: Annotated[str | None, typer.Option("--from", help="rerun from this stage on")] = None,
    until: Annotated[str | None, typer.Option("--until", help="stop after this stage")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print the plan and commands only")] = False,
    no_plan: Annotated[bool, typer.Option(
        "--no-plan", help="run even if `reasoner plan` says a stage does not fit here")] = False,
) -> None:
    """A whole recipe: every stage in order, skipping those finished with the same config.

    Overrides: recipe keys (run_dir=..., seed=1, rounds=2) or STAGE.key=value for one stage's
    config (sft.optim.lr=1e-4). On a GPU / NPU machine the memory plan runs first.
    """
    from reasoner.pipeline import memory
    from reasoner.pipeline import run as pipeline
    from reasoner.pipeline.recipe import load_recipe

    if not dry_run and not no_plan:
        try:
            bad = memory.check_before_run(recipe, overrides or [])
        except USER_ERRORS as exc:
            fail("run", str(exc))
        if bad:
            fail("run", "\n".join([f"stage {p.name}: needs {p.need_gib:.1f} GiB per device, has "
                                   f"{p.have_gib:.1f}: {p.verdict}" for p in bad]
                                  + [f"see `reasoner plan {recipe}`; --no-plan runs anyway"]))

    def go() -> list:
        cfg = load_recipe(recipe, overrides or [])
        return pipeline.run(cfg, recipe.parent, start, until, dry_run,
                            echo=lambda line: console.print(line, markup=False, highlight=False,
                                                          soft_wrap=True))

    stages = run_stage("run", go)
    if dry_run:
        return
    run_dir = stages[0].out.parent if stages else ""
    table = Table(title=f"reasoner run {recipe}: {run_dir}/", title_justify="left")
    for col in ("stage", "status", "time", "output", "result"):
        table.add_column(col)
    for s in stages:
        table.add_row(s.name, s.status, f"{s.seconds:.0f}s", s.artifact, s.headline)
    console.print(table, width=None if console.is_terminal else 130)  # logs: one row per stage


def plan_recipe(
    recipe: Annotated[Path, typer.Argument(help="recipe YAML", show_default=False)],
    overrides: OverridesArg = None,
    devices: Annotated[int, typer.Option("--devices", help="GPUs / NPUs in all")] = 8,
    mem: Annotated[float, typer.Option("--device-mem-gib", help="memory of one device")] = 80.0,
    kind: Annotated[str, typer.Option("--kind", help="gpu or npu (peak FLOPs for the time)")] = "gpu",
    layout: Annotated[str, typer.Option(
        "--layout", help="fsdp (this trainer) or mindspeed (export mindspeed: TP x PP)")] = "fsdp",
    tp: Annotated[int, typer.Option("--tp", help="mindspeed tensor parallel size")] = 8,
    pp: Annotated[int, typer.Option("--pp", help="mindspeed pipeline parallel size")] = 4,
    mfu: Annotated[float, typer.Option("--mfu", help="assumed model FLOPs utilisation")] = 0.35,
) -> None:
    """Memory per device and time per step of every stage, before running: fits or not."""
    from reasoner.pipeline import memory

    if kind not in ("gpu", "npu") or layout not in ("fsdp", "mindspeed"):
        fail("plan", "--kind is gpu or npu; --layout is fsdp or mindspeed")
    plans = run_stage("plan", lambda: memory.plan_recipe(recipe, devices, mem, kind, mfu,
                                                       overrides, layout, tp, pp))
    table = Table(title=f"reasoner plan {recipe}: {devices} x {mem:g} GiB {kind}, training "
                        f"layout {layout}", title_justify="left")
    for col in ("stage", "per device", "GiB", "need / have GiB", "s / step", "verdict"):
        table.add_column(col)
    for sp in plans:
        table.add_row(f"{sp.name} ({sp.command})\n{sp.model}", "\n".join(sp.parts),
                      "\n".join(f"{v:.1f}" if isinstance(v, float) else str(v)
                                for v in sp.parts.values()),
                      f"{sp.need_gib:.1f} / {sp.have_gib:.1f}",
                      f"{sp.step_s:.0f}" if sp.step_s else "-", sp.verdict)
    wide = console if console.is_terminal else Console(stderr=True, width=140)  # logs: no wrap
    wide.print(table)
    if not all(sp.fits for sp in plans):
        raise typer.Exit(1)
