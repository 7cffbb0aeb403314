"""The stage registry: one table that the CLI and `reasoner run` both read."""

import importlib

import pytest

from reasoner import cli
from reasoner.pipeline.recipe import RecipeConfig, StageSpec
from reasoner.pipeline.registry import STAGES


def test_every_runner_imports_and_every_stage_has_a_config_or_is_compare():
    for name, stage in STAGES.items():
        module, function = stage.runner.split(":")
        assert callable(getattr(importlib.import_module(module), function)), name
        assert stage.config is not None or name == "compare"


def test_cli_and_recipes_read_the_same_table():
    for stage in STAGES.values():
        for command in stage.cli:
            assert cli.CONFIG_MODELS[command] is stage.config
    assert cli.CONFIG_MODELS["run"] is RecipeConfig
    checkpoints = {n for n, s in STAGES.items() if s.checkpoint}
    assert checkpoints == {"sft", "train-offline"}


def test_a_recipe_names_only_registered_stages():
    with pytest.raises(ValueError, match="unknown stage command 'finetune'; one of: data synth"):
        StageSpec(name="x", command="finetune")
