"""OREAL's token-level reward model and the token weights it gives (Lyu et al. 2025).

A copy of the policy with a scalar head scores every response token; trained with BCE of
sigmoid(mean token score) against correctness, it learns which tokens decide the outcome.
"""

from __future__ import annotations

import copy as copy_module

import torch
from torch import Tensor, nn

from reasoner.data import packing


class TokenRewardModel(nn.Module):
    """OREAL's token-level reward model: a copy of the policy with a scalar head.

    Trained alongside the policy with BCE of sigmoid(mean token score) against correctness.
    Token weights come from p_t = sigmoid(running mean of scores up to t):
    positives w+ = clip(2 p_t - 1, 0, 1), negatives w- = clip(1 - 2 p_t, 0, 1).
    """

    def __init__(self, policy_model: nn.Module, copy: bool = True):
        super().__init__()
        self.model = copy_module.deepcopy(policy_model) if copy else policy_model
        self.head = nn.Linear(self.model.config.hidden_size, 1)
        self.reset_head()
        lm_head, embed = self.model.get_output_embeddings(), self.model.get_input_embeddings()
        if lm_head is not None and lm_head.weight is not embed.weight:
            # scores come from the trunk: an untied LM head gets no gradient, hence no optimiser
            # state to checkpoint, and a fresh optimiser's template would ask for it on resume
            lm_head.requires_grad_(False)

    @torch.no_grad()
    def reset_head(self) -> None:
        self.head.weight.zero_()
        self.head.bias.zero_()

    def forward(self, batch: packing.Batch) -> Tensor:
        out = self.model.model(input_ids=batch.input_ids, position_ids=batch.position_ids,
                               attention_mask=batch.attention_mask, use_cache=False)
        keep = batch.labels >= 0
        return self.head(out.last_hidden_state[keep]).squeeze(-1).float()  # (N,)


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
    p = torch.sigmoid(running_mean(scores.detach(), sample_index))  # (N,)
    positive = rewards[sample_index] > 0
    return torch.where(positive, (2 * p - 1).clamp(0, 1), (1 - 2 * p).clamp(0, 1))
