"""Each offline objective's training side: the per-sample signal it trains with, the tokens it
scores, and its loss step; one dict dispatches on `objective.name`.

What an objective needs (a reference, a moving one, behaviour log-probs, a token RM) is answered
by its config model (config/objectives.py); its loss is a pure function of losses.py. Adding an
objective: its model there, its signal and step here, its loss in losses.py, its docs.

Signals and scopes are computed once for the whole rollout set (M samples), both as
`f(obj, data)`; steps see one micro-batch and the global-batch counts (`GlobalCounts`), so
micro-batching, packing and processes cannot change the loss.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from reasoner.config import ObjectiveConfig
from reasoner.train_offline import losses, offpolicy
from reasoner.train_offline.rollouts import Rollouts


@dataclass
class Micro:
    """One micro-batch's per-sample and per-token inputs to an objective. What selects among
    them (`scope`, `positive`, `negative`) is built on the host: nothing is read back."""

    index: list[int]  # rollout indices of its samples
    sample_index: Tensor  # (N,) 0..b-1
    signal: Tensor  # (b,) reward or advantage the objective trains with
    rewards: Tensor  # (b,)
    group_acc: Tensor  # (b,)
    old_logp: Tensor | None = None  # (N,) behaviour log-probs (the ratio, the diagnostics)
    ref_logp: Tensor | None = None  # (N,) reference log-probs (KL terms, OREAL)
    scope: Tensor | None = None  # (n,) which of the N tokens pcl's loss sees; None: all
    token_weights: Tensor | None = None  # (N,) OREAL's token RM weights; None: all 1
    positive: Tensor | None = None  # (p,) which of the b samples have signal > 0 (pcl's metrics)
    negative: Tensor | None = None  # (q,) ... signal < 0; None: found from `signal`


@dataclass(frozen=True)
class GlobalCounts:
    """What the losses average over, counted over the whole global batch (every micro-batch of
    every process): its samples, their response tokens, the positive samples' tokens."""

    samples: float
    tokens: float
    pos_tokens: float


@dataclass
class StepResult:
    """One micro-batch's loss (its share of the global batch's) and metrics, by how they are
    reduced over the step: averaged, or the largest / smallest value."""

    loss: Tensor
    means: dict[str, Tensor]  # 0-dim, detached: read once per step (training.accumulate)
    maxima: dict[str, Tensor] = field(default_factory=dict)
    minima: dict[str, Tensor] = field(default_factory=dict)
    sums: dict[str, Tensor] = field(default_factory=dict)  # shares of global means: added up


# --------------------------------------------------------------------------------------------
# Per-sample signals (M,), computed once


def reward(obj: ObjectiveConfig, data: Rollouts) -> Tensor:
    """rft, oreal: the reward itself."""
    return data.rewards


def pcl_signal(obj: ObjectiveConfig, data: Rollouts) -> Tensor:
    """R, or R - group mean (baseline); negatives scaled by neg_weight (and by p/(1-p) with
    balance, so each group's negatives weigh as much, together, as its positives)."""
    r = data.rewards
    if obj.baseline == "group":
        r = losses.group_advantages(r, data.groups, "none")
    scale = torch.full_like(r, obj.neg_weight)
    if obj.balance:
        p = data.group_acc.clamp(0.0, 1 - 1e-6)
        scale = scale * p / (1 - p)
    return torch.where(r < 0, r * scale, r)


def _overlong_advantages(obj: ObjectiveConfig, data: Rollouts, r: Tensor) -> Tensor:
    if obj.overlong_max_len:
        lengths = torch.tensor([data.resp_len(i) for i in range(len(data.ids))])
        r = r + losses.soft_overlong_penalty(lengths, obj.overlong_max_len,
                                             obj.overlong_cache_len, obj.overlong_factor)
    return losses.group_advantages(r, data.groups, obj.advantage)


def clipped_signal(obj: ObjectiveConfig, data: Rollouts) -> Tensor:
    """dapo, prorl, gspo, cispo: group advantages of the reward (with the soft overlong
    penalty)."""
    return _overlong_advantages(obj, data, data.rewards)


def oapl_signal(obj: ObjectiveConfig, data: Rollouts) -> Tensor:
    """OAPL's optimal advantage r - V(x), V from the rewards of x's group (`oapl_value`)."""
    return data.rewards - losses.oapl_value(data.rewards, data.groups, obj.beta_value)


def discounted_signal(obj: ObjectiveConfig, data: Rollouts) -> Tensor:
    """gamma^K for a correct answer after K think tokens, plus the format reward, as advantages."""
    r = losses.discounted_reward(data.rewards > 0, data.reasoning, obj.gamma,
                                 obj.format_reward * data.has_answer.float())
    return _overlong_advantages(obj, data, r)


