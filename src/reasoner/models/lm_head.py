"""The lm-head product as both log-prob paths compute it (`logprobs`, `vocab_parallel`): in
the compute dtype autocast gives it, widened to fp32 for every reduction, the same in forward
and in the backward's recomputation; and the backward's product with the weight, which never
widens a frozen half-precision head whole."""

from __future__ import annotations

import torch
from torch import Tensor


def compute_dtype(hidden: Tensor) -> torch.dtype:
    """The dtype the lm-head product runs in: autocast's where it is on (as every trainer runs
    it), else fp32 at least (fp64 in tests)."""
    kind = hidden.device.type
    if torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return torch.promote_types(hidden.dtype, torch.float32)


def lowp_logits(h: Tensor, w_compute: Tensor, acc: torch.dtype) -> Tensor:
    """(c, V) logits of the product in `w_compute`'s dtype, widened to `acc` for the reductions.

    Forward and backward both take the logits from here, so the softmax backward uses is the
    one whose log-sum-exp the forward returned: recomputed in fp32 while the forward's were
    bf16-rounded, it would not sum to 1 against that log-sum-exp (bf16: +-0.03 at a logit of
    10, several percent on a confident token's gradient)."""
    with torch.autocast(h.device.type, enabled=False):
        return (h.to(w_compute.dtype) @ w_compute.T).to(acc)


def times_weight(dlogits: Tensor, weight: Tensor, rows: int) -> Tensor:
    """dlogits @ weight, (c, V) @ (V, H) -> (c, H) in dlogits' dtype (fp32 at least).

    A weight already in that dtype is one product, as before. A narrower one (a frozen bf16
    lm-head: a LoRA base, a reference) is widened `rows` vocabulary rows at a time and the
    products summed, so that no whole fp32 copy of it is made: for Qwen2.5-7B's head that copy
    is 151,936 x 3,584 x 4 bytes = 2.03 GiB, held through every chunk of the backward."""
    if weight.dtype == dlogits.dtype:
        return dlogits @ weight
    out = dlogits.new_zeros(dlogits.shape[0], weight.shape[1])  # (c, H)
    for v in range(0, weight.shape[0], rows):
        out.addmm_(dlogits[:, v:v + rows], weight[v:v + rows].to(dlogits.dtype))  # (r, H) widened
    return out
