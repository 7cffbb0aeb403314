"""The registry of stages: for each command, its config model, its runner, what it produces.

The CLI (config models of every command) and `reasoner run` (planning, running, the end table)
both read this one table. Adding a stage: its module with a `run(cfg)`, its config model in
config.py, one entry here, its docs. Runners are named as "module:function" and imported only
when the stage runs, so `reasoner --help` never loads torch-heavy modules.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, field_validator

from reasoner import shards
from reasoner.config import (
    EvalConfig,
    InferConfig,
    OfflineConfig,
    SFTConfig,
    Strict,
    SynthConfig,
    TinyConfig,
    VerifyConfig,
)


@dataclass(frozen=True)
class StageDef:
    """One kind of stage."""

    command: str  # its name in a recipe's `command:`
    config: type[BaseModel] | None  # None: the stage takes no config file (compare)
    runner: str  # "module:function" taking the validated config (compare: a dict)
    headline: Callable[[Path], tuple[str, dict]]  # the numbers worth a glance, from its folder
    cli: tuple[str, ...] = ()  # CLI commands that read this config model
    artifact: str = ""  # what to open first in its folder
    checkpoint: bool = False  # writes a model: {policy} points at its `final/` afterwards

    def run(self, config: Any) -> Any:
        module, function = self.runner.split(":")
        return getattr(importlib.import_module(module), function)(config)


def _counts(out: Path) -> dict:
    return (shards.read_manifest(out) or {}).get("counts", {})


def _synth(out: Path) -> tuple[str, dict]:
    parts = {p.name: _counts(p) for p in sorted(out.iterdir()) if p.is_dir()}
    return ", ".join(f"{k} {next(iter(v.values()), '?')}" for k, v in parts.items()), {}


def _tiny(out: Path) -> tuple[str, dict]:
    from reasoner import models

    params = models.describe(out)["parameters"]
    return f"{params:,} parameters", {"parameters": params}


def _trained(out: Path) -> tuple[str, dict]:
    c = _counts(out)
    loss = c.get("final_loss")
    return (f"{c.get('steps')} steps, final loss {loss:.4f}" if loss is not None
            else f"{c.get('steps')} steps"), c


def _infer(out: Path) -> tuple[str, dict]:
    c = _counts(out)
    return (f"{c.get('samples')} samples, {c.get('mean_response_tokens', 0):.0f} tokens mean, "
            f"{100 * c.get('truncation_rate', 0):.1f}% truncated"), c


def _verify(out: Path) -> tuple[str, dict]:
    c = _counts(out)
    return (f"{c.get('problems_in')} -> {c.get('problems')} problems, {c.get('samples')} samples "
            f"({c.get('positives')}+ / {c.get('negatives')}-)"), c


def _eval(out: Path) -> tuple[str, dict]:
    r = json.loads((out / "report.json").read_text())
    lo, hi = r["pass@1_ci95"]
    m = {"pass@1": r["pass@1"], "ci95": [lo, hi], "mean_tokens": r["mean_response_tokens"]}
    return (f"pass@1 {100 * r['pass@1']:.1f}% (CI {100 * lo:.1f}-{100 * hi:.1f}), "
            f"{r['mean_response_tokens']:.0f} tokens"), m


def _compare(out: Path) -> tuple[str, dict]:
    r = json.loads((out / "compare.json").read_text())
    last = r["runs"][-1]
    lo, hi = last["diff_ci95"]
    m = {"diff": last["diff"], "diff_ci95": [lo, hi], "significant": last["significant"]}
    return (f"{Path(last['name']).name} vs {Path(r['runs'][0]['name']).name}: "
            f"{100 * last['diff']:+.1f} points (paired CI {100 * lo:+.1f} to {100 * hi:+.1f})"), m


def run_compare(config: dict) -> Path:
    """The recipe stage `compare`: every listed eval report against the first."""
    from reasoner.eval.report import compare

    out = Path(config["output_dir"])
    compare([Path(r) for r in config["reports"]], out)
    return out


STAGES: dict[str, StageDef] = {s.command: s for s in [
    StageDef("data synth", SynthConfig, "reasoner.data.synthetic:run", _synth, ("data synth",)),
    StageDef("model tiny", TinyConfig, "reasoner.models:build_tiny", _tiny, ("model tiny",)),
    StageDef("sft", SFTConfig, "reasoner.sft:run", _trained, ("sft",), "final", checkpoint=True),
    StageDef("infer", InferConfig, "reasoner.infer:run", _infer, ("infer",)),
    StageDef("verify", VerifyConfig, "reasoner.verify:run", _verify, ("verify",)),
    StageDef("train-offline", OfflineConfig, "reasoner.train_offline:run", _trained,
             ("train-offline",), "final", checkpoint=True),
    StageDef("eval", EvalConfig, "reasoner.eval:run", _eval, ("eval aime", "eval bench"),
             "report.md"),
    StageDef("compare", None, "reasoner.stages:run_compare", _compare, (), "compare.md"),
]}


# --------------------------------------------------------------------------------------------
# Recipes: lists of registered stages (`reasoner run`)


class StageSpec(Strict):
    """One stage of a recipe: a command, its config file, and values set on top of it."""

    name: str = Field(..., pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
                      description="unique name; the stage writes into RUN_DIR/<name>/")
    command: str = Field(..., description="the stage it runs: data synth, model tiny, sft, infer, "
                         "verify, train-offline, eval, compare (stages.STAGES)")
    config: Path | None = Field(
        None, description="stage config YAML, relative to the recipe file (compare needs none)")
    set: dict[str, Any] = Field(
        default_factory=dict, description="dotted key -> value on top of the config; strings may "
        "name other stages' folders: {sft}, {data}/test_problems, {policy} (newest checkpoint), "
        "{run_dir}"
    )
    repeat: bool = Field(False, description="part of the round block repeated `rounds` times")
    launcher: str | None = Field(
        None, description="run as a subprocess with this prefix, e.g. 'torchrun --nproc-per-node 8'"
    )
    reports: list[str] = Field(
        default_factory=list, description="compare: eval stages to compare (default: every eval, in order)"
    )
    expect_seconds: float | None = Field(
        None, ge=0, description="what this stage took where the recipe was measured; `reasoner "
        "run` scales the stages still to run by how fast this machine ran those before and prints "
        "the time left"
    )

    @field_validator("command")
    @classmethod
    def _known_command(cls, value: str) -> str:
        if value not in STAGES:
            raise ValueError(f"unknown stage command {value!r}; one of: {', '.join(STAGES)}")
        return value


class RecipeConfig(Strict):
    """`reasoner run`: a whole recipe, stage after stage, skipping finished ones."""

    extends: Path | None = Field(
        None, description="another recipe whose stages (up to `extends_until`) come first; its "
        "run_dir, seed, rounds and start_model apply unless set here"
    )
    extends_until: str | None = Field(None, description="last stage taken from `extends`")
    run_dir: Path = Field(..., description="every stage writes into RUN_DIR/<stage name>/")
    seed: int = Field(0, description="added to every `seed` in every stage config (0 = as written)")
    start_model: str | None = Field(
        None, description="what {policy} means before any sft / train-offline stage (HF id or folder)"
    )
    rounds: int = Field(1, ge=1, description="repeat the `repeat: true` block (infer -> verify -> "
                        "train-offline [-> eval]) from the newest checkpoint")
    stages: list[StageSpec] = Field(..., min_length=1, description="the stages, in order")


def config_models() -> dict[str, type[BaseModel]]:
    """CLI command -> the config model it reads (every YAML under configs/ loads through it)."""
    found = {cli: s.config for s in STAGES.values() for cli in s.cli if s.config is not None}
    return {**found, "run": RecipeConfig, "export mindspeed": SFTConfig}
