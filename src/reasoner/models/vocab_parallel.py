"""Vocabulary-parallel input embedding and lm-head over the data-parallel processes.

Under FSDP2 the lm-head (and the input embedding it is tied to) would sit in the root unit,
gathered whole on every process from the start of forward to the end of backward, with a whole
gradient until it is reduce-scattered: 2 x 4 bytes x vocab x hidden per process whatever the
number of processes (1.1 GiB for Qwen2.5-0.5B, 5.8 GiB for each of Qwen2.5-32B's two
matrices). Here each process keeps its own rows of the vocabulary (a `Shard(0)` DTensor that
FSDP2 ignores) and never gathers them: the activations travel instead, one process's tokens at
a time, as in Megatron's vocab-parallel embedding and cross-entropy.

- Embedding: the owner broadcasts its token ids, every process looks up the ids in its rows
  (zeros elsewhere), and the sum is reduced onto the owner. Backward: the owner broadcasts the
  gradient of its embeddings, every process adds the rows that are its own.
- Log-probs: the owner broadcasts its hidden states and targets; every process computes its
  part of the logits, chunk by chunk, and the max, the sum of exponentials and the target's
  logit are all-reduced. Backward recomputes the chunks: each process adds to its rows'
  gradient and the hidden-state gradient is reduced onto the owner.

The gradient each process holds for its rows is the sum over every process's tokens, as
FSDP2's reduce-scatter gives the sharded parameters (`fsdp.sum_only`). Every process must
call these functions the same number of times, in the same order, like FSDP2's own gathers.

How many tokens each owner broadcasts is every process's business: the trainers compute every
process's counts of a pass on the host (`packing.peer_sizes`) and hand them in with the batch's
layout (`known_sizes`, set by `PolicyLogprobs`); without them the counts are all-gathered and
read back from the device, a host sync in each forward (and impossible on fake tensors).
"""

from __future__ import annotations

import contextvars
import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import Tensor, nn

from reasoner.models import lm_head

_HEAD = "_reasoner_vocab_parallel"  # set on an lm-head module whose weight is vocab-parallel


def is_vocab_parallel(weight: Tensor) -> bool:
    """An lm-head weight that is this process's rows: a DTensor while the forward runs (an
    FSDP2-managed one would be gathered whole by then)."""
    from torch.distributed.tensor import DTensor

    return isinstance(weight, DTensor)


def parameters(module: nn.Module) -> list[nn.Parameter]:
    """The vocab-parallel parameters under `module`, each once (a tied weight is one). Found
    through their modules: parameter objects are replaced when the module is materialised."""
    found = {}
    for m in module.modules():
        if isinstance(m, VocabParallelEmbedding) or getattr(m, _HEAD, False):
            found[id(m.weight)] = m.weight
    return list(found.values())


def row_range(vocab: int, rank: int | None = None, world: int | None = None) -> tuple[int, int]:
    """Process `rank`'s rows [start, stop) of a `vocab`-row matrix (default: this process's):
    torch.chunk's split, as `Shard(0)` and FSDP2 (`sharded.fill_shards`) use."""
    rank = dist.get_rank() if rank is None else rank
    world = dist.get_world_size() if world is None else world
    size = math.ceil(vocab / world)
    start = min(rank * size, vocab)
    return start, min(start + size, vocab)


def _mine(ids: Tensor, start: int, rows: int) -> tuple[Tensor, Tensor]:
    """`ids` as row numbers of the local [start, start + rows) block, clamped into it, and
    which fall in it: rows are selected by the clamped numbers and the others' values zeroed,
    never by a mask (`x[mask]` reads the device back for the count)."""
    rel = ids - start
    return rel.clamp(0, rows - 1), (rel >= 0) & (rel < rows)


def shard_rows(weight: Tensor, mesh) -> nn.Parameter:
    """`weight` (V, H) as a Shard(0) DTensor parameter holding only this process's rows (no
    storage while `weight` is on the meta device; filled later, as FSDP2's shards are)."""
    from torch.distributed.tensor import DTensor, Shard

    vocab, world = weight.shape[0], dist.get_world_size()
    if math.ceil(vocab / world) * (world - 1) >= vocab:
        raise ValueError(f"a {vocab}-row vocabulary leaves some of {world} processes no rows")
    start, stop = row_range(vocab)
    local = weight.detach()[start:stop].clone()
    dt = DTensor.from_local(local, mesh, [Shard(0)], run_check=False, shape=weight.shape,
                            stride=weight.stride())
    return nn.Parameter(dt, requires_grad=weight.requires_grad)


class VocabParallelEmbedding(nn.Module):
    """nn.Embedding whose `weight` is this process's rows (see the module docstring)."""

    def __init__(self, weight: nn.Parameter, padding_idx: int | None):
        super().__init__()
        self.weight = weight
        self.padding_idx = padding_idx

    def forward(self, input_ids: Tensor) -> Tensor:
        local = self.weight.to_local()  # differentiable: its gradient becomes the DTensor's
        start, _ = row_range(self.weight.shape[0])
        out = _Embed.apply(input_ids.reshape(-1), local, start, self.padding_idx, (self.weight,))
        return out.view(*input_ids.shape, local.shape[1])


