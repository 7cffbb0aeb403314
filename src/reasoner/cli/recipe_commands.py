"""`reasoner run | plan | ls | cp`: the whole-recipe commands (one stage's commands are in
stage_commands.py); `ls` lists the recipes shipped in the package, `cp` copies one out to edit."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from reasoner import shipped
from reasoner.cli.common import USER_ERRORS, OverridesArg, done, fail, logs, results, run_stage

# The device kinds of pipeline.plan.PEAK_TFLOPS (a test holds them equal). Named here, not
# imported: plan imports torch, and a trainer's command must set HCCL's time-out before torch
# loads (hccl.py); typer reads every command's options whichever command runs.
DEVICE_KINDS = ("gpu", "h100", "h200", "a100", "l40s", "a10g", "l4", "rtx4090", "npu", "910b",
                "cpu")
Kind = Enum("Kind", {k: k for k in DEVICE_KINDS if k != "cpu"}, type=str)  # --kind's choices


class Layout(str, Enum):
    fsdp = "fsdp"
    mindspeed = "mindspeed"


class Launcher(str, Enum):
    local = "local"
    slurm = "slurm"


NodeKind = Enum("NodeKind", {k: k for k in DEVICE_KINDS}, type=str)  # --kind of a launch (cpu too)


def run_recipe(
    recipe: Annotated[Path, typer.Argument(
        help="recipe YAML (stages, run_dir, rounds), a folder holding recipe.yaml, or a shipped "
        "recipe's name: quickstart (`reasoner ls`)", show_default=False)],
    overrides: OverridesArg = None,
    start: Annotated[str | None, typer.Option("--from", help="rerun from this stage on")] = None,
    until: Annotated[str | None, typer.Option("--until", help="stop after this stage")] = None,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="print the plan and commands only, after checking every outside input "
        "(hub ids on the hub)")] = False,
    no_plan: Annotated[bool, typer.Option(
        "--no-plan", help="run even if `reasoner plan` says a stage does not fit here")] = False,
    only: Annotated[str | None, typer.Option(
        "--only", help="run this one stage (skipped when finished, resumed when interrupted); "
        "the stages before it must be finished")] = None,
    launch: Annotated[str | None, typer.Option(
        "--launch", help="with --only: the command prefix the stage runs under (what the Slurm "
        "script passes: its srun + torchrun modes)")] = None,
    launcher: Annotated[Launcher, typer.Option(
        "--launcher", help="local: run here; slurm: write a batch script for the recipe into "
        "RUN_DIR and submit it with sbatch (docs/run.md)")] = Launcher.local,
    print_only: Annotated[bool, typer.Option(
        "--print-only", help="--launcher slurm: write and print the script, do not submit")] = False,
    nodes: Annotated[int, typer.Option("--nodes", help="--launcher slurm: nodes to ask for")] = 1,
    per_node: Annotated[int | None, typer.Option(
        "--devices-per-node", help="--launcher slurm: GPUs / NPUs of a node (processes per node "
        "with --kind cpu); default: read from sinfo")] = None,
    kind: Annotated[NodeKind | None, typer.Option(
        "--kind", help="--launcher slurm: device kind of the nodes; default: read from sinfo")
    ] = None,
    mem: Annotated[float | None, typer.Option(
        "--device-mem-gib", help="--launcher slurm: memory of one device; default: the kind's")
    ] = None,
    partition: Annotated[str | None, typer.Option(
        "--partition", help="--launcher slurm: the Slurm partition (sbatch and sinfo)")] = None,
) -> None:
    """A whole recipe: every stage in order, skipping those finished with the same config.

    Overrides: recipe keys (run_dir=..., seed=1, rounds=2) or STAGE.key=value for one stage's
    config (sft.optim.lr=1e-4). On a GPU / NPU machine the memory plan runs first. With
    `--launcher slurm` the recipe runs as one Slurm job on `--nodes` nodes instead.
    """
    import shlex

    from reasoner.pipeline import plan
    from reasoner.pipeline import run as pipeline
    from reasoner.pipeline.recipe import load_recipe

    recipe = run_stage("run", lambda: shipped.find_recipe(recipe))
    if launch is not None and only is None:
        fail("run", "--launch runs one stage under a prefix: give --only STAGE with it")
    if Launcher(launcher) == Launcher.slurm:
        if start is not None or dry_run or launch is not None:
            fail("run", "--launcher slurm takes --until / --only, not --from, --dry-run or "
                 "--launch (its script runs each stage as `reasoner run` decides; to rerun a "
                 "finished stage, change its config or run `reasoner run --from` first)")
        kind_name = NodeKind(kind).value if kind is not None else None
        _launch_slurm(recipe, overrides or [], until, only, print_only,
                      (nodes, per_node, kind_name, mem, partition))
        return
    if not dry_run and not no_plan:
        try:
            bad = plan.check_before_run(recipe, overrides or [])
        except USER_ERRORS as exc:
            fail("run", str(exc))
        if bad:
            fail("run", "\n".join([f"stage {p.name}: needs {p.need_gib:.1f} GiB per device, has "
                                   f"{p.have_gib:.1f}: {p.verdict}" for p in bad]
                                  + [f"see `reasoner plan {recipe}`; --no-plan runs anyway"]))

    def go() -> list:
        cfg = load_recipe(recipe, overrides or [])
        return pipeline.run(cfg, recipe.parent, start, until, dry_run, echo=_echo, only=only,
                            launch=shlex.split(launch) if launch else None, check_hub=dry_run)

    stages = run_stage("run", go)
    if dry_run:
        done("run")
        return
    run_dir = stages[0].out.parent if stages else ""
    table = Table(title=f"reasoner run {recipe}: {run_dir}/", title_justify="left")
    for col in ("stage", "status", "time", "output", "result"):
        table.add_column(col)
    for s in stages:
        table.add_row(s.name, s.status, f"{s.seconds:.0f}s", s.artifact, s.headline)
    results().print(table)
    done("run")


def _echo(line: str) -> None:
    logs().print(line, markup=False, highlight=False, soft_wrap=True)


def _launch_slurm(recipe: Path, overrides: list[str], until: str | None, only: str | None,
                  print_only: bool, asked: tuple) -> None:
    """Check the recipe against the allocation, write its batch script, submit it."""
    import shlex

    from reasoner.pipeline import cluster, slurm
    from reasoner.pipeline import run as pipeline
    from reasoner.pipeline.recipe import load_recipe

    nodes, per_node, kind, mem, partition = asked

    def write() -> tuple[Path, object]:
        cfg = load_recipe(recipe, overrides)
        alloc = cluster.allocation(nodes, per_node, kind, mem, partition)
        spread = cluster.spread(pipeline.resolve(cfg, recipe.parent), alloc) \
            if cfg.cluster.spread else []
        args = [*overrides, *spread]
        cfg = load_recipe(recipe, args)
        _echo(f"[slurm] {alloc.describe()}; what the job will do now:")
        stages = pipeline.run(cfg, recipe.parent, None, until, True, echo=_echo, only=only)
        _echo("[slurm] hub ids are checked for form only here (`reasoner run RECIPE --dry-run` "
              "asks the hub)")
        everything = pipeline.decide(pipeline.resolve(cfg, recipe.parent),
                                     {"stages": {}}, None, only or until)
        cluster.check(recipe, args, cfg, stages, alloc)
        if partition:
            cfg.cluster.sbatch = [f"--partition={partition}", *cfg.cluster.sbatch]
        asked_for = [f"--nodes {nodes}"] + [f"{flag} {v}" for flag, v in (
            ("--devices-per-node", per_node), ("--kind", kind), ("--device-mem-gib", mem),
            ("--partition", partition), ("--until", until), ("--only", only)) if v is not None]
        command = (f"reasoner run {shlex.join([str(recipe), *overrides])} --launcher slurm "
                   + " ".join(asked_for))
        chosen = [s for s in everything if only is None or s.name == only]
        if spread:
            _echo(f"[slurm] generation spread over the {nodes} nodes (cluster.spread): "
                  + " ".join(spread))
        for s in chosen:
            warn = "warning: " if cluster.idles(s, alloc) else ""
            _echo(f"[slurm] {warn}{s.name} ({s.command}): {cluster.where(s, alloc)}")
        return slurm.write_script(cfg, recipe, args, chosen, alloc, command, only or until,
                                  spread), alloc

    path, alloc = run_stage("run", write)
    if print_only:
        results().print(path.read_text(), markup=False, highlight=False, soft_wrap=True)
        _echo(f"[slurm] written: {path}; submit it with: sbatch {path}")
        done("run")
        return
    job = run_stage("run", lambda: slurm.submit(path))
    _echo(f"[slurm] submitted job {job} ({alloc.describe()}): {path}; its log: "
          f"{path.parent}/slurm-{job}.out")
    done("run")


def plan_recipe(
    recipe: Annotated[Path, typer.Argument(
        help="recipe YAML, its folder, or a shipped recipe's name (`reasoner ls`)",
        show_default=False)],
    overrides: OverridesArg = None,
    devices: Annotated[int, typer.Option("--devices", help="GPUs / NPUs in all")] = 8,
    mem: Annotated[float | None, typer.Option(
        "--device-mem-gib", show_default=False,
        help="memory of one device in GiB (default: what a device of --kind reports, e.g. "
             "22.49 for l4; 80 for gpu / npu)")] = None,
    kind: Annotated[Kind, typer.Option(
        "--kind", help="device kind: its peak bf16 TFLOP/s times the step (gpu = h100)")] = "gpu",
    tflops: Annotated[float | None, typer.Option(
        "--tflops", help="peak bf16 TFLOP/s of one device, instead of --kind's")] = None,
    layout: Annotated[Layout, typer.Option(
        "--layout", help="fsdp (this trainer) or mindspeed (export mindspeed: TP x PP)")
    ] = Layout.fsdp,
    tp: Annotated[int, typer.Option("--tp", help="mindspeed tensor parallel size")] = 8,
    pp: Annotated[int, typer.Option("--pp", help="mindspeed pipeline parallel size")] = 4,
    mfu: Annotated[float, typer.Option("--mfu", help="assumed model FLOPs utilisation")] = 0.35,
    rehearse: Annotated[bool, typer.Option(
        "--rehearse", help="also run each training stage's own step on fake tensors at its "
                           "real shapes and world size, and print it beside the plan (minutes "
                           "for a 32B model)")] = False,
) -> None:
    """Memory per device and time per step of every stage, before running: fits or not."""
    from reasoner.pipeline import plan

    recipe = run_stage("plan", lambda: shipped.find_recipe(recipe))
    kind, layout = Kind(kind).value, Layout(layout).value
    mem = plan.device_mem_gib(kind, mem)
    bad = [f"{flag} {value:g} must be {rule}" for flag, value, rule, ok in (
        ("--devices", devices, "at least 1", devices >= 1),
        ("--device-mem-gib", mem, "above 0", mem > 0),
        ("--mfu", mfu, "above 0 and at most 1", 0 < mfu <= 1),
        ("--tflops", tflops or 1.0, "above 0", tflops is None or tflops > 0),
        ("--tp", tp, "at least 1", tp >= 1), ("--pp", pp, "at least 1", pp >= 1)) if not ok]
    if bad:
        fail("plan", "; ".join(bad))
    plans = run_stage("plan", lambda: plan.plan_recipe(recipe, devices, mem, kind, mfu,
                                                       overrides, layout, tp, pp, tflops))
    peak = tflops or plan.PEAK_TFLOPS[kind]
    table = Table(title=f"reasoner plan {recipe}: {devices} x {mem:.4g} GiB {kind} ({peak:g} "
                        f"TFLOP/s, MFU {mfu:g}), training layout {layout}", title_justify="left")
    for col in ("stage", "per device", "GiB", "need / have GiB", "s / step", "verdict"):
        table.add_column(col)
    for sp in plans:
        table.add_row(f"{sp.name} ({sp.command})\n{sp.model}", "\n".join(sp.parts),
                      "\n".join(f"{v:.1f}" if isinstance(v, float) else str(v)
                                for v in sp.parts.values()),
                      f"{sp.need_gib:.1f} / {sp.have_gib:.1f}",
                      f"{sp.step_s:.0f}" if sp.step_s else "-", sp.verdict)
    results().print(table)
    for sp in plans:
        for line in ([sp.vocab] if sp.vocab else []) + sp.notes:
            results().print(f"{sp.name}: {line}", soft_wrap=True, markup=False)  # [flash]
    if rehearse:
        from reasoner.pipeline import rehearsal, rehearsal_report

        for sp in plans:
            if sp.config is None or layout != "fsdp":
                continue
            why = rehearsal.not_rehearsed(sp.config, devices, rehearsal.recipe_layout(
                sp.config, sp.model, devices, kind, mem))
            if why:
                results().print(f"{sp.name}: not rehearsed: {why}", soft_wrap=True, markup=False)
                continue
            found = run_stage("plan", lambda sp=sp: rehearsal.rehearse(
                sp.name, sp.config, sp.model, devices, kind, mem_gib=mem))
            for line in rehearsal_report.report(found, kind, mfu, tflops):
                results().print(line, soft_wrap=True, markup=False)
    done("plan")
    if not all(sp.fits for sp in plans):
        raise typer.Exit(1)


def check_folder(
    folder: Annotated[Path, typer.Argument(help="the run folder every node writes in",
                                           show_default=False)],
) -> None:
    """Under torchrun, one process per node: stop unless every process sees FOLDER as rank 0
    writes it (one shared file system). The Slurm script's first step."""
    def check():
        import torch

        from reasoner import device as dev

        cpu = torch.device("cpu")  # gloo: no device is needed to compare folders
        dist = dev.init_distributed(cpu)
        dev.check_same_folder(folder, dist, cpu)
        return dist

    dist = run_stage("check-folder", check)
    if dist.is_main:
        results().print(f"all {dist.world_size} processes see {folder}", markup=False,
                        highlight=False, soft_wrap=True)


