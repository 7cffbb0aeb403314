"""Attention kernels a CPU does not have, standing in for them in a rehearsal (pipeline/
rehearsal.py): each allocates and saves what the real kernel allocates and saves, and computes
nothing (under FakeTensorMode there is nothing to compute). What each holds is read from the
kernel's source (docs/hardware.md, rows 49-50, cites the lines):

- flash-attention 2's varlen kernel (`flash_attn_varlen_func`, CUDA kinds): forward makes `out`
  like q and an fp32 log-sum-exp (heads, total_q), and saves q, k, v, out and the log-sum-exp;
  backward makes dq, dk, dv like q, k, v, an fp32 dq accumulator (total_q + 128 x sequences,
  heads, head_dim rounded up to 32 / 64), an fp32 softmax_d (heads, total_q + 128 x sequences),
  and, with fewer key/value heads than query heads, dk and dv expanded to every query head
  before they are summed back.
- torch_npu's `npu_fusion_attention` (Ascend, layout TND): forward makes the output like q and
  softmax_max and softmax_sum in fp32 (total_q, heads, 8), and saves q, k, v, out and both;
  backward (`npu_fusion_attention_grad`) makes dq, dk, dv like q, k, v.

Registered under transformers' `flash_attention_2` name for the block (`standing_in`), the
name the trainer's models run (on Ascend transformers routes it to `npu_fusion_attention`), so
the trainer's code paths (sequence boundaries from the host layout, the Ulysses attention around
the kernel) are the ones a device takes.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

FLASH = "flash_attention_2"
_flops = {"total": 0.0}  # what the stand-ins would have computed since `standing_in` began


def flops() -> float:
    """FLOPs of the attention the stand-ins stood in for (torch's flop counter sees none)."""
    return _flops["total"]


def _count(q: Tensor, longest: int, backward: bool) -> None:
    """Causal attention over sequences as long as the longest (an upper bound): 2 matmuls
    of 2 x pairs x heads x head_dim FLOPs forward, 2.5 times that backward (5 matmuls, one
    recomputed score)."""
    total, heads, dim = q.shape
    pairs = total * (min(longest, total) + 1) / 2
    _flops["total"] += 4 * pairs * heads * dim * (2.5 if backward else 1.0)


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


class _FlashVarlen(torch.autograd.Function):
    """flash-attn 2 `FlashAttnVarlenFunc`'s allocations: q (Tq, H, D), k / v (Tk, Hk, D)."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, sequences: int, longest: int) -> Tensor:
        out = torch.empty_like(q)  # (Tq, H, D)
        lse = q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)  # (H, Tq)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.sequences, ctx.longest = sequences, longest
        _count(q, longest, False)
        return out

    @staticmethod
    def backward(ctx, dout: Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        total, heads, dim = q.shape
        padded = total + 128 * ctx.sequences
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        softmax_d = q.new_empty((heads, padded), dtype=torch.float32)
        dq_accum = q.new_empty((padded, heads, _round_up(dim, 32 if dim <= 128 else 64)),
                               dtype=torch.float32)
        if k.shape[1] != heads:  # GQA: dk / dv per query head, then summed per key head
            dk_expanded = k.new_empty((k.shape[0], heads, dim))
            dv_expanded = v.new_empty((v.shape[0], heads, dim))
            dk = dk_expanded.reshape(k.shape[0], k.shape[1], -1, dim).sum(2)
            dv = dv_expanded.reshape(v.shape[0], v.shape[1], -1, dim).sum(2)
        del softmax_d, dq_accum
        _count(q, ctx.longest, True)
        return dq, dk, dv, None, None


class _NpuFusion(torch.autograd.Function):
    """torch_npu `npu_fusion_attention` (TND)'s allocations: q (Tq, H, D), k / v (Tk, Hk, D)."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, sequences: int, longest: int) -> Tensor:
        out = torch.empty_like(q)
        softmax_max = q.new_empty((q.shape[0], q.shape[1], 8), dtype=torch.float32)
        softmax_sum = q.new_empty((q.shape[0], q.shape[1], 8), dtype=torch.float32)
        ctx.save_for_backward(q, k, v, out, softmax_max, softmax_sum)
        ctx.longest = longest
        _count(q, longest, False)
        return out

    @staticmethod
    def backward(ctx, dout: Tensor):
        q, k, v = ctx.saved_tensors[:3]
        _count(q, ctx.longest, True)
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), None, None


KERNELS = {"flash-varlen": _FlashVarlen, "npu-fusion": _NpuFusion}


def attention(kernel: str) -> Any:
    """A transformers attention function (`flash_attention_2`'s signature) running `kernel`'s
    stand-in on a flat packed row: query (1, H, T, D), key / value (1, Hk, T, D); the row's
    sequences from `cu_seq_lens_q` (the trainer hands them from the collator's layout)."""
    fn = KERNELS[kernel]

    def forward(module: Any, query: Tensor, key: Tensor, value: Tensor,
                attention_mask: Tensor | None, dropout: float = 0.0,
                scaling: float | None = None, **kwargs: Any) -> tuple[Tensor, None]:
        cu = kwargs.get("cu_seq_lens_q")
        sequences = cu.shape[0] - 1 if cu is not None else query.shape[0]
        B, H, T, D = query.shape
        q = query.transpose(1, 2).reshape(B * T, H, D)  # (T, H, D): flash's varlen layout
        k = key.transpose(1, 2).reshape(B * T, key.shape[1], D)
        v = value.transpose(1, 2).reshape(B * T, value.shape[1], D)
        longest = kwargs.get("max_length_q") or B * T
        out = fn.apply(q, k, v, sequences, int(longest))  # (T, H, D)
        return out.reshape(B, T, H, D), None

    return forward


@contextmanager
def standing_in(kernel: str) -> Iterator[str]:
    """For the block, transformers' `flash_attention_2` runs `kernel`'s stand-in; yields the
    implementation name to build with."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    # the models look the name up in this instance, whose own entries win over the registered
    # ones (`AttentionInterface.register`): an entry left there (restoring an item of it writes
    # one) would otherwise run transformers' own flash-attn forward instead of the stand-in
    local = ALL_ATTENTION_FUNCTIONS._local_mapping
    had, before = FLASH in local, local.get(FLASH)
    local[FLASH] = attention(kernel)
    _flops["total"] = 0.0
    try:
        yield FLASH
    finally:
        if had:
            local[FLASH] = before
        else:
            del local[FLASH]
