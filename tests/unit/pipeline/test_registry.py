"""The stage registry: one table that the CLI and `reasoner run` both read."""

import importlib
from pathlib import Path

import pytest

from reasoner import cli
from reasoner.pipeline.recipe import RecipeConfig, StageSpec
from reasoner.pipeline.registry import STAGES


def test_every_runner_imports_and_every_stage_has_a_config_or_is_compare():
    for name, stage in STAGES.items():
        module, function = stage.runner.split(":")
        assert callable(getattr(importlib.import_module(module), function)), name
        assert stage.config is not None or name == "compare"


# Each command's config model and runner, written out here rather than read from the table the
# CLI reads: rewiring `reasoner sft` to another config or runner fails the test below.
COMMANDS = {
    ("sft",): ("SFTConfig", "reasoner.sft", "run", "sft.yaml"),
    ("train-offline",): ("OfflineConfig", "reasoner.train_offline", "run", "train_offline.yaml"),
    ("infer",): ("InferConfig", "reasoner.infer", "run", "infer.yaml"),
    ("verify",): ("VerifyConfig", "reasoner.verify", "run", "verify.yaml"),
    ("data", "synth"): ("SynthConfig", "reasoner.data.synthetic", "run", "data_synth.yaml"),
    ("model", "tiny"): ("TinyConfig", "reasoner.models.tiny", "build_tiny", "tiny_model.yaml"),
    ("eval", "bench"): ("EvalConfig", "reasoner.eval", "run", "eval.yaml"),
}


@pytest.mark.parametrize("command", list(COMMANDS), ids=" ".join)
def test_each_command_runs_its_own_config_and_runner(monkeypatch, command):
    """The CLI command validates the shipped quickstart config with its stage's config model and
    hands it to its stage's runner (stopped there: the runner is a recorder)."""
    from tests_helpers import reasoner

    config_name, module, function, yaml_file = COMMANDS[command]
    seen = []

    def recorder(cfg):
        seen.append(type(cfg).__name__)
        raise KeyboardInterrupt  # the CLI's "interrupted" exit: nothing after the runner runs

    monkeypatch.setattr(importlib.import_module(module), function, recorder)
    config = Path(__file__).parents[3] / "configs" / "quickstart" / yaml_file
    out = reasoner(*command, config)
    assert (out.returncode, seen) == (130, [config_name]), out.stderr[-2000:]
    stage = next(s for s in STAGES.values() if " ".join(command) in s.cli)
    assert cli.CONFIG_MODELS[" ".join(command)] is stage.config  # `config show` reads it too


def test_the_table_names_the_checkpointing_stages_and_the_recipe_model():
    assert cli.CONFIG_MODELS["run"] is RecipeConfig
    checkpoints = {n for n, s in STAGES.items() if s.checkpoint}
    assert checkpoints == {"sft", "train-offline"}


def test_a_recipe_names_only_registered_stages():
    with pytest.raises(ValueError, match="unknown stage command 'finetune'; one of: data synth"):
        StageSpec(name="x", command="finetune")
