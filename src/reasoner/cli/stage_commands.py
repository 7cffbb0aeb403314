"""One stage's commands: `data synth`, `model tiny | import`, `sft`, `infer`, `verify`,
`explain`, `train-offline`. Each loads the config model its stage kind names in
`pipeline.registry.STAGES` (with the overrides), calls that kind's runner (`run(cfg)`) and
prints a summary; cli/__init__.py registers them on the app.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from reasoner.cli.common import (
    ConfigArg,
    OverridesArg,
    done,
    is_main,
    load_config,
    run_stage,
    summary,
)
from reasoner.pipeline.registry import STAGES


class Dtype(str, Enum):
    auto = "auto"
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


data_app = typer.Typer(help="Make and inspect datasets.", no_args_is_help=True)
model_app = typer.Typer(help="Build or import models.", no_args_is_help=True)


@data_app.command("synth")
def data_synth(config: ConfigArg, overrides: OverridesArg = None) -> None:
    """Write synthetic arithmetic word problems (train/test) and an SFT shard."""
    from reasoner import shards

    stage = STAGES["data synth"]
    cfg = load_config("data synth", stage.config, config, overrides)
    folders = run_stage("data synth", lambda: stage.run(cfg))
    rows = []
    for name, folder in folders.items():
        counts = (shards.read_manifest(folder) or {}).get("counts", {})
        rows.append((name, f"{folder}  {', '.join(f'{k}={v}' for k, v in counts.items())}"))
    summary("data synth", rows)
    done("data synth")


@model_app.command("tiny")
def model_tiny(config: ConfigArg, overrides: OverridesArg = None) -> None:
    """Build a tiny Qwen2 model + BPE tokenizer from scratch as an HF folder."""
    from reasoner import models

    stage = STAGES["model tiny"]
    cfg = load_config("model tiny", stage.config, config, overrides)
    out = run_stage("model tiny", lambda: stage.run(cfg))
    info = models.describe(out)
    summary("model tiny", [
        ("folder", out),
        ("architecture", f"{info['architecture']}, {info['layers']} layers, hidden "
                         f"{info['hidden_size']}, vocab {info['vocab_size']}"),
        ("parameters", f"{info['parameters']:,}"),
    ])
    done("model tiny")


@model_app.command("import")
def model_import(
    source: Annotated[str, typer.Argument(help="a .gguf file, a model folder or an HF hub id",
                                          show_default=False)],
    output_dir: Annotated[Path, typer.Argument(help="folder to write", show_default=False)],
    gguf_file: Annotated[str | None, typer.Option(help="GGUF file inside SOURCE")] = None,
    dtype: Annotated[Dtype, typer.Option(help="weights dtype (auto: GGUF as float32, else as "
                                              "stored)")] = Dtype.auto,
    overwrite: Annotated[bool, typer.Option("--overwrite",
                                            help="replace a model already in OUTPUT_DIR")] = False,
    trust_remote_code: Annotated[bool, typer.Option("--trust-remote-code",
                                                    help="allow the model's own code")] = False,
) -> None:
    """Write a GGUF file or any HF model as a plain safetensors folder every stage loads."""
    from reasoner import models

    dtype = Dtype(dtype).value
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
    done("model import")


def _train(name: str, config: Path, overrides: list[str] | None) -> None:
    """sft and train-offline: run the trainer, then (rank 0) the counts of its manifest. HCCL's
    time-out goes into the environment first: `import torch` loads torch_npu, which reads it."""
    from reasoner import hccl, shards

    stage = STAGES[name]
    cfg = load_config(name, stage.config, config, overrides)
    run_stage(name, lambda: hccl.set_before_torch(cfg.model.device, cfg.run.dist_timeout_min))
    final = run_stage(name, lambda: stage.run(cfg))
    counts = (shards.read_manifest(cfg.output_dir) or {}).get("counts", {})
    if is_main():
        summary(name, [("trained", trained(cfg.model.lora))]
                + ([(k.replace("_", " "), v) for k, v in counts.items()] or [("model", final)]))
        done(name)


def trained(lora) -> str:
    """What a trainer trained: every parameter, or LoRA adapters (and what final/ then holds)."""
    if lora is None:
        return "every parameter"
    return (f"LoRA adapters (r {lora.r}, alpha {lora.alpha:g}, on {', '.join(lora.target_modules)});"
            " final/ is the merged model, final/adapter/ the adapters")


def removed(problems: int, samples: int) -> str:
    """A filter's toll: `3 problems, 24 samples removed`, or `nothing removed` (never "-0")."""
    if not problems and not samples:
        return "nothing removed"
    return f"{problems} problems, {samples} samples removed"


