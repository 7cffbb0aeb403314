"""Every objective, as pure functions on tensors (docs/design.md, "Losses").

Layout: token tensors are flat over the response tokens of a batch. `logp`, `old_logp`,
`ref_logp`, `weights` are (N,); `sample_index` (N,) says which of the B samples each token
belongs to (0..B-1). Per-sample tensors are (B,). The same layout serves padded and packed
batches. Every loss returns `(loss, metrics)`, each metric a detached 0-dim tensor left on the
device (`training.accumulate` reads a step's metrics in one go, not one host sync per value).

Aggregation lives in one place, `agg_loss` (as in verl's core_algos). Each loss also takes the
*global* normaliser of its mean (samples, tokens or positive tokens in the whole global batch,
over every micro-batch and process). Given it, a micro-batch's loss is its share of the global
loss, so summing the shares' gradients gives the gradient of the whole batch however it was
split; left out, the loss is the plain mean over this batch.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor


def _metric(x: Tensor) -> Tensor:
    return x.detach()


def segment_sum(x: Tensor, sample_index: Tensor, num_samples: int) -> Tensor:
    """Per-sample sum of token values, (B,)."""
    return torch.zeros(num_samples, dtype=x.dtype, device=x.device).index_add(0, sample_index, x)


def segment_mean(x: Tensor, sample_index: Tensor, num_samples: int) -> Tensor:
    """Per-sample mean of token values, (B,); a sample with no tokens gets 0."""
    counts = torch.zeros(num_samples, dtype=x.dtype, device=x.device).index_add(
        0, sample_index, torch.ones_like(x))
    return segment_sum(x, sample_index, num_samples) / counts.clamp(min=1)


def global_share(local_mean: Tensor, local_count: float | Tensor, global_count: float | None
                 ) -> Tensor:
    """A mean over this batch's `local_count` items as its share of the mean over the global
    batch's `global_count` items: sum / global_count. None: the local mean itself."""
    if global_count is None:
        return local_mean
    return local_mean * local_count / max(global_count, 1.0)


def agg_loss(per_token: Tensor, sample_index: Tensor, num_samples: int, mode: str,
             global_tokens: float | None = None, global_samples: float | None = None) -> Tensor:
    """Token values (N,) -> a scalar loss.

    `token-mean`: sum over tokens / tokens in the global batch (every token weighs the same);
    `seq-mean-token-mean`: sum over samples of each sample's token mean / samples in the
    global batch (every sample weighs the same, whatever its length).
    """
    if mode == "token-mean":
        return global_share(per_token.mean(), per_token.numel(), global_tokens)
    if mode == "seq-mean-token-mean":
        per_sample = segment_mean(per_token, sample_index, num_samples)  # (B,)
        return global_share(per_sample.mean(), num_samples, global_samples)
    raise ValueError(f"unknown aggregation {mode!r}: token-mean or seq-mean-token-mean")


def pcl_loss(logp: Tensor, sample_index: Tensor, rewards: Tensor,
             global_samples: float | None = None, positive: Tensor | None = None,
             negative: Tensor | None = None) -> tuple[Tensor, dict]:
    """PCL-Reasoner-V1.5 offline objective: mean_i [-R_i * exp(mean_t log p_t(y_i))].

    The geometric-mean token probability of each response, pushed up for R = +1 and down for
    R = -1; no importance sampling, clipping or KL; every sample weighs the same whatever its
    length. (PCL-Reasoner-V1.5 technical report, 2025.) `positive`, `negative`: the samples
    with R > 0 and R < 0 (indices), when the caller knows them on the host; None: found from
    `rewards` (read back from the device). Their metrics are NaN when there are none.
    """
    geo = segment_mean(logp, sample_index, rewards.shape[0]).exp()  # (B,)
    loss = global_share((-rewards * geo).mean(), rewards.shape[0], global_samples)
    if positive is None or negative is None:
        positive, negative = torch.nonzero(rewards > 0)[:, 0], torch.nonzero(rewards < 0)[:, 0]
    return loss, {
        "loss": _metric(loss),
        "geo_prob_pos": _metric(geo.index_select(0, positive).mean()),  # NaN: no positives
        "geo_prob_neg": _metric(geo.index_select(0, negative).mean()),
    }


