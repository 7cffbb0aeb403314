"""`reasoner export mindspeed | mindspeed-data`: scripts and data for other training stacks."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from reasoner.cli.common import ConfigArg, OverridesArg, done, load_config, run_stage, summary
from reasoner.config import SFTConfig

export_app = typer.Typer(help="Write scripts for other training stacks.", no_args_is_help=True)


@export_app.command("mindspeed")
def export_mindspeed(
    config: ConfigArg,
    overrides: OverridesArg = None,
    out: Annotated[Path, typer.Option("--out", help="folder for the four scripts")] = Path("mindspeed"),
    tp: Annotated[int, typer.Option("--tp", help="tensor parallel size (32B recipe: 8)")] = 8,
    pp: Annotated[int, typer.Option("--pp", help="pipeline parallel size (32B recipe: 4)")] = 4,
    npus_per_node: Annotated[int, typer.Option("--npus-per-node", help="NPUs per node")] = 8,
    nodes: Annotated[int | None, typer.Option("--nodes", help="default: enough for TP x PP")] = None,
    train_iters: Annotated[int | None, typer.Option(
        "--train-iters", help="optimiser steps (default: run.max_steps, else set at launch)")] = None,
) -> None:
    """MindSpeed-LLM scripts (preprocess, HF->mcore, train, mcore->HF) for an SFT config."""
    import math

    from reasoner.export import mindspeed

    cfg = load_config("export mindspeed", SFTConfig, config, overrides)
    par = mindspeed.Parallel(tp, pp, nodes or max(1, math.ceil(tp * pp / npus_per_node)), npus_per_node)
    written = run_stage("export mindspeed",
                        lambda: mindspeed.export(cfg, str(config), out, par, train_iters))
    summary("export mindspeed", [("parallel", f"TP {par.tp}, PP {par.pp}, {par.nodes} node(s) x "
                                              f"{par.npus_per_node} NPUs"),
                                 *[(p.name, p) for p in written]])
    done("export mindspeed")


@export_app.command("mindspeed-data")
def export_mindspeed_data(
    config: ConfigArg,
    overrides: OverridesArg = None,
    out: Annotated[Path, typer.Option("--out", help="JSONL file to write")] = Path(
        "mindspeed/data/sft.jsonl"),
) -> None:
    """SFT rows as MindSpeed-LLM reads them: role/content messages asked exactly as `reasoner
    infer` asks (system prompt, instruction), rows over the length limit dropped."""
    from reasoner.export import mindspeed

    cfg = load_config("export mindspeed-data", SFTConfig, config, overrides)
    counts = run_stage("export mindspeed-data", lambda: mindspeed.prepare_data(cfg, out))
    summary("export mindspeed-data", [("file", out), *counts.items()])
    done("export mindspeed-data")
