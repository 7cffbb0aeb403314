"""Ulysses sequence parallelism: the processes of one group share each packed row.

DeepSpeed-Ulysses (Jacobs et al. 2023, "System optimizations for enabling training of extreme
long sequence transformer models"), as verl's `ulysses_sequence_parallel_size` runs it, written
here on torch's autograd collectives:

- each of the `size` processes of a group holds a contiguous 1/size of the row's tokens (the
  row padded to a multiple of `size`; labels are shifted before the split, so a slice's last
  target is the next slice's first token), and runs every layer but attention on them alone;
- around attention an all-to-all turns (row/size tokens, all heads) into (the whole row, heads/size)
  and back; the kernel sees the whole row's sequence boundaries (`cu_seq_lens`, from the
  collator's host-side layout, once per micro-batch): a varlen kernel on GPU / NPU, sdpa or
  eager with the block-diagonal mask on CPU. Registered through transformers' attention
  interface, so model code stays untouched;
- the token log-probs (or scores) of the slices are all-gathered, so every process of the group
  holds the micro-batch's whole (N,) vector, in the order one process would compute it. Which
  positions of a slice have a target is host data too (`Slice.local`): nothing is read back. The
  gather's backward sums the group's gradients: a loss every member computes in full counts
  `size` times, so the trainers scale each member's loss by 1/size (`training.accumulate`).

The collectives are the `*_autograd` functional ones (torch 2.4 on): the plain
`all_to_all_single` had no backward before late 2025, and without one autograd's fallback lets
the gradient through attention silently become zero (tests run with the fallback set to "error").

Heads: `heads % size == 0`, and `kv_heads % size == 0` or `size % kv_heads == 0` (key/value
heads then replicated), verl's rule. A group is `size` consecutive ranks (one node); FSDP2
shards over every process.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor

from reasoner.data.packing import IGNORE, Layout
from reasoner.device import DistInfo
from reasoner.errors import ConfigError
from reasoner.models.shared_mask import shared_mask_sdpa

ULYSSES = "reasoner_ulysses"  # the attention implementation a sequence-parallel model runs
_inner: dict[str, Any] = {}  # the group and the kernel the registered function calls


@dataclass(frozen=True)
class SequenceGroup:
    """This process's sequence-parallel group: `size` consecutive ranks, this one `rank`-th."""

    size: int = 1
    rank: int = 0
    group: Any = None  # the torch.distributed process group (None when size == 1)

    @property
    def on(self) -> bool:
        return self.size > 1

    @classmethod
    def of(cls, dist: DistInfo) -> SequenceGroup:
        return cls(dist.sp_size, dist.sp_rank, dist.sp_group)


def check_heads(heads: int, kv_heads: int, size: int, model: str = "the model") -> None:
    """Refuse a sequence-parallel size the model's attention heads do not split into."""
    if size <= 1:
        return
    if heads % size == 0 and (kv_heads % size == 0 or size % kv_heads == 0):
        return
    allowed = [s for s in range(2, heads + 1) if heads % s == 0
               and (kv_heads % s == 0 or s % kv_heads == 0)]
    raise ConfigError(
        f"run.sequence_parallel={size} does not split {model}'s attention: it has {heads} query "
        f"heads and {kv_heads} key/value heads, and each of the {size} processes of a group "
        f"must hold a whole number of query heads ({heads} % {size} = {heads % size}) and of "
        f"key/value heads (or {size} must be a multiple of {kv_heads}, the key/value heads then "
        f"replicated). Sizes this model allows: {', '.join(map(str, allowed)) or 'none'}; or 1 "
        "(no sequence parallelism).")


def check_model_heads(name_or_path: str, size: int) -> None:
    """`check_heads` for a model by name (its config.json, or a known shape); a model whose
    shape cannot be read here is checked when it loads."""
    if size <= 1:
        return
    from reasoner.models.shapes import shape_of

    try:
        shape = shape_of(name_or_path)
    except ConfigError:
        return
    check_heads(shape.heads, shape.kv_heads, size, name_or_path)


