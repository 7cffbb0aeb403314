"""The `reasoner` command line: each command loads its config + overrides and calls stage.run(cfg)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from reasoner import __version__
from reasoner.config import (
    InferConfig,
    OfflineConfig,
    SFTConfig,
    SynthConfig,
    TinyConfig,
    VerifyConfig,
    load,
)
from reasoner.errors import ConfigError, ReasonerError
from reasoner.stages import config_models

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
model_app = typer.Typer(help="Build or import models.", no_args_is_help=True)
app.add_typer(data_app, name="data")
app.add_typer(model_app, name="model")

ConfigArg = Annotated[Path, typer.Argument(help="stage config (YAML)", show_default=False)]
OverridesArg = Annotated[
    list[str] | None,
    typer.Argument(help="overrides key.sub=value (values parsed as YAML)", show_default=False),
]

# Which config model each command reads (tests load every shipped YAML through this).
CONFIG_MODELS: dict[str, type] = config_models()

# Errors a user can fix from the message alone: one paragraph, exit 2. Anything else (a bug,
# out of memory, a collective that failed) keeps its traceback.
USER_ERRORS: tuple[type[Exception], ...] = (ReasonerError,)


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


def fail(name: str, message: str) -> NoReturn:
    """End the command with a user-fixable error: its name, the message as plain text, exit 2."""
    console.print(f"[bold red]reasoner {name}: error[/]")
    console.print(message, markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(2) from None


def run_stage(name: str, fn: Callable[[], Any]) -> Any:
    """Run one stage, turning user-fixable errors into a one-paragraph message and exit code 2."""
    started = time.perf_counter()
    try:
        result = fn()
    except USER_ERRORS as exc:
        fail(name, str(exc))
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
        fail(name, str(exc))


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


@model_app.command("import")
def model_import(
    source: Annotated[str, typer.Argument(help="a .gguf file, a model folder or an HF hub id",
                                          show_default=False)],
    output_dir: Annotated[Path, typer.Argument(help="folder to write", show_default=False)],
    gguf_file: Annotated[str | None, typer.Option(help="GGUF file inside SOURCE")] = None,
    dtype: Annotated[str, typer.Option(help="auto (GGUF: float32), float32, bfloat16, float16")
                     ] = "auto",
    overwrite: Annotated[bool, typer.Option(help="replace a model already in OUTPUT_DIR")] = False,
    trust_remote_code: Annotated[bool, typer.Option(help="allow the model's own code")] = False,
) -> None:
    """Write a GGUF file or any HF model as a plain safetensors folder every stage loads."""
    from reasoner import models

    if dtype not in ("auto", "float32", "bfloat16", "float16"):
        fail("model import", f"--dtype {dtype!r}: choose auto, float32, bfloat16 or float16")
    info = run_stage("model import", lambda: models.import_model(
        source, output_dir, gguf_file, dtype, overwrite, trust_remote_code))
    described = models.describe(info["folder"])
    summary("model import", [
        ("folder", info["folder"]), ("from", f"{source}" + (f" ({info['gguf_file']})"
                                                          if info["gguf_file"] else "")),
        ("architecture", f"{described['architecture']}, {described['layers']} layers, hidden "
                         f"{described['hidden_size']}, vocab {described['vocab_size']}"),
        ("parameters", f"{info['parameters']:,} ({info['dtype']})"),
        ("stops on", info["stop_token_ids"]),
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
    if last.get("load_seconds") is not None:
        rows.append(("model load", f"{last['load_seconds']:.1f} s (engine start on vllm)"))
    if last.get("seconds"):
        rows.append(("throughput", f"{last['generated'] / last['seconds']:.1f} samples/s, "
                                   f"{last['tokens'] / last['seconds']:,.0f} tokens/s "
                                   "(generation alone)"))
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
    timeouts = c.get("verdicts", {}).get("timeout", 0) + c.get("dropped", {}).get("timeout", 0)
    if timeouts:
        rows.append(("timeouts", f"{timeouts} rule checks past timeout_s "
                                 f"({'dropped' if cfg.timeout == 'drop' else 'rewarded -1'}); "
                                 "see them with: reasoner explain FOLDER ID"))
    if manifest.get("agreement"):
        rows.append(("rule x judge", ", ".join(f"{k}: {v}" for k, v in manifest["agreement"].items())))
    rows.append(("out", f"{c.get('problems')} problems, {c.get('samples')} samples "
                        f"({c.get('positives')} positive, {c.get('negatives')} negative)"))
    if c.get("samples_per_s"):
        rows.append(("throughput", f"{c['verified_this_run']} verified, {c['samples_per_s']} samples/s"))
    rows.append(("stats", out / "stats.json"))
    summary("verify", rows)


@app.command("explain")
def explain(
    folder: Annotated[Path, typer.Argument(help="a Sample or Verified shard folder")],
    problem_id: Annotated[str, typer.Argument(help="the problem id")],
    sample: Annotated[int | None, typer.Option("--sample", help="one sample_idx only")] = None,
) -> None:
    """Why a sample got its verdict: extracted answer, what each side parsed to, the reason."""
    from reasoner.verify.explain import explain as why

    for r in run_stage("explain", lambda: why(folder, problem_id, sample)):
        summary(f"{r['id']} sample {r['sample_idx']}", [
            ("reference", r["reference"]), ("extracted", r["extracted"]),
            ("reference read as", r["reference_read_as"]), ("answer read as", r["answer_read_as"]),
            ("rule verdict", f"{r['rule']}: {r['reason']}"),
            *([("recorded", f"{r['recorded']} ({r['verifier']})")] if r["recorded"] else []),
            *([("judge said", r["judge_output"])] if r["judge_output"] else []),
            ("response ends", r["response_tail"])])


@app.command("train-offline")
def train_offline(config: ConfigArg, overrides: OverridesArg = None) -> None:
    """Offline RL on verified rollouts: pcl (published), rft, oreal, dapo/prorl, discounted."""
    from reasoner import shards
    from reasoner import train_offline as stage

    cfg = load_config("train-offline", OfflineConfig, config, overrides)
    final = run_stage("train-offline", lambda: stage.run(cfg))
    counts = (shards.read_manifest(cfg.output_dir) or {}).get("counts", {})
    if _is_main():
        summary("train-offline", [(k.replace("_", " "), v) for k, v in counts.items()]
                or [("model", final)])


export_app = typer.Typer(help="Write scripts for other training stacks.", no_args_is_help=True)
app.add_typer(export_app, name="export")


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


def _is_main() -> bool:
    from reasoner.device import is_main_process  # imports torch: only after a stage ran

    return is_main_process()


from reasoner import cli_eval, cli_run  # noqa: E402,F401  (register `reasoner run | plan | eval ...` on app)

if __name__ == "__main__":
    app()
