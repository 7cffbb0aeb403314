"""The `reasoner` command line: each command loads its config + overrides and calls stage.run(cfg)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from reasoner import __version__
from reasoner.config import (
    ConfigError,
    InferConfig,
    SFTConfig,
    SynthConfig,
    TinyConfig,
    VerifyConfig,
    load,
)

console = Console(stderr=True)

app = typer.Typer(
    name="reasoner",
    help="Train LLMs to reason about math with offline RL: "
    "sft -> infer -> verify -> train-offline -> eval.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
data_app = typer.Typer(help="Make and inspect datasets.", no_args_is_help=True)
model_app = typer.Typer(help="Build models.", no_args_is_help=True)
app.add_typer(data_app, name="data")
app.add_typer(model_app, name="model")

ConfigArg = Annotated[Path, typer.Argument(help="stage config (YAML)", show_default=False)]
OverridesArg = Annotated[
    list[str] | None,
    typer.Argument(help="overrides key.sub=value (values parsed as YAML)", show_default=False),
]

# Which config model each command reads (tests load every shipped YAML through this).
CONFIG_MODELS: dict[str, type] = {"data synth": SynthConfig, "model tiny": TinyConfig,
                                  "sft": SFTConfig, "infer": InferConfig, "verify": VerifyConfig}

# Errors a user can fix from the message alone: printed without a traceback.
USER_ERRORS: tuple[type[Exception], ...] = (ConfigError, ValueError, FileNotFoundError,
                                            FileExistsError, ImportError, RuntimeError)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"reasoner {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="print the version and exit")] = False,
) -> None:
    """reasoner: offline-RL pipeline for math reasoning LLMs."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own progress bars and summaries speak instead


def run_stage(name: str, fn: Callable[[], Any]) -> Any:
    """Run one stage, turning user-fixable errors into a one-paragraph message and exit code 2."""
    started = time.perf_counter()
    try:
        result = fn()
    except USER_ERRORS as exc:
        console.print(f"[bold red]reasoner {name}: error[/]")
        console.print(str(exc), markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        console.print(f"[yellow]reasoner {name}: interrupted; rerun the same command to resume[/]")
        raise typer.Exit(130) from None
    console.print(f"[green]reasoner {name}: done in {time.perf_counter() - started:.1f}s[/]")
    return result


def load_config(name: str, model_cls: type, config: Path, overrides: list[str] | None) -> Any:
    """Load and validate a stage config; a bad one ends the command with exit code 2."""
    try:
        return load(model_cls, config, overrides)
    except ConfigError as exc:
        console.print(f"[bold red]reasoner {name}: error[/]")
        console.print(str(exc), markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None


def summary(title: str, rows: list[tuple[str, Any]]) -> None:
    table = Table(title=title, show_header=False, title_justify="left")
    for key, value in rows:
        table.add_row(key, str(value))
    console.print(table)


@data_app.command("synth")
def data_synth(config: ConfigArg, overrides: OverridesArg = None) -> None:
    """Write synthetic arithmetic word problems (train/test) and an SFT shard."""
    from reasoner import shards
    from reasoner.data import synthetic

    def go() -> dict[str, Path]:
        return synthetic.run(load(SynthConfig, config, overrides))

    folders = run_stage("data synth", go)
    rows = []
    for name, folder in folders.items():
        counts = (shards.read_manifest(folder) or {}).get("counts", {})
        rows.append((name, f"{folder}  {', '.join(f'{k}={v}' for k, v in counts.items())}"))
    summary("data synth", rows)


@model_app.command("tiny")
def model_tiny(config: ConfigArg, overrides: OverridesArg = None) -> None:
    """Build a tiny Qwen2 model + BPE tokenizer from scratch as an HF folder."""
    from reasoner import models

    out = run_stage("model tiny", lambda: models.build_tiny(load(TinyConfig, config, overrides)))
    info = models.describe(out)
    summary("model tiny", [
        ("folder", out),
        ("architecture", f"{info['architecture']}, {info['layers']} layers, hidden "
                         f"{info['hidden_size']}, vocab {info['vocab_size']}"),
        ("parameters", f"{info['parameters']:,}"),
    ])


@app.command("sft")
def sft(config: ConfigArg, overrides: OverridesArg = None) -> None:
    """Supervised fine-tuning with sequence packing; loss on response tokens only."""
    from reasoner import sft as stage
    from reasoner import shards

    cfg = load_config("sft", SFTConfig, config, overrides)
    final = run_stage("sft", lambda: stage.run(cfg))
    counts = (shards.read_manifest(cfg.output_dir) or {}).get("counts", {})
    if _is_main():
        summary("sft", [(k.replace("_", " "), v) for k, v in counts.items()] or [("model", final)])


@app.command("infer")
def infer(
    config: ConfigArg,
    overrides: OverridesArg = None,
    shard: Annotated[int, typer.Option("--shard", help="this worker's shard index")] = 0,
    num_shards: Annotated[int, typer.Option("--num-shards", help="workers in all")] = 1,
) -> None:
    """Sample n candidate answers per problem (vLLM or transformers); resumable, shardable."""
    from reasoner import infer as stage
    from reasoner import shards

    cfg = load_config("infer", InferConfig, config, overrides)
    out = run_stage("infer", lambda: stage.run(cfg, shard, num_shards))
    manifest = shards.read_manifest(out) or {}
    counts = manifest.get("counts", {})
    rows = [("folder", out), ("complete", manifest.get("complete", False))]
    rows += [(k.replace("_", " "), f"{v:.3f}" if isinstance(v, float) else v)
             for k, v in counts.items()]
    last = manifest.get("last_run", {})
    if last.get("seconds"):
        rows.append(("throughput", f"{last['generated'] / last['seconds']:.1f} samples/s, "
                                   f"{last['tokens'] / last['seconds']:,.0f} tokens/s"))
    summary("infer", rows)


@app.command("verify")
def verify(config: ConfigArg, overrides: OverridesArg = None) -> None:
    """Judge each sample (math-verify rules and/or an LLM judge), reward it, filter groups."""
    from reasoner import shards
    from reasoner import verify as stage

    cfg = load_config("verify", VerifyConfig, config, overrides)
    out = run_stage("verify", lambda: stage.run(cfg))
    manifest = shards.read_manifest(out) or {}
    c = manifest.get("counts", {})
    rows = [("folder", out), ("in", f"{c.get('problems_in')} problems, {c.get('samples_in')} samples"),
            ("verdicts", ", ".join(f"{k} {v}" for k, v in c.get("verdicts", {}).items()))]
    if c.get("decontaminated_problems"):
        rows.append(("decontaminated", f"{c['decontaminated_problems']} problems"))
    for f in manifest.get("filters", []):
        rows.append((f["filter"], f"-{f['problems_removed']} problems, -{f['samples_removed']} samples"))
    if manifest.get("agreement"):
        rows.append(("rule x judge", ", ".join(f"{k}: {v}" for k, v in manifest["agreement"].items())))
    rows.append(("out", f"{c.get('problems')} problems, {c.get('samples')} samples "
                        f"({c.get('positives')} positive, {c.get('negatives')} negative)"))
    summary("verify", rows)


def _is_main() -> bool:
    import os

    return int(os.environ.get("RANK", 0)) == 0


if __name__ == "__main__":
    app()