def shard_vocab(model: nn.Module, mesh) -> list[nn.Parameter]:
    """Make `model`'s input embedding and lm-head vocab-parallel (one parameter when tied);
    return the new parameters, for `fully_shard(..., ignored_params=...)`."""
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    if any(getattr(embed, k, None) for k in ("max_norm", "scale_grad_by_freq", "sparse")):
        raise NotImplementedError("vocab-parallel embedding: max_norm / scale_grad_by_freq / "
                                  "sparse embeddings are not supported")
    tied = head is not None and head.weight is embed.weight
    weight = shard_rows(embed.weight, mesh)
    model.set_input_embeddings(VocabParallelEmbedding(weight, embed.padding_idx))
    params = [weight]
    if head is not None:
        if tied:
            head.weight = weight
        else:
            if getattr(head, "bias", None) is not None:
                raise NotImplementedError("vocab-parallel lm-head: a bias is not supported")
            head.weight = shard_rows(head.weight, mesh)
            params.append(head.weight)
        setattr(head, _HEAD, True)
    return params


# every process's (input tokens, targets) of the pass now running, by rank; None: unknown
_KNOWN: contextvars.ContextVar[tuple[tuple[int, int], ...] | None] = contextvars.ContextVar(
    "vocab_parallel_sizes", default=None)
TOKENS, TARGETS = 0, 1  # which count of a process's pair: the embedding's, the lm-head's


@contextmanager
def known_sizes(peers: tuple[tuple[int, int], ...] | None) -> Iterator[None]:
    """Within: every process's (input tokens, targets), by rank, as the host knows them
    (`packing.Layout.peers`); None: read from the device."""
    token = _KNOWN.set(peers)
    try:
        yield
    finally:
        _KNOWN.reset(token)


def _sizes(n: int, device: torch.device, which: int) -> list[int]:
    """Every process's `n` (its count `which` of the pass): as the host knows them, else
    gathered and read back."""
    known = _KNOWN.get()
    if known is not None:
        if len(known) != dist.get_world_size() or known[dist.get_rank()][which] != n:
            raise RuntimeError(
                f"vocab-parallel: the batch's layout gives process {dist.get_rank()} "
                f"{known[dist.get_rank()][which] if len(known) > dist.get_rank() else '?'} "
                f"{('input tokens', 'targets')[which]} of {len(known)} processes' counts, but it "
                f"has {n} of {dist.get_world_size()}: the trainers' `packing.peer_sizes` and "
                "their collator disagree")
        return [p[which] for p in known]
    mine = torch.tensor([n], dtype=torch.int64, device=device)
    out = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(out, mine)
    return [int(t) for t in out]


def _from(owner: int, mine: Tensor, shape: tuple[int, ...], dtype, device) -> Tensor:
    """`mine` on its owner, broadcast to the others."""
    t = mine.contiguous() if dist.get_rank() == owner else torch.empty(shape, dtype=dtype,
                                                                       device=device)
    dist.broadcast(t, src=owner)
    return t


class _Embed(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ids: Tensor, local: Tensor, start: int, padding_idx: int | None,
                param: tuple) -> Tensor:
        me, sizes = dist.get_rank(), _sizes(ids.numel(), ids.device, TOKENS)
        all_ids, out = [], None
        for owner, n in enumerate(sizes):
            ids_r = _from(owner, ids, (n,), ids.dtype, ids.device)
            rel, hit = _mine(ids_r, start, local.shape[0])
            part = local.index_select(0, rel).masked_fill_(~hit[:, None], 0)
            dist.reduce(part, dst=owner)  # the sum has each id's row from the one that holds it
            if owner == me:
                out = part
            all_ids.append(ids_r)
        ctx.save_for_backward(*all_ids)
        ctx.start, ctx.padding_idx, ctx.shape, ctx.param = start, padding_idx, local.shape, param[0]
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        grad = _accumulator(ctx.param)
        for owner, ids_r in enumerate(ctx.saved_tensors):
            g = _from(owner, grad_out, (ids_r.numel(), ctx.shape[1]), grad_out.dtype,
                      grad_out.device)
            rel, hit = _mine(ids_r, ctx.start, ctx.shape[0])
            if ctx.padding_idx is not None:  # as nn.Embedding: no gradient for the pad row
                hit &= ids_r != ctx.padding_idx
            grad.index_add_(0, rel, torch.where(hit[:, None], g, 0).to(grad.dtype))
        return None, None, None, None, None  # added into the parameter's gradient itself