def rft_loss(logp: Tensor, sample_index: Tensor, rewards: Tensor,
             global_pos_tokens: float | None = None) -> tuple[Tensor, dict]:
    """Rejection-sampling fine-tuning: token-mean NLL over the positive samples only.

    The baseline every RL result is compared with (Yuan et al. 2023, "Scaling relationship on
    learning mathematical reasoning with LLMs"). No positives: a zero loss. The global
    normaliser is the number of positive samples' tokens in the global batch.
    """
    pos_tok = rewards[sample_index] > 0  # (N,)
    n = pos_tok.sum()  # a count on the device: multiplied in below, never read back
    loss = global_share(-(logp * pos_tok).sum() / n.clamp(min=1), n, global_pos_tokens)
    return loss, {"loss": _metric(loss), "pos_tokens": _metric(n)}


def group_advantages(rewards: Tensor, group_index: Tensor, mode: str = "grpo") -> Tensor:
    """(B,) -> (B,) advantages within groups (samples of one problem).

    `grpo`: (r - mean_g) / (std_g + 1e-6), unbiased std (Shao et al. 2024, DeepSeekMath);
    `rloo`: r - mean of the other members (Ahmadian et al. 2024); `none`: r - mean_g.
    A group of one gets 0.
    """
    groups = int(group_index.max()) + 1 if group_index.numel() else 0
    ones = torch.ones_like(rewards)
    count = torch.zeros(groups, dtype=rewards.dtype, device=rewards.device).index_add(0, group_index, ones)
    total = torch.zeros_like(count).index_add(0, group_index, rewards)
    n, s = count[group_index], total[group_index]  # (B,)
    mean = s / n
    if mode == "none":
        adv = rewards - mean
    elif mode == "rloo":
        adv = rewards - (s - rewards) / (n - 1).clamp(min=1)
    elif mode == "grpo":
        sq = torch.zeros_like(count).index_add(0, group_index, (rewards - mean) ** 2)[group_index]
        std = (sq / (n - 1).clamp(min=1)).sqrt()
        adv = (rewards - mean) / (std + 1e-6)
    else:
        raise ValueError(f"unknown advantage mode {mode!r}: grpo, rloo or none")
    return torch.where(n > 1, adv, torch.zeros_like(adv))


def clipped_pg_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, sample_index: Tensor,
                    eps_low: float = 0.2, eps_high: float = 0.28, agg: str = "token-mean",
                    global_tokens: float | None = None, global_samples: float | None = None,
                    clip_ratio_c: float | None = 3.0, weights: Tensor | None = None
                    ) -> tuple[Tensor, dict]:
    """PPO-style clipped policy gradient with decoupled clip range (DAPO, Yu et al. 2025) and a
    dual clip for negative advantages (Ye et al. 2020, "Mastering complex control in MOBA games
    with deep RL"; verl's `clip_ratio_c`).

    Per token: l = max(-rho*A, -clip(rho, 1-eps_low, 1+eps_high)*A), rho = exp(logp - old_logp),
    A = advantages[sample]; where A < 0, l = min(l, -clip_ratio_c * A): a token the policy has
    made far likelier than the behaviour policy did costs at most clip_ratio_c x |A| (without
    it a log-prob gap of 20 costs 4.9e8 x |A|, and the gradient follows). The log-ratio is
    clamped to [-20, 20] before exp, as verl does, so that the bounded branch's zero gradient
    never meets an infinite ratio (0 x inf = NaN). `token-mean`: mean over all N tokens (DAPO);
    `seq-mean-token-mean`: mean over samples of each sample's token mean. clip_ratio_c None:
    no dual clip. `weights` (N,): a correction's stop-gradient token weights (`correct`).
    """
    ratio = (logp - old_logp).clamp(-20.0, 20.0).exp()  # (N,)
    adv = advantages[sample_index]  # (N,)
    unclipped = -ratio * adv
    clipped = -ratio.clamp(1 - eps_low, 1 + eps_high) * adv
    per_token = torch.maximum(unclipped, clipped)  # (N,)
    dual = torch.zeros_like(per_token, dtype=torch.bool)
    if clip_ratio_c is not None:
        bound = -clip_ratio_c * adv  # (N,)
        dual = (adv < 0) & (per_token > bound)
        per_token = torch.where(dual, bound, per_token)
    if weights is not None:
        per_token = per_token * weights
    loss = agg_loss(per_token, sample_index, advantages.shape[0], agg, global_tokens, global_samples)
    with torch.no_grad():
        clip_frac = (clipped > unclipped).float().mean()
    return loss, {"loss": _metric(loss), "clip_frac": _metric(clip_frac),
                  "dual_clip_frac": _metric(dual.float().mean()),
                  "ratio_mean": _metric(ratio.mean()), "ratio_max": _metric(ratio.max()),
                  "ratio_min": _metric(ratio.min())}


