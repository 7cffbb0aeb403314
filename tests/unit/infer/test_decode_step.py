"""The hf backend's own decode step gives `model(...)`'s logits, bit for bit in fp32."""

from __future__ import annotations

import pytest
import torch

from reasoner.infer.decode_step import DecodeStep
from reasoner.infer.kv_cache import new_cache


def llama(dtype=torch.float32):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                      max_position_embeddings=128, tie_word_embeddings=True,
                      attn_implementation="sdpa")
    return LlamaForCausalLM(cfg).to(dtype).eval()


def qwen2(tiny_model_dir, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=dtype,
                                                attn_implementation="sdpa").eval()


def prefilled(model, rows: int, padded: bool):
    """A cache holding `rows` left-padded prompts (rows of length 9, 6, 3, ... when padded) and
    the (ids, mask, positions) of the next token of each row."""
    g = torch.Generator().manual_seed(1)
    width = 9
    lengths = [width - (3 * r % width) if padded else width for r in range(rows)]
    ids = torch.randint(3, model.config.vocab_size, (rows, width), generator=g)
    mask = torch.tensor([[0] * (width - n) + [1] * n for n in lengths])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = new_cache(model.config)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache,
              use_cache=True)
    step_ids = torch.randint(3, model.config.vocab_size, (rows, 1), generator=g)
    step_mask = torch.cat([mask, torch.ones(rows, 1, dtype=mask.dtype)], 1)
    return cache, step_ids, step_mask, torch.tensor(lengths)[:, None]


def both(model, rows: int, padded: bool, steps: int = 3):
    """(transformers' logits, the step's logits) over `steps` decode steps from equal caches."""
    theirs, ours = [], []
    for out, call in ((theirs, lambda i, m, p, c: model(
            input_ids=i, attention_mask=m, position_ids=p, cache=c, use_cache=True,
            logits_to_keep=1).logits[:, -1].float()), (ours, DecodeStep.for_model(model))):
        cache, ids, mask, positions = prefilled(model, rows, padded)
        with torch.no_grad():
            for _ in range(steps):
                logits = call(ids, mask, positions, cache)
                out.append(logits)
                ids = logits.argmax(-1, keepdim=True)
                mask = torch.cat([mask, torch.ones_like(ids)], 1)
                positions = positions + 1
    return torch.stack(theirs), torch.stack(ours)


@pytest.mark.parametrize("padded", [True, False])
def test_the_step_gives_transformers_logits_bit_for_bit_in_fp32(tiny_model_dir, padded):
    for model in (qwen2(tiny_model_dir), llama()):  # q/k/v biases; tied embeddings
        theirs, ours = both(model, 5, padded)
        assert torch.equal(theirs, ours), (model.config.model_type, padded)


def test_the_step_stays_close_in_bf16(tiny_model_dir):
    theirs, ours = both(qwen2(tiny_model_dir, torch.bfloat16), 5, True)
    assert torch.allclose(theirs, ours, atol=0.05, rtol=0.02)


def test_models_it_does_not_replicate_decode_through_transformers(tiny_model_dir):
    model = qwen2(tiny_model_dir)
    assert DecodeStep.for_model(model) is not None
    model.config._attn_implementation = "eager"
    assert DecodeStep.for_model(model) is None
    model = qwen2(tiny_model_dir)
    model.config.layer_types = ["sliding_attention"] * model.config.num_hidden_layers
    assert DecodeStep.for_model(model) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fused_rms_norm_gives_the_module_s_numbers(tiny_model_dir, dtype):
    """The step's RMSNorm (`F.rms_norm` over fp32) equals the model's module bit for bit in both
    dtypes, on rows of very different scales: in bf16 too, where the step is otherwise allowed
    one rounding apart, the norms are not where it comes from."""
    from reasoner.infer.decode_step import _norm

    model = qwen2(tiny_model_dir, dtype)
    module = model.model.layers[0].input_layernorm
    module.weight.data.normal_(generator=torch.Generator().manual_seed(2))
    fused = _norm(module)
    assert fused is not module
    g = torch.Generator().manual_seed(3)
    for _ in range(20):
        x = (torch.randn(64, 1, module.weight.shape[0], generator=g)
             * torch.rand(64, 1, 1, generator=g) * 10).to(dtype)
        with torch.no_grad():
            assert torch.equal(fused(x), module(x))