@dataclass
class Slice:
    """This process's part of a flat micro-batch row, and what the gather needs of the whole."""

    input_ids: Tensor  # (1, T/size)
    position_ids: Tensor  # (1, T/size)
    labels: Tensor  # (1, T/size)
    local: Tensor  # (n,) the slice's positions with a target
    targets: Tensor  # (N,) the whole (padded) row's positions with a target
    attn_kwargs: dict  # the whole row's boundaries, for the attention kernel


def split(input_ids: Tensor, position_ids: Tensor, labels: Tensor, sp: SequenceGroup,
          layout: Layout, pad_id: int = 0) -> Slice:
    """This process's contiguous 1/size of a flat row (1, T), the row first padded to a multiple
    of `size` (the padding a sequence of its own, outside the loss); `layout` the row's
    (packing.Layout: where its targets and sequences lie, on the host)."""
    if input_ids.shape[0] != 1:
        raise ValueError("sequence parallelism takes flat rows (1, T): collate with flat=True")
    T = input_ids.shape[1]
    extra = -T % sp.size
    if extra:
        input_ids = torch.cat([input_ids, input_ids.new_full((1, extra), pad_id)], 1)
        labels = torch.cat([labels, labels.new_full((1, extra), IGNORE)], 1)
        position_ids = torch.cat([position_ids, torch.arange(extra, device=position_ids.device)
                                  .to(position_ids.dtype)[None]], 1)
    whole, device = layout.padded(extra), input_ids.device
    cu = whole.cu_seq_lens(device)  # (k+1,)
    width = (T + extra) // sp.size
    lo = sp.rank * width
    part = slice(lo, lo + width)
    mine = whole.targets[(whole.targets >= lo) & (whole.targets < lo + width)] - lo  # host
    return Slice(input_ids[:, part], position_ids[:, part], labels[:, part],
                 torch.from_numpy(mine).to(device, non_blocking=True), whole.index(device),
                 {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": whole.longest,
                  "max_length_k": whole.longest})


def gather(values: Tensor, sl: Slice, sp: SequenceGroup) -> Tensor:
    """The whole micro-batch's (N,) from each process's values at its slice's targets (n,):
    all-gathered with autograd (the backward sums the group's gradients)."""
    from torch.distributed._functional_collectives import all_gather_tensor_autograd

    dense = values.new_zeros(sl.labels.numel()).index_copy(0, sl.local, values)  # (T/size,)
    whole = all_gather_tensor_autograd(dense, 0, sp.group)  # (T,)
    return whole.index_select(0, sl.targets)  # (N,)


def _all_to_all(x: Tensor, sp: SequenceGroup) -> Tensor:
    """`x` (size, ...) chunk j sent to rank j; returns (size, ...), chunk i from rank i."""
    from torch.distributed._functional_collectives import all_to_all_single_autograd

    return all_to_all_single_autograd(x.contiguous(), None, None, sp.group).reshape(x.shape)