def gspo_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, sample_index: Tensor,
              eps_low: float = 3e-4, eps_high: float = 4e-4, global_samples: float | None = None,
              weights: Tensor | None = None) -> tuple[Tensor, dict]:
    """GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization"): the clipped objective on
    each response's length-normalised ratio s_i = (pi(y_i) / pi_old(y_i))^(1/|y_i|):

      L = mean_i max(-s_i A_i, -clip(s_i, 1 - eps_low, 1 + eps_high) A_i),
      s_i = exp(m_i(log p - log p_old)), the exponent clamped to [-20, 20].

    Written as the paper's GSPO-token form with sequence advantages, s_it = sg(s_i) pi_t /
    sg(pi_t): the same value and gradient, and a correction's `weights` (N,) can scale tokens.
    Every sample weighs the same (seq-mean-token-mean), as the paper's 1/G sum over responses.
    """
    B = advantages.shape[0]
    log_s = segment_mean(logp - old_logp, sample_index, B).clamp(-20.0, 20.0)  # (B,)
    s = (log_s.detach()[sample_index] + logp - logp.detach()).exp()  # (N,) s_i, grad s_i dlogp_t
    adv = advantages[sample_index]  # (N,)
    per_token = torch.maximum(-s * adv, -s.clamp(1 - eps_low, 1 + eps_high) * adv)  # (N,)
    if weights is not None:
        per_token = per_token * weights
    loss = agg_loss(per_token, sample_index, B, "seq-mean-token-mean", None, global_samples)
    with torch.no_grad():
        seq = log_s.exp()  # (B,)
        clipped = (-seq.clamp(1 - eps_low, 1 + eps_high) * advantages > -seq * advantages)
    return loss, {"loss": _metric(loss), "clip_frac": _metric(clipped.float().mean())}


def cispo_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, sample_index: Tensor,
               eps_low: float | None = None, eps_high: float = 4.0, agg: str = "token-mean",
               global_tokens: float | None = None, global_samples: float | None = None,
               weights: Tensor | None = None) -> tuple[Tensor, dict]:
    """CISPO (MiniMax 2025, "MiniMax-M1"): a policy gradient on every token, its importance
    weight clipped and under stop-gradient, so no token's gradient is ever dropped:

      l_t = -sg(clip(rho_t, 1 - eps_low, 1 + eps_high)) * A * log p_t,
      rho_t = exp(log p_t - log p_old_t), the exponent clamped to [-20, 20].

    eps_low None: no lower bound (as the paper sets it). `token-mean` (the paper's
    1 / sum_i |o_i|) or `seq-mean-token-mean`; `weights` (N,): a correction's token weights.
    """
    ratio = (logp.detach() - old_logp).clamp(-20.0, 20.0).exp()  # (N,)
    w = ratio.clamp(min=None if eps_low is None else 1 - eps_low, max=1 + eps_high)  # (N,)
    per_token = -w * advantages[sample_index] * logp  # (N,)
    if weights is not None:
        per_token = per_token * weights
    loss = agg_loss(per_token, sample_index, advantages.shape[0], agg, global_tokens,
                    global_samples)
    return loss, {"loss": _metric(loss), "clip_frac": _metric((w != ratio).float().mean())}


