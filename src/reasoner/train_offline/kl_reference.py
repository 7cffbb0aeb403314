"""The reference side of offline RL: the starting model's log-probs, the moving reference,
ProRL's resets and the held-out margin that can trigger them.

Reference log-probs come from the starting model, computed once into `ref_logprobs/` (JSONL
parts, one per process, merged into a memory-mapped Arrow file) and mapped again on reruns. A
second model stays resident only when the reference moves: ProRL's hard resets (reference <-
policy, optimiser state cleared; every N steps or when the validation margin stalls) or the
discounted objective's moving average ref <- a*pi + (1-a)*ref.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from reasoner import device as dev
from reasoner import shards
from reasoner.config import ObjectiveConfig
from reasoner.data import token_cache
from reasoner.device import Env
from reasoner.errors import TrainingError
from reasoner.models import lora
from reasoner.train_offline.rollouts import Batching, Rollouts


@torch.no_grad()
def score(policy: nn.Module, data: Rollouts, micro_batches: list[list[list[int]]],
          batching: Batching, env: Env, passes: int = 0) -> dict[int, list[float]]:
    """Log-prob of every response token of the samples in `micro_batches` (from
    `batching.micro_batches`) under `policy`, with no gradient: scored as training batches them,
    never more tokens at once than one training micro-batch (packed rows of seq_len; each
    process its slice of a row under sequence parallelism).

    `passes`: run at least this many forwards, the extra ones on a one-sample dummy whose result
    is dropped (a sharded policy's forward is a collective: every process must run as many)."""
    out: dict[int, list[float]] = {}
    for k in range(max(len(micro_batches), passes)):
        rows = micro_batches[k] if k < len(micro_batches) else []  # [] : a one-token dummy
        b = batching.collate(data, rows).to(env.device)
        with dev.autocast(env.device, env.dtype):
            logp = policy(b.input_ids, b.position_ids, b.attention_mask, b.labels).float().cpu()
        if k < len(micro_batches):
            index = [i for r in rows for i in r]
            for i, lp in zip(index, logp.split([data.resp_len(i) for i in index]), strict=True):
                out[i] = lp.tolist()
    if hasattr(policy, "reshard"):  # FSDP2 leaves the root gathered after a forward without
        policy.reshard()            # backward: shard it again (optimisers hold the shards)
    return out


def score_share(policy: nn.Module, data: Rollouts, samples: list[int], batching: Batching,
                env: Env) -> dict[int, list[float]]:
    """`score` of this process's data-parallel share of `samples` (token-balanced; every member
    of a sequence-parallel group scores the same share), each process running as many forwards
    as the busiest."""
    dist = env.dist
    mbs = batching.micro_batches(batching.share(samples, data, dist), data)
    passes = int(dev.all_reduce([len(mbs)], dist, env.device, "max")[0])
    return score(policy, data, mbs, batching, env, passes)


class Reordered(Sequence):
    """`column` read in another order: item i is column[rows[i]] (a view, no copy)."""

    def __init__(self, column: Sequence[list[float]], rows: list[int]):
        self.column, self.rows = column, rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i):  # type: ignore[override]
        return self.column[self.rows[i]]


def _arrow_schema():
    import pyarrow as pa

    return pa.schema([("id", pa.string()), ("sample_idx", pa.int32()),
                      ("logprobs", pa.list_(pa.float32()))])


def _mapped(path: Path, keys: list[tuple[str, int]]) -> Reordered | None:
    """The Arrow file's log-probs in the order of `keys`, or None if it lacks one of them."""
    if not path.exists():
        return None
    table = token_cache.open_table(path)
    row_of = {k: r for r, k in enumerate(zip(table.column("id").to_pylist(),
                                             table.column("sample_idx").to_pylist(), strict=True))}
    if not all(k in row_of for k in keys):
        return None
    return Reordered(token_cache.ListColumn(table, "logprobs"), [row_of[k] for k in keys])


def starting_logprobs(folder: Path, source: str, policy: nn.Module, data: Rollouts,
                      batching: Batching, env: Env) -> Sequence[list[float]]:
    """The starting model's log-probs of every response token, cached in `folder`.

    Each data-parallel group scores its share of the samples and its first process writes them
    as its own part of the folder (rank 0 owns the manifest). Rank 0 then streams the parts into
    one Arrow file, `logprobs.arrow`, that every process memory-maps: no process holds them as
    Python lists (at 30K samples of 30K tokens they would be ~10^9 objects)."""
    dist = env.dist
    arrow = folder / "logprobs.arrow"
    if shards.is_complete(folder):
        cached = _mapped(arrow, data.keys)
        if cached is not None:
            return cached
    out = score_share(policy, data, list(range(len(data.ids))), batching, env)
    if dist.is_main:
        shards.reset(folder, "train-offline reference log-probs", {"input": source})
        arrow.unlink(missing_ok=True)
    dev.barrier(dist)
    if dist.sp_rank == 0:
        shards.write_rows(folder, ({"id": data.keys[i][0], "sample_idx": data.keys[i][1],
                                    "logprobs": lp} for i, lp in sorted(out.items())),
                          part=dist.dp_rank)
    del out
    dev.barrier(dist)
    if dist.is_main:
        token_cache.write_rows(arrow, _arrow_schema(), shards.iter_rows(folder))
        shards.finish(folder, {"samples": len(data.ids)})
    dev.barrier(dist)
    cached = _mapped(arrow, data.keys)
    if cached is None:
        raise TrainingError(f"{folder}: reference log-probs are missing samples after scoring")
    return cached


