"""OREAL's token-level reward model and the token weights it gives (Lyu et al. 2025).

A copy of the starting policy with a scalar head scores every response token; trained with BCE of
sigmoid(mean token score) against correctness (`losses.token_rm_loss`), it learns which tokens
decide the outcome. It trains beside the policy on the policy's own micro-batches, with its own
AdamW, and may first train alone for a few steps (`warm_up`, OREAL's frozen actor).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from reasoner import device as dev
from reasoner import training
from reasoner.config import OfflineConfig
from reasoner.data import packing
from reasoner.device import Env
from reasoner.models import sequence_parallel
from reasoner.models.sequence_parallel import SequenceGroup
from reasoner.models.vocab_layout import VocabSplit
from reasoner.runlog import progress_bar
from reasoner.train_offline import losses
from reasoner.train_offline.objectives import GlobalCounts
from reasoner.train_offline.rollouts import Batching, Rollouts


class TokenRewardModel(nn.Module):
    """OREAL's token-level reward model: the policy's trunk with a scalar head.

    Token weights come from p_t = sigmoid(running mean of scores up to t): positives
    w+ = clip(2 p_t - 1, 0, 1), negatives w- = clip(1 - 2 p_t, 0, 1).
    """

    def __init__(self, model: nn.Module, sp: SequenceGroup | None = None):
        super().__init__()
        self.model = model
        self.sp = sp or SequenceGroup()  # sequence parallel: each process scores its slice
        self.head = nn.Linear(self.model.config.hidden_size, 1)
        self.reset_head()
        lm_head, embed = self.model.get_output_embeddings(), self.model.get_input_embeddings()
        if lm_head is not None and lm_head.weight is not embed.weight:
            # scores come from the trunk: an untied LM head gets no gradient, hence no optimiser
            # state to checkpoint, and a fresh optimiser's template would ask for some on resume
            lm_head.requires_grad_(False)

    @torch.no_grad()
    def reset_head(self) -> None:
        self.head.weight.zero_()
        self.head.bias.zero_()

    def forward(self, batch: packing.Batch) -> Tensor:
        """A score per target token (N,), in the policy's order (the whole micro-batch's on
        every process of a sequence-parallel group); a vocab-parallel embedding takes every
        process's counts from the batch's layout, as the policy's does."""
        from reasoner.models import vocab_parallel

        with vocab_parallel.known_sizes(batch.layout.peers):
            return self._forward(batch)

    def _forward(self, batch: packing.Batch) -> Tensor:
        if not self.sp.on:
            return self._scores(batch.input_ids, batch.position_ids, batch.attention_mask,
                                batch.layout.index(batch.input_ids.device), {})
        part = sequence_parallel.split(batch.input_ids, batch.position_ids, batch.labels, self.sp,
                                       batch.layout)
        local = self._scores(part.input_ids, part.position_ids, None, part.local,
                             part.attn_kwargs)  # (n,)
        return sequence_parallel.gather(local, part, self.sp)

    def _scores(self, input_ids: Tensor, position_ids: Tensor, attention_mask: Tensor | None,
                targets: Tensor, attn_kwargs: dict) -> Tensor:
        """Scores (n,) at the flat positions `targets` (n,) of the (B, T) rows."""
        out = self.model.model(input_ids=input_ids, position_ids=position_ids,
                               attention_mask=attention_mask, use_cache=False, **attn_kwargs)
        hidden = out.last_hidden_state  # (B, T, H)
        h = hidden.reshape(-1, hidden.shape[-1]).index_select(0, targets)  # (n, H)
        return self.head(h).squeeze(-1).float()  # (n,)


def running_mean(x: Tensor, sample_index: Tensor) -> Tensor:
    """Mean of each token's value and the earlier tokens of its sample, (N,) (tokens contiguous)."""
    csum = x.cumsum(0)
    start = torch.ones_like(sample_index, dtype=torch.bool)
    start[1:] = sample_index[1:] != sample_index[:-1]
    pos = torch.arange(x.numel(), device=x.device)
    first = torch.cummax(torch.where(start, pos, torch.zeros_like(pos)), 0).values
    before = torch.where(first > 0, csum[(first - 1).clamp(min=0)], torch.zeros_like(csum))
    return (csum - before) / (pos - first + 1)


def token_weights(scores: Tensor, sample_index: Tensor, rewards: Tensor) -> Tensor:
    """OREAL's token weights (N,) from the RM's scores (no gradient flows back to the RM)."""
    p = torch.sigmoid(running_mean(scores.detach(), sample_index))  # (N,)
    positive = rewards[sample_index] > 0
    return torch.where(positive, (2 * p - 1).clamp(0, 1), (1 - 2 * p).clamp(0, 1))