def oapl_value(rewards: Tensor, group_index: Tensor, beta_value: float) -> Tensor:
    """OAPL's value estimate, (B,): V(x) = beta_value * ln mean_j exp(r_j / beta_value) over
    the group of x's samples (the lagged policy's), for each sample of the group: the soft
    maximum of the group's rewards (their mean as beta_value -> inf, their max as -> 0)."""
    groups = int(group_index.max()) + 1 if group_index.numel() else 0
    z = rewards / beta_value  # (B,)
    zeros = torch.zeros(groups, dtype=z.dtype, device=z.device)
    top = torch.full_like(zeros, -torch.inf).scatter_reduce(0, group_index, z, "amax")  # (G,)
    total = zeros.index_add(0, group_index, (z - top[group_index]).exp())  # (G,)
    count = zeros.index_add(0, group_index, torch.ones_like(z))  # (G,)
    return (beta_value * (top + (total / count).log()))[group_index]


def oapl_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, sample_index: Tensor,
              beta: float = 1e-3, global_samples: float | None = None,
              weights: Tensor | None = None) -> tuple[Tensor, dict]:
    """OAPL (Ritter et al. 2026, "LLMs Can Learn to Reason Via Off-Policy RL"): a least-squares
    regression of the KL-regularised optimal policy's log-ratio to the lagged (behaviour)
    policy onto the optimal advantage, on the lagged policy's own samples (no importance weight):

      L = mean_i (beta * sum_t (log p - log p_lag) - A_i)^2,  A_i = r_i - V(x_i) (`oapl_value`).

    `weights` (N,): a whole-sample mask (the same on each of a sample's tokens), scaling its
    term.
    """
    B = advantages.shape[0]
    residual = beta * segment_sum(logp - old_logp, sample_index, B) - advantages  # (B,)
    per_sample = residual * residual  # (B,)
    if weights is not None:
        per_sample = per_sample * segment_mean(weights, sample_index, B)
    loss = global_share(per_sample.mean(), B, global_samples)
    return loss, {"loss": _metric(loss), "residual_abs": _metric(residual.abs().mean())}


class Corrected(NamedTuple):
    """What a correction gives a ratio objective's loss."""

    anchor: Tensor  # (N,) the log-probs its ratio is taken to
    weights: Tensor | None  # (N,) token weights under stop-gradient; None: all 1
    metrics: dict


