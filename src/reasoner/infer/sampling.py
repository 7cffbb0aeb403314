"""Inverse-CDF sampling of a batch of rows, each from its own stream of uniforms.

Row b takes the first token (in vocabulary order) whose cumulative probability exceeds
uniforms[b] times the total, under temperature / top-k / top-p (`base.transform_logits`). With
top-k the few candidates are all that carry probability, so the float64 CDF is summed over them
only, kept in vocabulary order: a token that is not a candidate adds exactly 0.0 to the
whole-vocabulary CDF, so the sums at the candidates, and so the token a uniform picks, are the
same numbers (tested bit for bit against `sample_full`).

The candidates' probabilities (top-p's cut, the CDF, the recorded log-probs) come from a float32
softmax. Up to `WHOLE_ROW_VOCAB` tokens it runs over the whole (masked) row, as it always has,
so the tiny models' samples and recorded log-probs (the quickstart's) do not move by a bit. A
larger vocabulary (SmolLM2's 49,152, Qwen's 152,064) runs it over the candidates alone: the
same values to float32 rounding (the masked tokens' terms are exactly 0), without two passes
over a (B, V) row of mostly -inf per step, which on two CPU cores cost as much as a fifth of a
135M model's decode step.
"""

from __future__ import annotations

import torch

from reasoner.config import SamplingConfig
from reasoner.infer.base import transform_logits

FEW = 1024  # top-k up to this samples over its candidates; a larger one over the vocabulary
WHOLE_ROW_VOCAB = 4096  # up to this vocabulary the softmax runs over the whole masked row
TIES = 8  # candidates taken past the k-th, to see the ties at its value without a second pass


def sample_rows(logits: torch.Tensor, uniforms: torch.Tensor,
                sampling: SamplingConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen ids, their log-probs), both (B,), for (B, V) `logits` and (B,) uniforms in [0, 1).
    Removed tokens have probability 0 and are never picked."""
    if sampling.temperature == 0:  # greedy: the first maximum, a point mass (log-prob 0)
        chosen = logits.argmax(-1)  # (B,)
        return chosen, torch.zeros(len(chosen), device=logits.device)
    if not 0 < sampling.top_k <= min(FEW, logits.shape[-1] - 2):
        return sample_full(logits, uniforms, sampling)
    x, ids, keep = candidates(logits, sampling)  # (B, V) / temperature; (B, m) in vocab order
    kept = x.gather(-1, ids).masked_fill_(~keep, float("-inf"))  # (B, m)
    if x.shape[-1] > WHOLE_ROW_VOCAB:
        cand = kept.log_softmax(-1)  # (B, m) float32: the recorded log-probs
    else:  # the whole row, as transform_logits masks it
        masked = torch.full_like(x, float("-inf")).scatter_(-1, ids, kept)  # (B, V)
        cand = masked.log_softmax(-1).gather(-1, ids)  # (B, m)
    cdf = cand.double().exp().cumsum(-1)  # (B, m): the full CDF's values at the candidates
    target = uniforms.to(cdf.device, torch.float64) * cdf[:, -1]  # (B,)
    at = torch.searchsorted(cdf, target[:, None], right=True).clamp_(max=ids.shape[-1] - 1)
    return ids.gather(-1, at)[:, 0], cand.gather(-1, at)[:, 0]


def candidates(logits: torch.Tensor, sampling: SamplingConfig
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """((B, V) logits / temperature, (B, m) ids of the top-k candidates in vocabulary order,
    (B, m) which of them top-k and top-p keep), decided exactly as `transform_logits` decides
    (equal logits ordered by token id, as its stable sort orders them)."""
    x = logits.float() / sampling.temperature  # (B, V)
    k = sampling.top_k
    # TIES more than the k: a tie at the k-th value (common in bf16, whose logits take few
    # values) is then settled by this one call; only a longer run of ties calls topk again
    vals, ids = x.topk(min(k + TIES, x.shape[-1]), dim=-1)  # (B, k + TIES), descending
    kth = vals[:, k - 1:k]  # (B, 1)
    if bool((vals[:, -1:] == kth).any()):  # ties past what was taken: take them all
        vals, ids = x.topk(int((x >= kth).sum(-1).max()), dim=-1)  # (B, m)
    else:  # top-k keeps every token equal to the k-th too (the rest are masked below)
        m = int((vals >= kth).sum(-1).max())
        vals, ids = vals[:, :m], ids[:, :m]
    order = ids.argsort(-1)  # (B, m) to vocabulary order
    vals, ids = vals.gather(-1, order), ids.gather(-1, order)
    if sampling.top_p < 1.0:
        down = torch.sort(vals, dim=-1, descending=True, stable=True).indices  # (B, m): ties by token id
        vals, ids = vals.gather(-1, down), ids.gather(-1, down)
    keep = vals >= kth  # (B, m)
    if sampling.top_p < 1.0:
        # transform_logits sorts the whole masked row; its first m entries are `vals` (kept) and
        # the rest -inf, so the same (B, V) row gives the same float32 softmax and prefix sums
        # (a large vocabulary: the m entries alone, the same to float32 rounding)
        kept = vals.masked_fill(~keep, float("-inf"))  # (B, m)
        if x.shape[-1] > WHOLE_ROW_VOCAB:
            probs = kept.softmax(-1)
        else:
            row = torch.full_like(x, float("-inf"))
            row[:, :vals.shape[-1]] = kept
            probs = row.softmax(-1)[:, :vals.shape[-1]]  # (B, m)
        keep = keep & (probs.cumsum(-1) - probs < sampling.top_p)  # (B, m)
        order = ids.argsort(-1)  # (B, m) back to vocabulary order
        ids, keep = ids.gather(-1, order), keep.gather(-1, order)
    return x, ids, keep


def sample_full(logits: torch.Tensor, uniforms: torch.Tensor,
                sampling: SamplingConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """`sample_rows` over the whole vocabulary: a float64 CDF of (B, V) (top-k off or large)."""
    logp = transform_logits(logits, sampling.temperature, sampling.top_k, sampling.top_p
                            ).log_softmax(-1)  # (B, V)
    cdf = logp.double().exp().cumsum(-1)  # (B, V); float64: a 150k vocabulary sums exactly enough
    target = uniforms.to(cdf.device, torch.float64) * cdf[:, -1]  # (B,)
    chosen = torch.searchsorted(cdf, target[:, None], right=True)[:, 0]  # (B,)
    chosen = chosen.clamp_(max=logits.shape[-1] - 1)
    return chosen, logp.gather(-1, chosen[:, None])[:, 0]


def uniform_stream(seed: int, length: int) -> torch.Tensor:
    """(length,) float64 uniforms in [0, 1) of one request, from its own seed."""
    return torch.rand(length, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
