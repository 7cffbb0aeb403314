"""Sequence packing: best-fit-decreasing bins, and the tensors that keep packed samples apart.

A packed row holds several samples back to back. Each keeps its own positions (position ids
restart at 0) and attends only to itself. The restarting position ids are all the model needs:
a varlen kernel (flash-attention, Ascend's fused attention) finds the samples from them in one
flat row, and transformers derives the block-diagonal causal mask from them for sdpa and eager
(`models.attention`). No mask is built here.

Where each micro-batch's targets and sequences lie is known here, on the host, before any
forward (`Layout`): the training step selects and bounds by it instead of reading the tensors
back from the device (a host sync each time, and impossible on fake tensors: issue 52).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol, TypeVar

import numpy as np
import torch
from torch import Tensor

IGNORE = -100  # label of tokens outside the loss
T = TypeVar("T")


def pack(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Best-fit-decreasing bins of sample indices; no bin over `capacity` (docs/design.md).

    Longest sample first, each into the fullest bin it still fits. O(n log n) with a sorted
    list of free space. A sample longer than `capacity` is an error (drop it before packing).
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    free: list[tuple[int, int]] = []  # sorted (free space, bin index)
    for i in order:
        n = lengths[i]
        if n > capacity:
            raise ValueError(f"sample {i} has {n} tokens, more than the bin capacity {capacity}")
        pos = bisect.bisect_left(free, (n, -1))
        if pos < len(free):
            space, b = free.pop(pos)
        else:
            space, b = capacity, len(bins)
            bins.append([])
        bins[b].append(i)
        bisect.insort(free, (space - n, b))
    return bins


def balanced_shares(items: Sequence[int], lengths: Sequence[int], groups: int
                    ) -> list[list[int]]:
    """`items` split into `groups` shares of nearly equal tokens (`lengths[i]` each): longest
    first, each into the share with the fewest tokens so far (ties: the lowest share index), so
    that the slowest process of a step waits as little as can be for the others. Each share
    keeps the order `items` gave it. Deterministic: every process computes the same shares."""
    if groups == 1:
        return [list(items)]
    load = [0] * groups
    owner: dict[int, int] = {}
    for pos in sorted(range(len(items)), key=lambda p: (-lengths[items[p]], p)):
        g = min(range(groups), key=lambda k: (load[k], k))
        owner[pos] = g
        load[g] += lengths[items[pos]]
    return [[items[p] for p in range(len(items)) if owner[p] == g] for g in range(groups)]


def dummy_batch(pad_id: int) -> Batch:
    """One pad token with no target: the pass a process with fewer micro-batches than the
    busiest runs, so that every process makes the same collectives, at almost no cost."""
    one = torch.full((1, 1), pad_id, dtype=torch.long)
    return Batch(one, torch.full((1, 1), IGNORE, dtype=torch.long), torch.zeros((1, 1),
                 dtype=torch.long), None, torch.full((1, 1), -1, dtype=torch.long), 0, 0,
                 DUMMY)


def efficiency(lengths: Sequence[int], bins: list[list[int]], capacity: int) -> float:
    """Real tokens / token slots."""
    return sum(lengths) / (len(bins) * capacity) if bins else 0.0


@dataclass(frozen=True, eq=False)
class Layout:
    """Where a micro-batch's targets and sequences lie, as the collator placed them: host data
    (numpy, Python ints), so that selecting the targets and bounding the sequences never reads
    the tensors back from the device."""

    targets: np.ndarray  # (N,) int64: flat positions (row-major over (B, T)) with a target
    seq_lens: tuple[int, ...] = ()  # the rows' sequences back to back, padding one of them
    # (what a varlen kernel needs of one flat row); () for padded rows (they have a mask)
    tokens: int = 0  # B x T, the input tokens (0: not said)
    # every process's (input tokens, targets) of this micro-batch's pass, by rank, as the
    # vocabulary-parallel embedding and lm-head exchange them (`peer_sizes`); None: not known
    peers: tuple[tuple[int, int], ...] | None = None

    def index(self, device: torch.device) -> Tensor:
        """The targets' positions as a tensor on `device` (N,): a copy to it, no read back."""
        return torch.from_numpy(self.targets).to(device, non_blocking=True)

    def cu_seq_lens(self, device: torch.device) -> Tensor:
        """Where each sequence starts, and the end (k+1,) int32, on `device`."""
        cu = np.cumsum((0, *self.seq_lens), dtype=np.int32)
        return torch.from_numpy(cu).to(device, non_blocking=True)

    @property
    def longest(self) -> int:
        return max(self.seq_lens, default=0)

    def padded(self, extra: int) -> Layout:
        """The layout of the rows with `extra` pad tokens after them (a sequence of its own)."""
        return Layout(self.targets, self.seq_lens + ((extra,) if extra else ()),
                      self.tokens + extra, self.peers)

    def slices(self, size: int) -> list[tuple[int, int]]:
        """(input tokens, targets) of each of the `size` equal, contiguous slices of the rows
        as one flat row padded to a multiple of `size` (what `sequence_parallel.split` gives
        each process of a group; `size` 1: the whole)."""
        width = -(-self.tokens // size)
        held = np.bincount(self.targets // width, minlength=size) if width else [0] * size
        return [(width, int(n)) for n in held]

    def with_peers(self, peers: Sequence[tuple[int, int]] | None) -> Layout:
        return replace(self, peers=None if peers is None else tuple(peers))

    @classmethod
    def of(cls, labels: Tensor, position_ids: Tensor | None = None) -> Layout:
        """Found from the tensors themselves (a caller that hands tensors without a batch's
        layout): one read of them on the host. `position_ids` (one flat row, its position ids
        restarting at 0 for each sequence) give the sequences; None: none are found."""
        keep = labels.reshape(-1) >= 0
        if position_ids is None:
            return cls(np.flatnonzero(keep.tolist()).astype(np.int64), (), labels.numel())
        keep, first = np.array(torch.stack([keep, position_ids.reshape(-1) == 0]).tolist())
        starts = np.flatnonzero(first)
        if not len(starts) or starts[0] != 0:
            starts = np.concatenate([[0], starts])
        lengths = np.diff(np.append(starts, len(first)))
        return cls(np.flatnonzero(keep).astype(np.int64), tuple(int(n) for n in lengths),
                   labels.numel())


DUMMY = Layout(np.zeros(0, dtype=np.int64), (1,), 1)  # the dummy pass's one pad token


def peer_sizes(layouts: Sequence[Layout], sp_size: int = 1) -> tuple[tuple[int, int], ...]:
    """Every process's (input tokens, targets) of a pass, by rank, from the layouts of every
    data-parallel group's micro-batch of that pass (`layouts[g]`, its group's rows; a group of
    `sp_size` consecutive ranks splits them, `Layout.slices`): what each process computes on
    the host for all, instead of gathering the counts from the device every pass."""
    return tuple(part for lay in layouts for part in lay.slices(sp_size))


def pass_peers(every: Sequence[Sequence[T]], layout_of: Callable[[T], Layout], sp_size: int
               ) -> list[tuple[tuple[int, int], ...]]:
    """`peer_sizes` of each pass of a step, from every data-parallel group's micro-batches
    (`every[g]`, each laid out by `layout_of`); a group past its own runs the dummy pass."""
    return [peer_sizes([layout_of(g[j]) if j < len(g) else DUMMY for g in every], sp_size)
            for j in range(max(map(len, every), default=0))]


@dataclass
class Batch:
    """One micro-batch in model-ready tensors (all (B, T) unless said)."""

    input_ids: torch.Tensor
    labels: torch.Tensor  # next-token targets already shifted; IGNORE outside the loss
    position_ids: torch.Tensor
    attention_mask: torch.Tensor | None  # (B, T) padding; None when packed (position ids)
    sample_index: torch.Tensor  # (B, T) which sample of the micro-batch each token is, -1 = none
    num_samples: int
    real_tokens: int
    layout: Layout  # where its targets and sequences lie (host data: stays on the host)

    def to(self, device: torch.device) -> Batch:
        move = lambda t: None if t is None else t.to(device, non_blocking=True)  # noqa: E731
        return Batch(move(self.input_ids), move(self.labels), move(self.position_ids),
                     move(self.attention_mask), move(self.sample_index), self.num_samples,
                     self.real_tokens, self.layout)


def _shifted_labels(ids: list[int], loss_mask: list[bool]) -> list[int]:
    """labels[t] = ids[t+1] where token t+1 is in the loss, else IGNORE; the last is IGNORE."""
    return [ids[t + 1] if loss_mask[t + 1] else IGNORE for t in range(len(ids) - 1)] + [IGNORE]


def collate_packed(rows: list[list[tuple[list[int], list[bool]]]], seq_len: int, pad_id: int,
                   flat: bool = False) -> Batch:
    """Rows of samples (token ids, loss mask) into packed tensors of width `seq_len`, with no
    attention mask: the position ids restart at each sample, and the padding after the last
    one is a sequence of its own (it continues from 0), so it attends only to itself.

    `flat=True` gives one row of B x seq_len tokens (what a varlen kernel takes).
    """
    B = len(rows)
    input_ids = torch.full((B, seq_len), pad_id, dtype=torch.long)
    labels = torch.full((B, seq_len), IGNORE, dtype=torch.long)
    position_ids = torch.zeros((B, seq_len), dtype=torch.long)
    segment = torch.full((B, seq_len), -1, dtype=torch.long)
    k = 0
    for r, samples in enumerate(rows):
        start = 0
        for ids, loss_mask in samples:
            n = len(ids)
            end = start + n
            input_ids[r, start:end] = torch.tensor(ids)
            labels[r, start:end] = torch.tensor(_shifted_labels(ids, loss_mask))
            position_ids[r, start:end] = torch.arange(n)
            segment[r, start:end] = k
            start, k = end, k + 1
        position_ids[r, start:] = torch.arange(seq_len - start)
    if flat:
        input_ids, labels, position_ids, segment = (
            t.reshape(1, -1) for t in (input_ids, labels, position_ids, segment))
    real = sum(len(ids) for samples in rows for ids, _ in samples)
    return Batch(input_ids, labels, position_ids, None, segment, k, real,
                 _packed_layout([[(len(ids), m) for ids, m in row] for row in rows], seq_len))


def _kept(loss_mask: Sequence[bool], n: int) -> np.ndarray:
    """The positions t < n of a sample with a target (`_shifted_labels`: token t + 1 scored)."""
    return np.flatnonzero(np.asarray(loss_mask[1:n], dtype=bool))


def _packed_layout(rows: list[list[tuple[int, Sequence[bool]]]], seq_len: int) -> Layout:
    """`collate_packed`'s layout from each sample's (length, loss mask), on the host."""
    targets: list[np.ndarray] = []
    seq_lens: list[int] = []
    for r, samples in enumerate(rows):
        start = 0
        for n, loss_mask in samples:
            targets.append(r * seq_len + start + _kept(loss_mask, n))
            seq_lens.append(n)
            start += n
        seq_lens += [seq_len - start] if start < seq_len else []
    return Layout(np.concatenate(targets).astype(np.int64) if targets
                  else np.zeros(0, dtype=np.int64), tuple(seq_lens), len(rows) * seq_len)


def _padded_layout(samples: list[tuple[int, Sequence[bool]]]) -> Layout:
    """`collate_padded`'s layout from each sample's (length, loss mask), on the host."""
    T = max(n for n, _ in samples)
    return Layout(np.concatenate([r * T + _kept(m, n) for r, (n, m) in enumerate(samples)])
                  .astype(np.int64), (), len(samples) * T)


def collate_padded(samples: list[tuple[list[int], list[bool]]], pad_id: int) -> Batch:
    """One sample per row, right-padded to the longest in the micro-batch."""
    B, T = len(samples), max(len(ids) for ids, _ in samples)
    input_ids = torch.full((B, T), pad_id, dtype=torch.long)
    labels = torch.full((B, T), IGNORE, dtype=torch.long)
    attention = torch.zeros((B, T), dtype=torch.long)
    segment = torch.full((B, T), -1, dtype=torch.long)
    for r, (ids, loss_mask) in enumerate(samples):
        n = len(ids)
        input_ids[r, :n] = torch.tensor(ids)
        labels[r, :n] = torch.tensor(_shifted_labels(ids, loss_mask))
        attention[r, :n] = 1
        segment[r, :n] = r
    position_ids = (attention.cumsum(-1) - 1).clamp(min=0)
    real = sum(len(ids) for ids, _ in samples)
    return Batch(input_ids, labels, position_ids, attention, segment, B, real,
                 _padded_layout([(len(ids), m) for ids, m in samples]))


class TokenRows(Protocol):
    """Tokenized samples as both trainers hold them (sft.Tokenized, rl.rollouts.Rollouts):
    `ids[i]` a sample's token ids, `loss_mask(i)` True on the tokens it is scored on."""

    ids: Sequence[list[int]]

    def loss_mask(self, i: int) -> list[bool]: ...


def _width(lengths: list[list[int]], width: int | None) -> int:
    """How wide `collate` packs rows of samples of these lengths: `width`, else the longest row
    (the one choice `collate` and `layout_of` share)."""
    return width or max(sum(row) for row in lengths)


def collate(data: TokenRows, rows: list[list[int]], packed: bool, width: int | None, pad_id: int,
            flat: bool = False) -> Batch:
    """A micro-batch's rows of sample indices as tensors: packed rows `width` tokens wide (None:
    as wide as the longest; `flat`: one row for a varlen kernel), or one sample per row, padded
    (`packed` False: each row holds one sample). No rows: the dummy pass (`dummy_batch`)."""
    if not rows:
        return dummy_batch(pad_id)
    if packed:
        samples = [[(data.ids[i], data.loss_mask(i)) for i in row] for row in rows]
        return collate_packed(samples, _width([[len(ids) for ids, _ in row] for row in samples],
                                              width), pad_id, flat=flat)
    return collate_padded([(data.ids[r[0]], data.loss_mask(r[0])) for r in rows], pad_id)


def layout_of(data: TokenRows, rows: list[list[int]], packed: bool, width: int | None) -> Layout:
    """The layout `collate` gives these rows, found on the host without building the tensors
    (another process's micro-batch: `peer_sizes`)."""
    if not rows:
        return DUMMY
    lengths = [[len(data.ids[i]) for i in row] for row in rows]
    if packed:
        return _packed_layout([[(n, data.loss_mask(i)) for n, i in zip(ns, row, strict=True)]
                               for ns, row in zip(lengths, rows, strict=True)],
                              _width(lengths, width))
    return _padded_layout([(ns[0], data.loss_mask(row[0])) for ns, row in zip(lengths, rows,
                                                                          strict=True)])