def correct(logp: Tensor, old_logp: Tensor, sample_index: Tensor, num_samples: int, kind: str,
            cap: float = 2.0, low: float = 0.5, high: float = 2.0, tau: float = 0.04
            ) -> Corrected:
    """An off-policy correction of an objective with a ratio. With rho_t = exp(log p_t -
    log p_old_t), the policy against the behaviour policy (log-ratios clamped to [-20, 20]):

      none       old_logp, no weights: the objective as published
      token-tis  w_t = min(rho_t, C)                       (truncated IS, Ionides 2008; TIS)
      seq-tis    w_t = min(prod_{u in i} rho_u, C)          (one weight per sample)
      icepop     w_t = 1[low <= rho_t <= high]              (IcePop's token mask)
      geo-mask   w_t = 1[low <= exp(m_i(log rho)) <= high]  (geometric-mean sequence mask)
      m2-mask    w_t = 0 for the k largest (log rho_t)^2, k the fewest that leave the others'
                 mean below tau (at most all but one)    (M2PO's second-moment mask)

    The two IS corrections take the objective's ratio to the step's own policy (log p under
    stop-gradient: ratio 1, its clip inactive) and weigh by w alone: stacked on a ratio to the
    behaviour policy, rho would count twice. The masks keep the objective's ratio to the
    behaviour policy and drop what leaves [low, high] (m2-mask: the tokens that keep the batch's
    second moment above tau). Dropped tokens count in the normaliser (docs/design.md).
    """
    if kind == "none":
        return Corrected(old_logp, None, {})
    d = (logp.detach() - old_logp).clamp(-20.0, 20.0)  # (N,)
    if kind == "token-tis":
        rho = d.exp()  # (N,)
        w = rho.clamp(max=cap)
        capped = (rho > cap).float().mean()
        return Corrected(logp.detach(), w, {"corr_weight_mean": _metric(w.mean()),
                                            "corr_capped_frac": _metric(capped)})
    if kind == "seq-tis":
        seq = segment_sum(d, sample_index, num_samples).clamp(-20.0, 20.0).exp()  # (B,)
        w = seq.clamp(max=cap)[sample_index]  # (N,)
        capped = (seq > cap).float().mean()
        return Corrected(logp.detach(), w, {"corr_weight_mean": _metric(w.mean()),
                                            "corr_capped_frac": _metric(capped)})
    if kind == "icepop":
        rho = d.exp()  # (N,)
        keep = ((rho >= low) & (rho <= high)).to(logp.dtype)  # (N,)
        return Corrected(old_logp, keep, {"corr_masked_frac": _metric(1 - keep.mean())})
    if kind == "geo-mask":
        geo = segment_mean(d, sample_index, num_samples).exp()  # (B,)
        keep = ((geo >= low) & (geo <= high)).to(logp.dtype)  # (B,)
        return Corrected(old_logp, keep[sample_index],
                         {"corr_masked_frac": _metric(1 - keep.mean())})
    if kind == "m2-mask":
        keep = second_moment_keep(d * d, tau).to(logp.dtype)  # (N,)
        return Corrected(old_logp, keep, {"corr_masked_frac": _metric(1 - keep.mean())})
    raise ValueError(f"unknown correction {kind!r}: none, token-tis, seq-tis, icepop, geo-mask "
                     "or m2-mask")


def second_moment_keep(m2: Tensor, tau: float) -> Tensor:
    """Which tokens M2PO's mask keeps (Zheng, Zhao and Chen 2025, "Prosperity before Collapse",
    arXiv 2510.01161): with m2 (N,) the squared log-ratios sorted from the largest, drop the first
    k, k the fewest for which the mean of the rest is below tau (all but the smallest when none
    is). Bool (N,), in m2's order. Tensor ops only: k is never read to the host."""
    n, m2 = m2.shape[0], m2.float()  # sums and counts exact in float32 (bf16 counts are not)
    order = torch.sort(m2, descending=True, stable=True).indices  # (N,)
    ranks = torch.arange(n, device=m2.device)  # (N,)
    rest = m2[order].flip(0).cumsum(0).flip(0) / (n - ranks).float()  # (N,) suffix means
    # the leading run not yet below tau is dropped (a NaN mean is not below: it goes too)
    k = (~(rest < tau)).to(torch.int64).cumprod(0).sum().clamp(max=max(n - 1, 0))
    return torch.empty(n, dtype=torch.bool, device=m2.device).scatter_(0, order, ranks >= k)


def kl_penalty(logp: Tensor, ref_logp: Tensor, kind: str = "k3") -> Tensor:
    """Per-token KL estimate to the reference, (N,) (Schulman 2020, "Approximating KL").

    k1 = logp - ref; k2 = (logp - ref)^2 / 2; k3 = exp(ref - logp) - (ref - logp) - 1.
    """
    d = logp - ref_logp
    if kind == "k1":
        return d
    if kind == "k2":
        return 0.5 * d * d
    if kind == "k3":
        return (-d).exp() + d - 1
    raise ValueError(f"unknown KL estimator {kind!r}: k1, k2 or k3")


