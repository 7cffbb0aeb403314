"""Recipes: a list of registered stages, read from YAML (`reasoner run`, `reasoner plan`).

The words used across pipeline/: a *stage kind* is an entry of registry.STAGES (what a recipe's
`command:` names); a *stage spec* (`StageSpec`) is one entry of a recipe file as written; a
*stage run* (run.StageRun) is one spec resolved for one round, with its config, output folder
and status. `load_recipe` reads a recipe file with `extends` resolved and overrides applied.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, field_validator

from reasoner.config import ConfigError, Strict, load
from reasoner.pipeline.registry import STAGES


class StageSpec(Strict):
    """One stage of a recipe: a command, its config file, and values set on top of it."""

    name: str = Field(..., pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
                      description="unique name; the stage writes into RUN_DIR/<name>/")
    command: str = Field(..., description="the stage it runs: data synth, model tiny, sft, infer, "
                         "verify, train-offline, eval, compare (registry.STAGES)")
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


class ClusterConfig(Strict):
    """How `reasoner run --launcher slurm` runs the recipe on a cluster's nodes (docs/run.md)."""

    env: dict[str, str] = Field(
        default_factory=dict, description="environment variables of every process on every "
        "node, e.g. NCCL_SOCKET_IFNAME, NCCL_IB_HCA, HCCL_IF_IP, HCCL_CONNECT_TIMEOUT, "
        "HCCL_OP_EXPANSION_MODE (HCCL_EXEC_TIMEOUT comes from each stage's run.dist_timeout_min)")
    sbatch: list[str] = Field(
        default_factory=list, description="extra sbatch options, one `#SBATCH` line each, e.g. "
        "--partition=gpu, --time=2-00:00:00, --account=ml, --gres=npu:16")
    spread: bool = Field(
        True, description="on several nodes, give each generating engine (infer, eval, a "
        "judge) that sets no ray.workers as many Ray actors as the allocation holds; false: "
        "as the stage configs say (a warning names each stage left on the first node)")

    @field_validator("env")
    @classmethod
    def _names(cls, value: dict[str, str]) -> dict[str, str]:
        import re

        for name in value:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ValueError(f"{name!r} is not an environment variable name")
            if name == "HCCL_EXEC_TIMEOUT":
                raise ValueError("HCCL_EXEC_TIMEOUT is set for each training stage from its "
                                 "run.dist_timeout_min; set that instead")
        return value

    @field_validator("sbatch")
    @classmethod
    def _options(cls, value: list[str]) -> list[str]:
        for option in value:
            if not option.startswith("-") or "\n" in option:
                raise ValueError(f"{option!r}: each entry is one sbatch option, e.g. "
                                 "--partition=gpu")
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
    keep_previous: int = Field(
        1, ge=0, description="earlier outputs kept per stage when a changed config replaces it "
        "(<stage>.previous, .previous-2, ...); one whose identity a stage asks for again is "
        "brought back instead of recomputed. 0: delete the replaced output")
    previous_max_gib: float | None = Field(
        None, ge=0, description="at most this many GiB of earlier outputs per stage, the oldest "
        "deleted first; null: no limit but keep_previous")
    cluster: ClusterConfig = Field(default_factory=ClusterConfig,
                                   description="`--launcher slurm`: per-node environment, sbatch "
                                   "options")


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

    from reasoner.config import parse_overrides

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