def sft(config: ConfigArg, overrides: OverridesArg = None) -> None:
    """Supervised fine-tuning with sequence packing; loss on response tokens only."""
    _train("sft", config, overrides)


def infer(
    config: ConfigArg,
    overrides: OverridesArg = None,
    shard: Annotated[int, typer.Option("--shard", help="this worker's shard index")] = 0,
    num_shards: Annotated[int, typer.Option("--num-shards", help="workers in all")] = 1,
) -> None:
    """Sample n candidate answers per problem (vLLM or transformers); resumable, shardable."""
    from reasoner import shards

    stage = STAGES["infer"]
    cfg = load_config("infer", stage.config, config,
                      [*(overrides or []), f"shard={shard}", f"num_shards={num_shards}"])
    out = run_stage("infer", lambda: stage.run(cfg))
    manifest = shards.read_manifest(out) or {}
    counts = manifest.get("counts", {})
    rows = [("folder", out), ("complete", manifest.get("complete", False))]
    rows += [(k.replace("_", " "), f"{v:.3f}" if isinstance(v, float) else v)
             for k, v in counts.items()]
    last = manifest.get("last_run", {})
    if last.get("load_seconds") is not None:
        from reasoner.infer.engines import pick_backend

        engine = " (vLLM engine start)" if pick_backend(cfg.backend) == "vllm" else ""
        rows.append(("model load", f"{last['load_seconds']:.1f} s{engine}"))
    if last.get("seconds"):
        rows.append(("throughput", f"{last['generated'] / last['seconds']:.1f} samples/s, "
                                   f"{last['tokens'] / last['seconds']:,.0f} tokens/s "
                                   "(generation alone)"))
    summary("infer", rows)
    done("infer")


def verify(config: ConfigArg, overrides: OverridesArg = None) -> None:
    """Judge each sample (math-verify rules and/or an LLM judge), reward it, filter groups."""
    from reasoner import shards

    stage = STAGES["verify"]
    cfg = load_config("verify", stage.config, config, overrides)
    out = run_stage("verify", lambda: stage.run(cfg))
    manifest = shards.read_manifest(out) or {}
    c = manifest.get("counts", {})
    rows = [("folder", out), ("in", f"{c.get('problems_in')} problems, {c.get('samples_in')} samples"),
            ("verdicts", ", ".join(f"{k} {v}" for k, v in c.get("verdicts", {}).items()))]
    if c.get("decontaminated_problems"):
        rows.append(("decontaminated", f"{c['decontaminated_problems']} problems"))
    for f in manifest.get("filters", []):
        rows.append((f["filter"], removed(f["problems_removed"], f["samples_removed"])))
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
    done("verify")


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
            ("response ended", r["ended"]), ("rule verdict", f"{r['rule']}: {r['reason']}"),
            *([("recorded", f"{r['recorded']} ({r['verifier']})")] if r["recorded"] else []),
            *([("judge said", r["judge_output"])] if r["judge_output"] else []),
            ("response ends", r["response_tail"])])
    done("explain")


def train_offline(config: ConfigArg, overrides: OverridesArg = None) -> None:
    """Offline RL on verified rollouts: pcl (published), rft, oreal, dapo/prorl, discounted."""
    _train("train-offline", config, overrides)