def oreal_loss(logp: Tensor, ref_logp: Tensor, sample_index: Tensor, rewards: Tensor,
               group_accuracy: Tensor, token_weights: Tensor, eta: float = 0.5, beta: float = 0.01,
               global_samples: float | None = None) -> tuple[Tensor, dict]:
    """OREAL (Lyu et al. 2025, "Exploring the limit of outcome reward for learning mathematical
    reasoning"): behaviour cloning on positives, reshaped policy gradient on negatives, KL.

    With m_i = mean over sample i's tokens, w = token_weights (omega+ on positive samples,
    omega- on negative ones) and p_i the group accuracy of sample i:
      L = mean_i [ 1[R_i>0] * -m_i(w * logp) + eta * 1[R_i<0] * p_i/(1-p_i) * m_i(w * logp) ]
          + beta * mean_i m_i(k3(logp, ref_logp))
    The p/(1-p) factor gives the negatives of a group the total weight of its positives.
    """
    B = rewards.shape[0]
    weighted = segment_mean(token_weights * logp, sample_index, B)  # (B,)
    p = group_accuracy.clamp(0.0, 1 - 1e-6)
    pos, neg = (rewards > 0).to(logp.dtype), (rewards < 0).to(logp.dtype)
    bc = -(pos * weighted)  # (B,)
    pg = eta * neg * (p / (1 - p)) * weighted  # (B,)
    kl = segment_mean(kl_penalty(logp, ref_logp, "k3"), sample_index, B)  # (B,)
    loss = global_share((bc + pg + beta * kl).mean(), B, global_samples)
    return loss, {"loss": _metric(loss), "bc": _metric(bc.mean()), "neg_pg": _metric(pg.mean()),
                  "kl": _metric(kl.mean())}


def token_rm_loss(scores: Tensor, sample_index: Tensor, rewards: Tensor,
                  global_samples: float | None = None) -> tuple[Tensor, dict]:
    """OREAL's token reward model objective (Lyu et al. 2025): binary cross-entropy of
    sigmoid(mean token score) of each response against its correctness (R > 0), averaged over
    samples. Trained this way, a token's score says how much it decides the outcome.
    """
    B = rewards.shape[0]
    seq = segment_mean(scores, sample_index, B)  # (B,)
    target = (rewards > 0).to(seq.dtype)
    bce = torch.nn.functional.binary_cross_entropy_with_logits(seq, target, reduction="none")  # (B,)
    loss = global_share(bce.mean(), B, global_samples)
    return loss, {"loss": _metric(loss), "rm_bce": _metric(bce.mean())}


def kl_loss(logp: Tensor, ref_logp: Tensor, sample_index: Tensor, num_samples: int, agg: str,
            global_tokens: float | None = None, global_samples: float | None = None
            ) -> tuple[Tensor, Tensor]:
    """The k3 KL to the reference aggregated like the objective it joins; (loss, mean KL)."""
    kl = kl_penalty(logp, ref_logp, "k3")  # (N,)
    loss = agg_loss(kl, sample_index, num_samples, agg, global_tokens, global_samples)
    return loss, _metric(kl.mean())


def soft_overlong_penalty(lengths: Tensor, max_len: int, cache_len: int, factor: float = 1.0
                          ) -> Tensor:
    """DAPO's soft overlong punishment, (B,): 0 up to max_len - cache_len, then linear down to
    -factor at max_len, -factor beyond."""
    start = max_len - cache_len
    over = (lengths.to(torch.float32) - start).clamp(min=0) / max(cache_len, 1)
    return -factor * over.clamp(max=1.0)


def discounted_reward(correct: Tensor, reasoning_tokens: Tensor, gamma: float,
                      format_reward: Tensor | float = 0.0) -> Tensor:
    """(B,): gamma^K * 1[correct] + r_f, K = tokens inside the think span; r_f undiscounted
    (length-efficient RL with a discount factor, e.g. Arora & Zanette 2025)."""
    k = reasoning_tokens.to(torch.float32)
    return torch.pow(torch.tensor(gamma, dtype=torch.float32), k) * correct.to(torch.float32) + format_reward
