"""Each offline objective's training side: the per-sample signal it trains with, the tokens it
scores, and its loss step; one dict dispatches on `objective.name`.

What an objective needs (a reference, a moving one, behaviour log-probs, a token RM) is answered
by its config model (config/objectives.py); its loss is a pure function of rl/losses.py. Adding
an objective: its model there, its signal and step here, its loss in losses.py, its docs.

Signals are computed once for the whole rollout set (M samples); steps see one micro-batch and
the global-batch normalisers (`Norm`), so micro-batching, packing and processes cannot change
the loss.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from reasoner.config import ObjectiveConfig
from reasoner.errors import TrainingError
from reasoner.rl import losses
from reasoner.rl.rollouts import Rollouts


@dataclass
class Micro:
    """One micro-batch's per-sample and per-token inputs to an objective."""

    index: list[int]  # rollout indices of its samples
    sample_index: Tensor  # (N,) 0..b-1
    signal: Tensor  # (b,) reward or advantage the objective trains with
    rewards: Tensor  # (b,)
    group_acc: Tensor  # (b,)
    old_logp: Tensor | None  # (N,)
    ref_logp: Tensor | None  # (N,)
    weights: Tensor | None  # (N,) token weights (oreal) or scope mask (pcl neg_scope)


@dataclass
class Norm:
    """Global-batch normalisers, handed to the losses."""

    samples: float
    tokens: float
    pos_tokens: float


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
    """dapo, prorl: group advantages of the reward (with the soft overlong penalty)."""
    return _overlong_advantages(obj, data, data.rewards)


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
    response's: they are not what made it wrong.
    """
    resp = [data.ids[i][data.prompt_lens[i]:] for i in range(len(data.ids))]
    positives: dict[int, list[int]] = {}
    for i in range(len(resp)):
        if data.rewards[i] > 0:
            positives.setdefault(int(data.groups[i]), []).append(i)
    out = []
    for i, r in enumerate(resp):
        shared = 0
        if data.rewards[i] <= 0:
            for j in positives.get(int(data.groups[i]), []):
                q = resp[j]
                n = next((t for t in range(min(len(r), len(q))) if r[t] != q[t]), min(len(r), len(q)))
                shared = max(shared, n)
        out.append(shared)
    return out


def every_token(data: Rollouts, obj: ObjectiveConfig) -> None:
    return None


def pcl_scope(data: Rollouts, obj: ObjectiveConfig) -> list[list[float]] | None:
    """Per-token 1/0 masks restricting negatives to their divergent suffix (pcl's neg_scope)."""
    if obj.neg_scope == "all":
        return None
    cut = divergence(data)
    masks = []
    for i in range(len(data.ids)):
        n = data.resp_len(i)
        if data.rewards[i] > 0:
            masks.append([1.0] * n)
            continue
        end = n if obj.neg_scope == "divergent" else min(cut[i] + 1, n)
        masks.append([0.0] * cut[i] + [1.0] * (end - cut[i]) + [0.0] * (n - end))
    return masks


# --------------------------------------------------------------------------------------------
# Loss steps: one micro-batch's loss and metrics


def _with_kl(loss: Tensor, metrics: dict, logp: Tensor, m: Micro, obj: ObjectiveConfig, n: Norm,
             agg: str) -> tuple[Tensor, dict]:
    if not obj.kl_coef:
        return loss, metrics
    kl, mean = losses.kl_loss(logp, m.ref_logp, m.sample_index, len(m.index), agg, n.tokens,
                              n.samples)
    return loss + obj.kl_coef * kl, {**metrics, "kl": mean}


def pcl_step(logp: Tensor, m: Micro, obj: ObjectiveConfig, n: Norm) -> tuple[Tensor, dict]:
    keep = m.weights > 0 if m.weights is not None else slice(None)  # neg_scope: own tokens only
    loss, metrics = losses.pcl_loss(logp[keep], m.sample_index[keep], m.signal, n.samples)
    return _with_kl(loss, metrics, logp, m, obj, n, "seq-mean-token-mean")


def rft_step(logp: Tensor, m: Micro, obj: ObjectiveConfig, n: Norm) -> tuple[Tensor, dict]:
    return losses.rft_loss(logp, m.sample_index, m.rewards, n.pos_tokens)


def clipped_step(logp: Tensor, m: Micro, obj: ObjectiveConfig, n: Norm) -> tuple[Tensor, dict]:
    loss, metrics = losses.clipped_pg_loss(logp, m.old_logp, m.signal, m.sample_index, obj.eps_low,
                                           obj.eps_high, obj.agg, n.tokens, n.samples)
    return _with_kl(loss, metrics, logp, m, obj, n, "token-mean")


def oreal_step(logp: Tensor, m: Micro, obj: ObjectiveConfig, n: Norm) -> tuple[Tensor, dict]:
    weights = m.weights if m.weights is not None else torch.ones_like(logp)
    return losses.oreal_loss(logp, m.ref_logp, m.sample_index, m.rewards, m.group_acc, weights,
                             obj.eta, obj.beta, n.samples)


@dataclass(frozen=True)
class Objective:
    """An objective's training side: its signal (M,), its token scope, its loss step."""

    signal: Callable[[ObjectiveConfig, Rollouts], Tensor]
    step: Callable[[Tensor, Micro, ObjectiveConfig, Norm], tuple[Tensor, dict]]
    scope: Callable[[Rollouts, ObjectiveConfig], list[list[float]] | None] = every_token


OBJECTIVES: dict[str, Objective] = {
    "pcl": Objective(pcl_signal, pcl_step, pcl_scope),
    "rft": Objective(reward, rft_step),
    "oreal": Objective(reward, oreal_step),
    "dapo": Objective(clipped_signal, clipped_step),
    "prorl": Objective(clipped_signal, clipped_step),
    "discounted": Objective(discounted_signal, clipped_step),
}


def sample_signal(obj: ObjectiveConfig, data: Rollouts) -> Tensor:
    """Per-sample reward or advantage (M,) the objective trains with, computed once."""
    return OBJECTIVES[obj.name].signal(obj, data)


def token_scope(data: Rollouts, obj: ObjectiveConfig) -> list[list[float]] | None:
    """Per-token masks of the tokens the loss sees, or None for all of them."""
    return OBJECTIVES[obj.name].scope(data, obj)


# --------------------------------------------------------------------------------------------
# Behaviour log-probs (pi_old of the clipped objectives)


def behaviour_gap(stored: list[list[float]], scored: list[list[float]]) -> dict[str, float]:
    """How far stored behaviour log-probs are from the trainer's own at theta_old, per token:
    mean and max |stored - scored| and the mean and extremes of the ratio exp(scored - stored),
    which the clipped objectives assume is 1 there."""
    a = torch.tensor([x for row in stored for x in row], dtype=torch.float64)  # (N,)
    b = torch.tensor([x for row in scored for x in row], dtype=torch.float64)  # (N,)
    if a.shape != b.shape:
        raise TrainingError(f"stored behaviour log-probs cover {a.numel()} tokens, the trainer "
                            f"scores {b.numel()}: the samples do not match their token ids")
    gap, ratio = (a - b).abs(), (b - a).exp()
    return {"mean_abs_diff": float(gap.mean()), "max_abs_diff": float(gap.max()),
            "ratio_mean": float(ratio.mean()), "ratio_min": float(ratio.min()),
            "ratio_max": float(ratio.max())}


def behaviour_logprobs(obj: ObjectiveConfig, data: Rollouts, sampling: dict | None = None
                       ) -> tuple[bool, str]:
    """(recompute them with the starting model?, where they come from, in words).

    Stored log-probs are those of the distribution the sampler drew from: logits / T, top-k,
    top-p. The policy is scored at logprob_temperature over the whole vocabulary, so the
    ratio pi/pi_old is 1 at theta_old only when T matches and nothing was truncated; `auto`
    recomputes them otherwise, an explicit `samples` with another temperature is an error.
    """
    if not obj.needs_old_logprobs:
        return False, "not used"
    mismatch = []
    if sampling is not None:
        t = sampling.get("temperature", 1.0)
        if abs(t - obj.logprob_temperature) > 1e-9:
            mismatch.append(f"sampled at temperature {t}, scored at objective."
                            f"logprob_temperature {obj.logprob_temperature}")
        if (sampling.get("top_k") or 0) > 0 or sampling.get("top_p", 1.0) < 1.0:
            mismatch.append(f"sampled with top_k {sampling.get('top_k')} / top_p "
                            f"{sampling.get('top_p')}, which truncate the distribution")
    mode = obj.old_logprobs
    if data.old_logp is None and mode != "recompute" and not obj.allow_recompute:
        raise TrainingError(
            f"objective {obj.name} needs the behaviour log-probs of the samples, and "
            f"{data.keys[0]} has none: rerun `reasoner infer` with sampling.logprobs=true, "
            "or set objective.allow_recompute=true to use the starting model's log-probs")
    if mode == "auto":
        mode = "samples" if data.old_logp is not None and sampling is not None and not mismatch \
            else "recompute"
        if mode == "recompute":
            why = "; ".join(mismatch) if mismatch else (
                "the samples carry none" if data.old_logp is None else
                "the samples' sampling settings are unknown")
            return True, f"recomputed by the starting model ({why})"
    if mode == "recompute":
        return True, "recomputed by the starting model (objective.old_logprobs=recompute)"
    if data.old_logp is None:
        return True, "recomputed by the starting model (the samples carry none)"
    if mismatch and mismatch[0].startswith("sampled at temperature"):
        raise TrainingError(
            f"objective.old_logprobs=samples, but the samples were {mismatch[0]}: the ratio "
            f"would not be 1 at theta_old. Set objective.logprob_temperature="
            f"{sampling['temperature']}, or objective.old_logprobs=auto to recompute them")
    if mismatch:
        return False, f"stored by infer ({mismatch[-1]}: the ratio is below 1 at theta_old)"
    return False, "stored by infer"