# --------------------------------------------------------------------------------------------
# Token scopes: which tokens of a sample the loss sees (None: all)


def divergence(data: Rollouts) -> list[int]:
    """Per sample: response tokens it shares as a prefix with some positive of its group.

    0 for positives. A negative's tokens before this point are the same as a correct
    response's: they are not what made it wrong. Read one group at a time (at the recipe's
    scale every response as Python lists would be tens of GB on every process).
    """
    rewards = data.rewards.tolist()
    members: dict[int, list[int]] = {}
    for i, g in enumerate(data.groups.tolist()):
        members.setdefault(int(g), []).append(i)
    out = [0] * len(rewards)
    for group in members.values():
        wrong = [i for i in group if rewards[i] <= 0]
        if not wrong or len(wrong) == len(group):  # nothing to compare with
            continue
        correct = [_response(data, j) for j in group if rewards[j] > 0]
        for i in wrong:
            r = _response(data, i)
            out[i] = max(_shared_prefix(r, q) for q in correct)
    return out


def _response(data: Rollouts, i: int) -> np.ndarray:
    return np.asarray(data.ids[i][data.prompt_lens[i]:])


def _shared_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n


class ScopeMasks(Sequence):
    """pcl's per-token 1 / 0 masks, one per sample, made when a micro-batch asks for its
    samples' masks: held as three numbers per sample, not one float per token."""

    def __init__(self, lengths: list[int], starts: list[int], ends: list[int]):
        self.lengths, self.starts, self.ends = lengths, starts, ends

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> list[float]:  # type: ignore[override]
        n, a, b = self.lengths[i], self.starts[i], self.ends[i]
        return [0.0] * a + [1.0] * (b - a) + [0.0] * (n - b)


def every_token(obj: ObjectiveConfig, data: Rollouts) -> None:
    return None


def pcl_scope(obj: ObjectiveConfig, data: Rollouts) -> ScopeMasks | None:
    """Per-token 1/0 masks restricting negatives to their divergent suffix (pcl's neg_scope)."""
    if obj.neg_scope == "all":
        return None
    cut = divergence(data)
    lengths = [data.resp_len(i) for i in range(len(data.ids))]
    starts, ends = [], []
    rewards = data.rewards.tolist()
    for i, n in enumerate(lengths):
        positive = rewards[i] > 0
        starts.append(0 if positive else cut[i])
        ends.append(n if positive or obj.neg_scope == "divergent" else min(cut[i] + 1, n))
    return ScopeMasks(lengths, starts, ends)


# --------------------------------------------------------------------------------------------
# Loss steps: one micro-batch's loss and metrics


def _result(loss: Tensor, metrics: dict) -> StepResult:
    """A loss's metrics as means over the step (the loss itself is summed by the trainer, as
    shares; rft's positive-token count is a count, not a mean)."""
    return StepResult(loss, {k: v for k, v in metrics.items() if k not in ("loss", "pos_tokens")})


def _with_kl(loss: Tensor, metrics: dict, logp: Tensor, m: Micro, obj: ObjectiveConfig,
             n: GlobalCounts, agg: str) -> StepResult:
    if not obj.kl_coef:
        return _result(loss, metrics)
    kl, mean = losses.kl_loss(logp, m.ref_logp, m.sample_index, len(m.index), agg, n.tokens,
                              n.samples)
    return _result(loss + obj.kl_coef * kl, {**metrics, "kl": mean})


def pcl_step(logp: Tensor, m: Micro, obj: ObjectiveConfig, n: GlobalCounts) -> StepResult:
    seen, where = logp, m.sample_index
    if m.scope is not None:  # neg_scope: a negative's own tokens only
        seen, where = logp.index_select(0, m.scope), where.index_select(0, m.scope)  # (n,)
    loss, metrics = losses.pcl_loss(seen, where, m.signal, n.samples, m.positive, m.negative)
    return _with_kl(loss, metrics, logp, m, obj, n, "seq-mean-token-mean")


def rft_step(logp: Tensor, m: Micro, obj: ObjectiveConfig, n: GlobalCounts) -> StepResult:
    return _result(*losses.rft_loss(logp, m.sample_index, m.rewards, n.pos_tokens))


def _corrected(logp: Tensor, m: Micro, obj: ObjectiveConfig) -> losses.Corrected:
    """What a ratio objective's loss divides by, its correction's token weights and metrics
    (`losses.correct`; objective.correction none: the behaviour log-probs, no weights)."""
    c = obj.correction
    return losses.correct(logp, m.old_logp, m.sample_index, len(m.index), c.name,
                          **c.model_dump(exclude={"name"}))


