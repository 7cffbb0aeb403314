"""sdpa with one additive mask for every layer: the same numbers as plain sdpa, bit for bit,
and one T x T copy kept for the backward instead of one per layer."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from reasoner.models import shared_mask


def packed_row(T: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    ids = torch.randint(0, vocab, (1, T))
    cut = [T // 3, T // 3, T - 2 * (T // 3)]
    pos = torch.cat([torch.arange(n) for n in cut])[None]
    return ids, pos


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_outputs_and_gradients_are_plain_sdpas_bit_for_bit(tiny_model_dir, dtype):
    ids, pos = packed_row(96, 300)
    out = {}
    for name in ("sdpa", shared_mask.register()):
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=dtype,
                                                     attn_implementation=name)
        logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits
        logits.float().square().mean().backward()
        out[name] = (logits.detach(), {n: p.grad for n, p in model.named_parameters()})
    (a, ga), (b, gb) = out.values()
    assert torch.equal(a, b)
    assert ga.keys() == gb.keys() and all(torch.equal(ga[n], gb[n]) for n in ga)


def test_the_backward_keeps_one_additive_mask_not_one_per_layer(tiny_model_dir):
    """Count the T x T tensors autograd saves for the backward of a 2-layer forward."""
    T = 160
    ids, pos = packed_row(T, 300)
    kept = {}
    for name in ("sdpa", shared_mask.register()):
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation=name)
        masks = []

        def pack(t, masks=masks):
            if t.dim() == 4 and t.shape[-2:] == (T, T):
                masks.append(t)
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = model(input_ids=ids, position_ids=pos, use_cache=False).logits.square().mean()
        kept[name] = {m.data_ptr() for m in masks}
        loss.backward()
    assert len(kept["sdpa"]) == 2  # a converted copy for each of the 2 layers
    assert len(kept[shared_mask.SHARED_MASK_SDPA]) == 1
