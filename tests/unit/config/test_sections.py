"""The config sections stage configs share: template presets, defaults that match the recipe."""

import pytest
from pydantic import ValidationError

from reasoner.config import TEMPLATE_PRESETS, ModelConfig, OptimConfig, RunConfig, TemplateConfig


def test_a_preset_fills_the_prompt_and_a_value_beside_it_wins():
    published = TEMPLATE_PRESETS["pcl_reasoner_v1_5"]
    t = TemplateConfig(preset="pcl_reasoner_v1_5")
    assert t.system_prompt == published["system_prompt"]
    assert t.instruction == published["instruction"]
    own = TemplateConfig(preset="pcl_reasoner_v1_5", system_prompt="be brief")
    assert own.system_prompt == "be brief" and own.instruction == published["instruction"]


def test_an_unknown_preset_names_the_known_ones():
    with pytest.raises(ValidationError, match="unknown template preset 'pcl'; known: "
                                              "pcl_reasoner_v1_5"):
        TemplateConfig(preset="pcl")


def test_sections_refuse_unknown_keys_and_bad_values():
    with pytest.raises(ValidationError, match="extra_forbidden|Extra inputs"):
        ModelConfig(name_or_path="m", dtyp="bfloat16")
    with pytest.raises(ValidationError):
        ModelConfig(name_or_path="m", dtype="int8")
    with pytest.raises(ValidationError):
        OptimConfig(lr=0)
    run = RunConfig()
    with pytest.raises(ValidationError):  # assignments are validated too
        run.micro_batch = 0


def test_defaults_are_the_published_optimiser_and_a_safe_run():
    o = OptimConfig()
    assert (o.betas, o.eps, o.grad_clip) == ((0.9, 0.95), 1e-8, 1.0)
    r = RunConfig()
    assert (r.resume, r.keep_last, r.tracking) == ("auto", 2, [])
