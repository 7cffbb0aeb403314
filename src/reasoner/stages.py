"""The registry of stages: for each command, its config model, its runner, what it produces.

The CLI (config models of every command) and `reasoner run` (planning, running, the end table)
both read this one table; the recipe models and `load_recipe` (a recipe file with `extends`
resolved and overrides applied) live here too. Adding a stage: its module with a `run(cfg)`, its config model in
config.py, one entry here, its docs. Runners are named as "module:function" and imported only
when the stage runs, so `reasoner --help` never loads torch-heavy modules.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field, field_validator

from reasoner import shards
from reasoner.config import (
    ConfigError,
    EvalConfig,
    InferConfig,
    OfflineConfig,
    SFTConfig,
    Strict,
    SynthConfig,
    TinyConfig,
    VerifyConfig,
    load,
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


def _read_recipe(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    """The recipe as data, with `extends` resolved: the base's stages up to `extends_until`,
    then this file's; config paths made relative to this file's folder."""
    if not path.is_file():
        raise ConfigError(f"recipe {path} does not exist")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys")
    base_name = raw.get("extends")
    if base_name is None:
        return raw
    base_path = (path.parent / base_name).resolve()
    if base_path in seen:
        raise ConfigError(f"{path}: `extends` loops back to {base_path}")
    base = _read_recipe(base_path, (*seen, path.resolve()))
    stages = []
    for stage in base.get("stages", []):
        stage = dict(stage)
        if stage.get("config") is not None:
            stage["config"] = os.path.relpath(base_path.parent / stage["config"], path.parent)
        stages.append(stage)
        if stage.get("name") == raw.get("extends_until"):
            break
    else:
        if raw.get("extends_until") is not None:
            raise ConfigError(f"{path}: extends_until {raw['extends_until']!r} is no stage of {base_path}")
    merged = {k: v for k, v in base.items() if k not in ("stages", "extends", "extends_until")}
    merged.update({k: v for k, v in raw.items() if k != "stages"})
    merged["stages"] = stages + list(raw.get("stages", []))
    return merged


def load_recipe(path: Path, overrides: list[str]) -> RecipeConfig:
    """The recipe YAML plus overrides: recipe keys (run_dir=..., seed=1) or STAGE.key=value."""
    import difflib

    from reasoner.configfile import parse_overrides

    top, per_stage = [], {}
    raw = _read_recipe(Path(path))
    stage_names = [s.get("name") for s in raw.get("stages", []) if isinstance(s, dict)]
    for item in overrides:
        head = item.partition("=")[0].split(".")[0]
        if head in RecipeConfig.model_fields:
            top.append(item)
        elif head in stage_names:
            per_stage.setdefault(head, []).append(item.split(".", 1)[1])
        else:
            close = difflib.get_close_matches(head, [*RecipeConfig.model_fields, *stage_names], n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(f"override {item!r}: '{head}' is neither a recipe key "
                              f"({', '.join(RecipeConfig.model_fields)}) nor a stage name{hint}")
    if "extends" in raw:  # merged data: errors name the key, not a line
        recipe = load(RecipeConfig, None, top, values=raw)
    else:
        recipe = load(RecipeConfig, path, top)
    for spec in recipe.stages:
        for key, value in parse_overrides(per_stage.get(spec.name, [])).items():
            spec.set = {**spec.set, ".".join(key): value}
        if per_stage:  # the stage times were measured on the recipe as written, not on this one
            spec.expect_seconds = None
    return recipe


def config_models() -> dict[str, type[BaseModel]]:
    """CLI command -> the config model it reads (every YAML under configs/ loads through it)."""
    found = {cli: s.config for s in STAGES.values() for cli in s.cli if s.config is not None}
    return {**found, "run": RecipeConfig, "export mindspeed": SFTConfig}
