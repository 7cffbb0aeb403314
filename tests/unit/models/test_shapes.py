"""Model shapes: the parameter counts the plan works from equal the models' own."""

import pytest

from reasoner.models.shapes import KNOWN, count_parameters, shape_of


@pytest.mark.parametrize("name", ["Qwen/Qwen2.5-32B", "Qwen/Qwen3-32B",
                                  "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"])
def test_parameter_counts_equal_the_models_own(name):
    import torch
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    c = dict(KNOWN[name])
    model_type = c.pop("model_type", "qwen2")
    config = AutoConfig.for_model(model_type, **c)
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    assert shape_of(name).params == sum(p.numel() for p in model.parameters())


def test_the_tiny_models_count(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert count_parameters(tiny_model_dir) == sum(p.numel() for p in model.parameters())