def seq_to_heads(x: Tensor, sp: SequenceGroup) -> Tensor:
    """(B, H, t, D) with this rank's t tokens and every head -> (B, H/size, size*t, D): the
    whole row for this rank's heads."""
    B, H, t, D = x.shape
    chunks = x.reshape(B, sp.size, H // sp.size, t, D).transpose(0, 1)  # (size, B, h, t, D)
    got = _all_to_all(chunks, sp)  # chunk i: rank i's tokens of my heads
    return got.permute(1, 2, 0, 3, 4).reshape(B, H // sp.size, sp.size * t, D)


def heads_to_seq(x: Tensor, sp: SequenceGroup) -> Tensor:
    """(B, T, h, D) with the whole row for this rank's h heads -> (B, T/size, size*h, D)."""
    B, T, h, D = x.shape
    chunks = x.reshape(B, sp.size, T // sp.size, h, D).transpose(0, 1)  # (size, B, t, h, D)
    got = _all_to_all(chunks, sp)  # chunk i: my tokens of rank i's heads
    return got.permute(1, 2, 0, 3, 4).reshape(B, T // sp.size, sp.size * h, D)


def _replicate_kv(x: Tensor, size: int) -> Tensor:
    """(B, K, t, D) -> (B, size, t, D) when K divides size: each key/value head copied so that
    every rank's query heads find theirs after the all-to-all."""
    K = x.shape[1]
    if K % size == 0:
        return x
    return x.repeat_interleave(size // K, dim=1)


_last_mask: dict[str, Any] = {}


def _block_mask(cu: Tensor, T: int, device: torch.device) -> Tensor:
    """(1, 1, T, T) bool: causal within each sequence of the row, nothing across them. Built
    once per micro-batch: every layer is handed the same `cu` object, and gets the same mask
    (held until the next micro-batch's replaces it, so that its additive form is made once
    too: models.shared_mask)."""
    source = _last_mask.get("cu")
    if source is not None and source() is cu:
        return _last_mask["mask"]
    _last_mask.clear()
    seq = torch.repeat_interleave(torch.arange(cu.numel() - 1, device=device),
                                  (cu[1:] - cu[:-1]).to(device).long(), output_size=T)  # (T,)
    pos = torch.arange(T, device=device)
    mask = ((seq[:, None] == seq[None, :]) & (pos[:, None] >= pos[None, :]))[None, None]
    _last_mask.update(cu=weakref.ref(cu), mask=mask)
    return mask


def _eager(module: Any, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scaling: float,
           dropout: float) -> Tensor:
    """Attention written out (the `eager` kernel), with a bool mask made additive."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    scores = torch.matmul(q, k.transpose(2, 3)) * scaling
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    weights = torch.nn.functional.dropout(weights, p=dropout, training=module.training)
    return torch.matmul(weights, v).transpose(1, 2)  # (B, T, h, D)


def ulysses_attention(module: Any, query: Tensor, key: Tensor, value: Tensor,
                      attention_mask: Tensor | None, dropout: float = 0.0,
                      scaling: float | None = None, **kwargs: Any) -> tuple[Tensor, None]:
    """The attention function a sequence-parallel model calls (transformers' interface):
    query / key / value (B, heads, T/size, D) of this rank's tokens; returns (B, T/size, H, D)."""
    sp, inner = _inner["group"], _inner["kernel"]
    q = seq_to_heads(query, sp)
    k = seq_to_heads(_replicate_kv(key, sp.size), sp)
    v = seq_to_heads(_replicate_kv(value, sp.size), sp)
    scaling = scaling if scaling is not None else q.shape[-1] ** -0.5
    cu = kwargs["cu_seq_lens_q"]
    shim = SimpleNamespace(config=SimpleNamespace(_attn_implementation=inner),
                           num_key_value_groups=q.shape[1] // k.shape[1], is_causal=True,
                           training=module.training, layer_idx=getattr(module, "layer_idx", None))
    if inner.startswith("flash_attention"):
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        boundaries = {name: kwargs[name] for name in ("cu_seq_lens_q", "cu_seq_lens_k",
                                                      "max_length_q", "max_length_k")}
        out, _ = ALL_ATTENTION_FUNCTIONS[inner](shim, q, k, v, None, dropout=dropout,
                                                scaling=scaling, **boundaries)
    else:
        mask = _block_mask(cu, q.shape[2], q.device)
        if inner == "sdpa":  # one additive mask for every layer (models.shared_mask)
            out, _ = shared_mask_sdpa(shim, q, k, v, mask, dropout=dropout, scaling=scaling)
        else:
            out = _eager(shim, q, k, v, mask, scaling, dropout)
    return heads_to_seq(out, sp), None


def enable(sp: SequenceGroup, kernel: str) -> str:
    """Register the Ulysses attention for `sp` around `kernel` (sdpa, eager or a flash
    implementation) and return the implementation name a model is loaded with."""
    from transformers import AttentionInterface

    _inner.update(group=sp, kernel=kernel)
    AttentionInterface.register(ULYSSES, ulysses_attention)
    return ULYSSES