def list_recipes() -> None:
    """The recipes shipped in the package: what each is for and what it needs to run."""
    from rich.markup import escape

    table = Table(title=f"recipes in {shipped.CONFIGS}/ (reasoner run NAME; reasoner cp NAME DIR "
                  "to edit one)", title_justify="left")
    for col in ("recipe", "what it does", "needs"):
        table.add_column(col)
    for name, recipe in shipped.RECIPES.items():
        table.add_row(*map(escape, (name, recipe.purpose, recipe.hardware)))
    results().print(table)
    results().print("judge prompts (judge.prompt_file): configs/judge/prompt.txt, "
                    "configs/judge/pcl_prompt.txt; reasoner cp judge DIR copies them",
                    markup=False, highlight=False)


def copy_recipe(
    name: Annotated[str, typer.Argument(help="a shipped recipe or folder (`reasoner ls`): "
                                             "quickstart, lengths, judge, ...", show_default=False)],
    dest: Annotated[Path, typer.Argument(help="a new (or empty) folder", show_default=False)],
) -> None:
    """Copy a shipped recipe's folder into DEST to edit it; `reasoner run DEST` runs the copy.

    The stage configs it takes from other folders come along (into DEST/<folder>/, its
    references rewritten to them), so the copy runs from its new place."""
    written = run_stage("cp", lambda: shipped.copy(name, dest))
    for path in written:
        results().print(str(path), markup=False, highlight=False)
    recipe = dest / f"{name.partition('/')[2].removesuffix('.yaml') or 'recipe'}.yaml"
    then = f"; run it: reasoner run {recipe}" if recipe.is_file() else ""
    _echo(f"copied {name} into {dest}/ ({len(written)} files){then}")
    done("cp")