class _Logprobs(torch.autograd.Function):
    """`logprobs._ChunkedLogprobs` with the vocabulary split over the processes."""

    @staticmethod
    def forward(ctx, hidden: Tensor, local: Tensor, targets: Tensor, start: int,
                chunk_size: int, param: tuple) -> Tensor:
        acc = torch.promote_types(hidden.dtype, torch.float32)
        compute = lm_head.compute_dtype(hidden)
        me, sizes = dist.get_rank(), _sizes(hidden.shape[0], hidden.device, TARGETS)
        w = local.to(compute)
        all_targets, all_lse, out = [], [], None
        for owner, n in enumerate(sizes):
            h_r = _from(owner, hidden, (n, hidden.shape[1]), hidden.dtype, hidden.device)
            t_r = _from(owner, targets, (n,), targets.dtype, targets.device)
            lp = torch.empty(n, dtype=acc, device=hidden.device)
            lse = torch.empty(n, dtype=acc, device=hidden.device)
            for s in range(0, n, chunk_size):
                # (c, V / processes) in the compute dtype, as `logprobs._ChunkedLogprobs`;
                # fp32 for the reductions
                logits = lm_head.lowp_logits(h_r[s:s + chunk_size], w, acc)
                top = logits.amax(-1)
                dist.all_reduce(top, op=dist.ReduceOp.MAX)
                sumexp = (logits - top[:, None]).exp().sum(-1)
                rel, hit = _mine(t_r[s:s + chunk_size], start, w.shape[0])
                tgt = logits.gather(1, rel[:, None])[:, 0]
                tgt = torch.where(hit, tgt, 0.0)  # the target's logit, from its one holder
                both = torch.stack([sumexp, tgt])
                dist.all_reduce(both)
                lse[s:s + chunk_size] = top + both[0].log()
                lp[s:s + chunk_size] = both[1] - lse[s:s + chunk_size]
            if owner == me:
                out = lp
            all_targets.append(t_r)
            all_lse.append(lse)
        ctx.save_for_backward(hidden, local, *all_targets, *all_lse)
        ctx.start, ctx.chunk_size, ctx.sizes, ctx.compute = start, chunk_size, sizes, compute
        ctx.param = param[0]
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        hidden, local, *rest = ctx.saved_tensors
        world = len(ctx.sizes)
        acc = torch.promote_types(hidden.dtype, torch.float32)
        w, wc = local.to(acc), local.to(ctx.compute)
        grad_w = _accumulator(ctx.param) if ctx.needs_input_grad[1] else torch.zeros_like(w)
        with torch.autocast(hidden.device.type, enabled=False):
            grad_h = _backward_passes(ctx, hidden, grad_out, w, wc, grad_w, rest[:world],
                                      rest[world:])
        return grad_h, None, None, None, None, None  # the rows' gradient: added in place


def _backward_passes(ctx, hidden: Tensor, grad_out: Tensor, w: Tensor, wc: Tensor,
                     grad_w: Tensor, all_targets, all_lse) -> Tensor:
    """`_Logprobs.backward`, one pass per owner of tokens: adds to `grad_w` (fp32), returns this
    process's hidden-state gradient. The logits are recomputed as the forward computed them
    (`wc`: the compute dtype), so exp(logits - the forward's lse) is the softmax the forward's
    value implies; the products run in fp32 with the fp32 rows `w`."""
    acc, me, c, grad_h = w.dtype, dist.get_rank(), ctx.chunk_size, None
    for owner, n in enumerate(ctx.sizes):
        h_r = _from(owner, hidden, (n, hidden.shape[1]), hidden.dtype, hidden.device)
        g_r = _from(owner, grad_out, (n,), grad_out.dtype, grad_out.device)
        gh = torch.empty(n, hidden.shape[1], dtype=acc, device=hidden.device)
        for s in range(0, n, c):
            h, g = h_r[s:s + c], g_r[s:s + c, None].to(acc)
            # d log p_t / d logits = onehot(t) - softmax(logits), softmax from the global lse
            dlogits = lm_head.lowp_logits(h, wc, acc).sub_(
                all_lse[owner][s:s + c, None]).exp_().mul_(-g)
            rel, hit = _mine(all_targets[owner][s:s + c], ctx.start, w.shape[0])
            dlogits.scatter_add_(1, rel[:, None], torch.where(hit[:, None], g, 0))
            gh[s:s + c] = dlogits @ w
            grad_w += (dlogits.T @ h.to(acc)).to(grad_w.dtype)
        dist.reduce(gh, dst=owner)
        if owner == me:
            grad_h = gh.to(hidden.dtype)
    return grad_h


def token_logprobs(hidden: Tensor, weight: Tensor, targets: Tensor, chunk_size: int) -> Tensor:
    """`logprobs.token_logprobs` for a vocab-parallel `weight` (a Shard(0) DTensor). Every
    process must call it, even with no tokens of its own."""
    start, _ = row_range(weight.shape[0])
    return _Logprobs.apply(hidden, weight.to_local(), targets, start, chunk_size, (weight,))


def _accumulator(param: Tensor) -> Tensor:
    """This process's rows of `param`'s gradient (zeros when it has none yet), for backward to
    add into in place. Returned to autograd instead, the rows' gradient would exist twice while
    it accumulates over a step's micro-batches (the sum and the new term)."""
    from torch.distributed.tensor import DTensor

    if param.grad is None:
        local = param.to_local()
        param.grad = DTensor.from_local(torch.zeros_like(local), param.device_mesh,
                                        param.placements, run_check=False, shape=param.shape,
                                        stride=param.stride())
    return param.grad.to_local()