@dataclass
class TokenRM:
    """The token RM in training: the model (sharded like the policy with several processes), its
    optimiser, and where it computes."""

    model: TokenRewardModel
    optimizer: torch.optim.Optimizer
    env: Env
    lr: float = 1e-5  # objective.rm_lr
    min_lr: float | None = None  # objective.rm_min_lr: cosine to it over `steps`, else constant
    steps: int = 0  # the RM's optimiser steps in the whole run: warm-up + policy steps

    def train_pass(self, batch: packing.Batch, sample_index: Tensor, rewards: Tensor,
                   counts: GlobalCounts, scale: float) -> tuple[Tensor, Tensor]:
        """Scores (N,) of one micro-batch and its share of the RM's loss, backward; returns the
        scores and the micro-batch's mean BCE. The RM has its own optimiser and no loss scaler:
        only a dummy pass's zero `scale` applies. The BCE stays on the device (0-dim): the
        step reads its metrics once (training.accumulate)."""
        with dev.autocast(self.env.device, self.env.dtype):
            scores = self.model(batch)  # (N,)
        loss, metrics = losses.token_rm_loss(scores, sample_index, rewards, counts.samples)
        # every member of a sequence-parallel group computes the whole loss: 1/size each
        (loss * (float(scale > 0) / self.env.dist.sp_size)).backward()
        return scores, metrics["rm_bce"]

    def step(self, at: int = 0) -> None:
        """The RM's optimiser step number `at` (counted from its first warm-up step), at the
        learning rate its schedule gives that step."""
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr_at(at)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def lr_at(self, at: int) -> float:
        """rm_lr, or its cosine decay to rm_min_lr over `self.steps` steps."""
        if self.min_lr is None or self.steps <= 1:
            return self.lr
        progress = min(1.0, at / (self.steps - 1))
        return self.min_lr + (self.lr - self.min_lr) * 0.5 * (1 + math.cos(math.pi * progress))


def load_token_rm(cfg: OfflineConfig, env: Env, attn: str, vocab: VocabSplit,
                  policy_steps: int = 0) -> TokenRM:
    """OREAL's token RM: the starting policy's weights with a zero head, loaded (and with several
    processes sharded) by the policy's own loader; recomputes activations when the policy does
    (it trains on the policy's batches: as long, as wide)."""
    sp = SequenceGroup.of(env.dist)
    loaded = training.load_wrapped(cfg.model, cfg.model.name_or_path, env,
                                   lambda m: TokenRewardModel(m, sp), attn, vocab,
                                   skip=("head.",))
    return ready(loaded.policy, cfg, env, policy_steps)


def ready(rm: TokenRewardModel, cfg: OfflineConfig, env: Env, policy_steps: int = 0) -> TokenRM:
    """A loaded (or, in a rehearsal, built) token RM made ready to train: a zero head,
    recomputed activations when the policy recomputes, its own AdamW and schedule."""
    rm.reset_head()  # sharded loading leaves the head's storage unfilled
    if cfg.run.gradient_checkpointing:
        rm.model.gradient_checkpointing_enable()
    rm.train()
    obj = cfg.objective
    return TokenRM(rm, torch.optim.AdamW(rm.parameters(), lr=obj.rm_lr), env, obj.rm_lr,
                   obj.rm_min_lr, obj.rm_warmup_steps + policy_steps)


def warm_up(rm: TokenRM, state: training.TrainState, data: Rollouts, samples: list[int],
            batching: Batching, steps: int) -> list[float]:
    """OREAL's frozen-actor start: `steps` global batches (the first ones of the schedule) that
    train only the token RM; the policy, its optimiser and its schedule are untouched. Returns
    the mean BCE per step."""
    bces: list[float] = []
    with progress_bar(state.settings.progress and state.dist.is_main) as bar:
        task = bar.add_task("token RM warm-up", total=steps, info="")
        for step in range(steps):
            bces.append(_warm_up_step(rm, state, data, samples, batching, step))
            bar.update(task, advance=1, info=f"bce {bces[-1]:.4f}")
    return bces


def _warm_up_step(rm: TokenRM, state: training.TrainState, data: Rollouts, samples: list[int],
                  batching: Batching, step: int) -> float:
    batch_idx = batching.global_batch_at(samples, step)
    counts = GlobalCounts(samples=len(batch_idx), tokens=0, pos_tokens=0)

    def one(rows: list[list[int]], scale: float) -> training.MicroOut:
        index = [i for r in rows for i in r]
        b = batching.collate(data, rows).to(rm.env.device)
        if not index:  # a dummy pass: the RM's collectives on one token
            with dev.autocast(rm.env.device, rm.env.dtype):
                (rm.model(b).sum() * 0.0).backward()
            return training.MicroOut({})
        targets = b.layout.index(b.labels.device)  # (N,)
        sample_index = b.sample_index.reshape(-1).index_select(0, targets)  # (N,)
        _, bce = rm.train_pass(b, sample_index, data.rewards[index].to(rm.env.device), counts,
                               scale)
        return training.MicroOut({}, {"rm_bce": bce}, len(index) / counts.samples)

    mbs = batching.micro_batches(batching.share(batch_idx, data, state.dist), data)
    bce = training.accumulate(state, len(mbs), lambda j, scale: one(
        mbs[j] if j < len(mbs) else [], scale))["rm_bce"]
    rm.step(step)
    return bce
