"""The micro-batch a rehearsal (pipeline/rehearsal.py) runs through the trainers' own step:
rows of the recipe's longest samples as the collators read them, sft's `step_loss` or
train-offline's `MicroStep` over them, and OREAL's token RM beside the policy as
`token_rm.load_token_rm` builds it, its own memory counted apart."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from reasoner.config import OfflineConfig, TrainerConfig

MICRO_BATCHES = 2  # micro-batches in each rehearsed optimiser step
PROMPT = 512  # prompt tokens of a rehearsed sample (the rest of its row is response)


@dataclass
class _Rows:
    """Rehearsed samples as both trainers' collators read them (packing.TokenRows): `count`
    samples of `tokens` tokens, the first PROMPT of each a prompt."""

    count: int
    tokens: int

    def __post_init__(self) -> None:  # one row shared by every sample: the collators only read
        row = [1] * self.tokens
        self.ids = [row] * self.count

    def loss_mask(self, i: int) -> list[bool]:
        return [False] * PROMPT + [True] * (self.tokens - PROMPT)


def micro_step(name: str, cfg: TrainerConfig, env: Any, state: Any, row: int,
               ref: Any = None, token_rm: Any = None) -> Any:
    """A function of the loss scale running the stage's own forward + backward of one
    micro-batch (`run.micro_batch` rows, each one sample of `row` tokens; positive and negative
    samples alternately for train-offline), as `training.accumulate` calls it (the scale over
    the sequence-parallel group's size)."""
    from reasoner import sft, training
    from reasoner.data import packing

    varlen = env.dist.sp_size > 1 or state.model.config._attn_implementation.startswith("flash")
    share, per = 1.0 / env.dist.sp_size, cfg.run.micro_batch
    rows = _Rows(MICRO_BATCHES * per, row)

    def peers(layout: Any) -> Any:  # every process's counts, as the trainers hand them in
        return packing.peer_sizes([layout] * env.dist.dp_size, env.dist.sp_size) \
            if training.exchanges_counts(state) else None

    if not isinstance(cfg, OfflineConfig):
        denom = float(rows.count * (row - PROMPT))
        b = sft.collate(rows, [[k] for k in range(per)], cfg, 0, varlen)
        b.layout = b.layout.with_peers(peers(b.layout))  # every pass's batch alike
        return lambda scale: sft.step_loss(state.policy, b, denom, scale * share, env.device,
                                           env.dtype)
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    from reasoner import train_offline
    from reasoner.train_offline import objectives
    from reasoner.train_offline.rollouts import Batching

    obj = cfg.objective
    with unset_fake_temporarily():  # host data, read on the host as the trainer reads it
        data = _rollouts(rows)
        per_token = [[0.0] * (row - PROMPT) for _ in range(rows.count)]
        inputs = train_offline.PerSample(
            objectives.sample_signal(obj, data), objectives.token_scope(obj, data),
            per_token if obj.reads_behaviour or obj.needs_old_logprobs else None,
            per_token if obj.needs_reference else None, "rehearsed", {})
        micro = train_offline.MicroStep(obj, data, inputs,
                                        Batching.of(cfg, 0, varlen), env, ref, token_rm)
    counts = objectives.GlobalCounts(samples=rows.count, tokens=rows.count * (row - PROMPT),
                                     pos_tokens=(rows.count + 1) // 2 * (row - PROMPT))
    calls = iter(range(10**9))
    # every pass's rows the same lengths: one layout for all
    each = peers(micro.batching.layout_of(data, [[k] for k in range(per)]))
    return lambda scale: micro(state.policy, [[next(calls) % rows.count] for _ in range(per)],
                               counts, scale * share, each)


def _rollouts(rows: _Rows) -> Any:
    """`rows` as a verified rollout set of one group: a positive sample and a negative."""
    import torch

    from reasoner.train_offline.rollouts import Rollouts

    n = rows.count
    rewards = torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(n)])
    return Rollouts([("rehearsal", i) for i in range(n)], rows.ids, [PROMPT] * n, rewards,
                    torch.zeros(n, dtype=torch.long), torch.full((n,), 0.5),
                    torch.full((n,), float(rows.tokens - PROMPT)), torch.ones(n, dtype=torch.bool),
                    None, 0)


class ApartRM:
    """OREAL's token RM (`token_rm.TokenRM`) as `MicroStep` trains it, the memory tracker
    paused while it does: its pass comes before the policy's in every micro-batch and leaves
    only its gradient shards behind, and its optimiser steps after the policy's. What it holds
    through the policy's peak (its weight and gradient shards, its AdamW state) is the plan's
    `reference / token RM` line: `held`."""

    def __init__(self, rm: Any, tracker: Any):
        self.rm, self.tracker = rm, tracker
        self.model = rm.model

    def _paused(self, run: Any) -> Any:
        was, self.tracker.paused = self.tracker.paused, True
        try:
            return run()
        finally:
            self.tracker.paused = was

    def train_pass(self, *args: Any) -> Any:
        return self._paused(lambda: self.rm.train_pass(*args))

    def step(self, at: int = 0) -> None:
        self._paused(lambda: self.rm.step(at))

    def held(self) -> float:
        """Bytes of its weight shards, a gradient shard for each trained one, its AdamW state."""
        import torch

        from reasoner.pipeline.rehearsal_tracking import held

        def local(t: Any) -> Any:
            return t.to_local() if hasattr(t, "to_local") else t

        grads = sum(local(p).numel() * 4 for p in self.model.parameters() if p.requires_grad)
        states = {id(st): st.nbytes() for per in self.rm.optimizer.state.values()
                  for v in per.values() if isinstance(v, torch.Tensor)
                  for st in [local(v).untyped_storage()]}
        return held(self.model) + grads + sum(states.values())