def clipped_step(logp: Tensor, m: Micro, obj: ObjectiveConfig, n: GlobalCounts) -> StepResult:
    anchor, weights, corrected = _corrected(logp, m, obj)
    loss, metrics = losses.clipped_pg_loss(logp, anchor, m.signal, m.sample_index, obj.eps_low,
                                           obj.eps_high, obj.agg, n.tokens, n.samples,
                                           obj.clip_ratio_c, weights)
    largest, smallest = metrics.pop("ratio_max"), metrics.pop("ratio_min")
    result = _with_kl(loss, {**metrics, **corrected}, logp, m, obj, n, "token-mean")
    result.maxima, result.minima = {"ratio_max": largest}, {"ratio_min": smallest}
    return result


def gspo_step(logp: Tensor, m: Micro, obj: ObjectiveConfig, n: GlobalCounts) -> StepResult:
    anchor, weights, corrected = _corrected(logp, m, obj)
    loss, metrics = losses.gspo_loss(logp, anchor, m.signal, m.sample_index, obj.eps_low,
                                     obj.eps_high, n.samples, weights)
    return _with_kl(loss, {**metrics, **corrected}, logp, m, obj, n, "seq-mean-token-mean")


def cispo_step(logp: Tensor, m: Micro, obj: ObjectiveConfig, n: GlobalCounts) -> StepResult:
    anchor, weights, corrected = _corrected(logp, m, obj)
    loss, metrics = losses.cispo_loss(logp, anchor, m.signal, m.sample_index, obj.eps_low,
                                      obj.eps_high, obj.agg, n.tokens, n.samples, weights)
    return _with_kl(loss, {**metrics, **corrected}, logp, m, obj, n, obj.agg)


def oapl_step(logp: Tensor, m: Micro, obj: ObjectiveConfig, n: GlobalCounts) -> StepResult:
    anchor, weights, corrected = _corrected(logp, m, obj)  # a sequence mask at most
    loss, metrics = losses.oapl_loss(logp, anchor, m.signal, m.sample_index, obj.beta, n.samples,
                                     weights)
    return _result(loss, {**metrics, **corrected})


def oreal_step(logp: Tensor, m: Micro, obj: ObjectiveConfig, n: GlobalCounts) -> StepResult:
    weights = m.token_weights if m.token_weights is not None else torch.ones_like(logp)
    return _result(*losses.oreal_loss(logp, m.ref_logp, m.sample_index, m.rewards, m.group_acc,
                                      weights, obj.eta, obj.beta, n.samples))


@dataclass(frozen=True)
class Objective:
    """An objective's training side: its signal (M,), its token scope, its loss step."""

    signal: Callable[[ObjectiveConfig, Rollouts], Tensor]
    step: Callable[[Tensor, Micro, ObjectiveConfig, GlobalCounts], StepResult]
    scope: Callable[[ObjectiveConfig, Rollouts], Sequence[list[float]] | None] = every_token


OBJECTIVES: dict[str, Objective] = {
    "pcl": Objective(pcl_signal, pcl_step, pcl_scope),
    "rft": Objective(reward, rft_step),
    "oreal": Objective(reward, oreal_step),
    "dapo": Objective(clipped_signal, clipped_step),
    "prorl": Objective(clipped_signal, clipped_step),
    "discounted": Objective(discounted_signal, clipped_step),
    "gspo": Objective(clipped_signal, gspo_step),
    "cispo": Objective(clipped_signal, cispo_step),
    "oapl": Objective(oapl_signal, oapl_step),
}


def sample_signal(obj: ObjectiveConfig, data: Rollouts) -> Tensor:
    """Per-sample reward or advantage (M,) the objective trains with, computed once."""
    return OBJECTIVES[obj.name].signal(obj, data)


def token_scope(obj: ObjectiveConfig, data: Rollouts) -> Sequence[list[float]] | None:
    """Per-token masks of the tokens the loss sees, or None for all of them."""
    return OBJECTIVES[obj.name].scope(obj, data)


def step(logp: Tensor, m: Micro, obj: ObjectiveConfig, counts: GlobalCounts) -> StepResult:
    """One micro-batch's loss under `obj`: its share of the global batch's; with the off-policy
    diagnostics of the policy against the behaviour log-probs, when the step has them."""
    result = OBJECTIVES[obj.name].step(logp, m, obj, counts)
    if m.old_logp is not None and obj.diagnostics != "none":
        gap = offpolicy.diagnostics(logp, m.old_logp, m.sample_index, len(m.index),
                                    global_tokens=counts.tokens, global_samples=counts.samples)
        result.sums.update(gap.shares)
        result.maxima.update(gap.maxima)
        result.minima.update(gap.minima)
    return result
