"""sdpa for packed rows with one additive mask for every layer (`SHARED_MASK_SDPA`).

A packed row without a varlen kernel needs a block-diagonal causal mask, and transformers hands
sdpa the same bool (B, 1, T, T) mask in every layer. torch's sdpa turns a bool mask into an
additive one in the query's dtype (0 where attention is allowed, -inf elsewhere) on every call,
and autograd keeps that copy until the backward: one T x T x 4-byte tensor per layer in fp32
(measured on CPU: +0.56 GiB per layer at 12,288 tokens, 2.25 GiB for 4 layers; the bool mask
itself is 0.14 GiB). Here the conversion is made once per mask and the one additive tensor is
handed to every layer, so autograd keeps it once. The values and the kernel are those torch
would use itself (`torch.zeros(...).masked_fill_(~mask, -inf)`, as ATen's
`convert_boolean_attn_mask`), so outputs and gradients are bit for bit those of plain sdpa
(tests/unit/models/test_shared_mask.py).

Registered through transformers' attention and mask interfaces under its own name, so model
code is untouched and transformers still derives the mask from the restarting position ids.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import Tensor

SHARED_MASK_SDPA = "sdpa_shared_mask"

# The last conversion: the bool mask it came from (held weakly), the dtype, and the additive
# mask (held until the next conversion replaces it: under no_grad nothing else would keep it
# between layers).
_last: dict[str, Any] = {}


def additive(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """`mask` (bool) as sdpa's additive mask in `dtype`, converted once: a second call with the
    same mask object and dtype returns the same tensor."""
    source = _last.get("source")
    if source is not None and source() is mask and _last.get("dtype") == dtype:
        return _last["target"]
    _last.clear()  # the last one's memory goes before this one's is taken
    out = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    out.masked_fill_(mask.logical_not(), float("-inf"))
    _last.update(source=weakref.ref(mask), target=out, dtype=dtype)
    return out


def shared_mask_sdpa(module: Any, query: Tensor, key: Tensor, value: Tensor,
                     attention_mask: Tensor | None, **kwargs: Any) -> tuple[Tensor, None]:
    """transformers' sdpa attention with a bool mask replaced by its shared additive form."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if (attention_mask is not None and attention_mask.dtype == torch.bool
            and query.device.type != "npu"):  # transformers hands torch_npu a bool mask
        attention_mask = additive(attention_mask, query.dtype)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def register() -> str:
    """Register the attention function, with sdpa's own mask builder, and return its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(SHARED_MASK_SDPA, shared_mask_sdpa)
    AttentionMaskInterface.register(SHARED_MASK_SDPA, sdpa_mask)
    return SHARED_MASK_SDPA
