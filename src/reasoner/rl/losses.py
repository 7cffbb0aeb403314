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
                    clip_ratio_c: float | None = 3.0) -> tuple[Tensor, dict]:
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
    no dual clip.
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
    loss = agg_loss(per_token, sample_index, advantages.shape[0], agg, global_tokens, global_samples)
    with torch.no_grad():
        clip_frac = (clipped > unclipped).float().mean()
    return loss, {"loss": _metric(loss), "clip_frac": _metric(clip_frac),
                  "dual_clip_frac": _metric(dual.float().mean()),
                  "ratio_mean": _metric(ratio.mean()), "ratio_max": _metric(ratio.max()),
                  "ratio_min": _metric(ratio.min())}


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