def split_validation(data: Rollouts, obj: ObjectiveConfig, seed: int
                     ) -> tuple[list[int], list[int]]:
    """Train and held-out sample indices: whole groups held out when the objective watches a
    validation margin (ProRL's reset_patience)."""
    everything = list(range(len(data.ids)))
    if not obj.holds_out_groups:
        return everything, []
    groups = sorted(set(data.groups.tolist()))
    rng = random.Random(seed)
    held = set(rng.sample(groups, max(1, round(obj.val_fraction * len(groups)))))
    if len(held) == len(groups):
        raise TrainingError("reset_patience needs more groups than the validation share holds out")
    val = [i for i in everything if int(data.groups[i]) in held]
    return [i for i in everything if int(data.groups[i]) not in held], val


class Plateau:
    """ProRL's validation-triggered reset: True once the margin has not improved (by more than
    `min_delta`) for `patience` checks in a row."""

    def __init__(self, patience: int, min_delta: float = 1e-4):
        self.patience, self.min_delta = patience, min_delta
        self.best, self.bad, self.resets = -math.inf, 0, 0

    def update(self, value: float) -> bool:
        if value > self.best + self.min_delta:
            self.best, self.bad = value, 0
            return False
        self.bad += 1
        if self.bad < self.patience:
            return False
        self.best, self.bad, self.resets = -math.inf, 0, self.resets + 1  # re-baseline after it
        return True


def validation_margin(policy: nn.Module, data: Rollouts, samples: list[int],
                      batching: Batching, env: Env) -> float:
    """Held-out positives' mean geometric-mean probability minus the negatives' (every process
    scores all of them: the same forwards everywhere)."""
    scored = score(policy, data, batching.micro_batches(samples, data), batching, env)
    gm = torch.tensor([math.exp(sum(scored[i]) / max(len(scored[i]), 1)) for i in samples])
    r = data.rewards[samples]
    pos, neg = gm[r > 0], gm[r <= 0]
    return float((pos.mean() if len(pos) else 0.0) - (neg.mean() if len(neg) else 0.0))


def move_reference(obj: ObjectiveConfig, step: int, policy: nn.Module, ref: nn.Module | None,
                   optimizer: torch.optim.Optimizer) -> None:
    """ProRL's periodic hard reset, or the discounted objective's moving reference."""
    if obj.resets_at(step):
        reset(policy, ref, optimizer)
    if ref is not None and obj.averages_at(step):
        average_into(ref, policy, obj.ref_alpha)


@torch.no_grad()
def average_into(ref: nn.Module, policy: nn.Module, alpha: float) -> None:
    """ref <- alpha * policy + (1 - alpha) * ref, once per parameter.

    Over named_parameters, not the state dict: a state dict lists a tied weight (lm_head and
    embed_tokens) under both names, and updating it twice would apply alpha twice. Reference
    and policy are sharded alike, so each process updates its own shards (no gather).
    """
    for p, q in _pairs(ref, policy):
        p.mul_(1 - alpha).add_(q.detach(), alpha=alpha)


@torch.no_grad()
def reset(policy: nn.Module, ref: nn.Module | None, optimizer: torch.optim.Optimizer) -> None:
    """ProRL's hard reset: reference <- current policy, optimiser state cleared. Parameter by
    parameter: sharded alike, each process copies its own shards."""
    if ref is not None:
        for r, q in _pairs(ref, policy):
            r.copy_(q)
    optimizer.state.clear()


def _pairs(ref: nn.Module, policy: nn.Module) -> list[tuple[nn.Parameter, nn.Parameter]]:
    """(reference parameter, policy parameter) pairs, shard with shard: every parameter of a
    second model, or a LoRA reference's adapter set against the trained set (the base is
    shared; the average is of the adapter factors A and B, each on its own)."""
    _resharded(ref, policy)
    if isinstance(ref, lora.AdapterView):
        return ref.pairs()
    pairs = []
    for (name, p), (other, q) in zip(ref.named_parameters(), policy.named_parameters(),
                                     strict=True):
        assert name == other, (name, other)
        pairs.append((p, q))
    return pairs


def _resharded(*modules: nn.Module) -> None:
    """FSDP2 keeps a root gathered after a forward without backward (the reference's): shard
    it again so that parameters pair up shard with shard."""
    for m in modules:
        if hasattr(m, "reshard"):
            m.reshard()
