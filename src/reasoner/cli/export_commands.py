"""`reasoner export mindspeed | mindspeed-data`: scripts and data for other training stacks.

An SFT config targets MindSpeed-LLM 2.2.0 (`export/mindspeed.py`); a train-offline config (one
with `input_dir`, the Verified shard) targets PCL's MindSpeed-LLM fork (`export/mindspeed_opg.py`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from reasoner.cli.common import ConfigArg, OverridesArg, done, load_config, run_stage, summary
from reasoner.config import OfflineConfig, SFTConfig

export_app = typer.Typer(help="Write scripts for other training stacks.", no_args_is_help=True)


def _load(name: str, config: Path, overrides: list[str] | None) -> tuple[Any, Any]:
    """The config (SFT, or train-offline when it names an `input_dir`) and its export module."""
    import yaml

    from reasoner.export import mindspeed, mindspeed_opg

    try:
        keys = yaml.safe_load(Path(config).read_text()) or {}
    except (OSError, yaml.YAMLError):
        keys = {}  # load_config says what is wrong with the file
    offline = isinstance(keys, dict) and "input_dir" in keys
    if offline:
        return load_config(name, OfflineConfig, config, overrides), mindspeed_opg
    return load_config(name, SFTConfig, config, overrides), mindspeed


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
        "--train-iters", help="optimiser steps (default: run.max_steps, else SFT: set at launch; "
                              "train-offline: from the exported rows and run.epochs)")] = None,
    shape: Annotated[str | None, typer.Option(
        "--shape", help="read the model's shape here (a local HF folder or a published id such "
                        "as Qwen/Qwen2.5-32B) when model.name_or_path is not written yet")] = None,
) -> None:
    """MindSpeed-LLM scripts (preprocess, HF->mcore, train, mcore->HF): an SFT config for
    MindSpeed-LLM 2.2.0, a train-offline config for PCL's fork (`--stage opg`)."""
    import math

    from reasoner.export import mindspeed

    cfg, target = _load("export mindspeed", config, overrides)
    par = mindspeed.Parallel(tp, pp, nodes or max(1, math.ceil(tp * pp / npus_per_node)), npus_per_node)
    written = run_stage("export mindspeed",
                        lambda: mindspeed.export(target.scripts, cfg, str(config), out, par,
                                                     train_iters, shape))
    release = getattr(target, "FORK", mindspeed.RELEASE)
    summary("export mindspeed", [("target", release),
                                 ("parallel", f"TP {par.tp}, PP {par.pp}, {par.nodes} node(s) x "
                                              f"{par.npus_per_node} NPUs"),
                                 *[(p.name, p) for p in written]])
    done("export mindspeed")


@export_app.command("mindspeed-data")
def export_mindspeed_data(
    config: ConfigArg,
    overrides: OverridesArg = None,
    out: Annotated[Path | None, typer.Option(
        "--out", help="JSONL file to write (default mindspeed/data/sft.jsonl, or opg.jsonl "
                      "for a train-offline config)")] = None,
) -> None:
    """The rows MindSpeed-LLM reads, asked exactly as `reasoner infer` asks: SFT rows as
    role/content messages, or (train-offline config) the Verified shard as prompt / response /
    reward rows for PCL's fork; rows over the length limit dropped."""
    cfg, target = _load("export mindspeed-data", config, overrides)
    out = out or Path("mindspeed/data") / ("opg.jsonl" if isinstance(cfg, OfflineConfig)
                                           else "sft.jsonl")
    counts = run_stage("export mindspeed-data", lambda: target.prepare_data(cfg, out))
    summary("export mindspeed-data", [("file", out), *counts.items()])
    done("export mindspeed-data")
