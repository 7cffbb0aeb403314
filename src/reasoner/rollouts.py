"""Verified rollouts as training data: token ids, per-sample rewards and advantages.

Loaded once per train-offline run. Also the per-token scopes of the named pcl options
(`neg_scope`) and the per-sample signal each objective trains with (rewards, pcl's reweighted
negatives, group advantages), computed once for the whole set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from reasoner import losses, shards
from reasoner.config import (
    CLIPPED,
    DiscountedObjective,
    ObjectiveConfig,
    OfflineConfig,
    PCLObjective,
)
from reasoner.errors import TrainingError
from reasoner.records import Verified


@dataclass
class Rollouts:
    """The verified samples as token ids plus per-sample tensors (M samples)."""

    keys: list[tuple[str, int]]
    ids: list[list[int]]
    prompt_lens: list[int]
    rewards: Tensor  # (M,) +1 / -1
    groups: Tensor  # (M,) group index
    group_acc: Tensor  # (M,)
    reasoning: Tensor  # (M,) think-span tokens
    has_answer: Tensor  # (M,) bool
    old_logp: list[list[float]] | None  # behaviour log-probs per response token
    dropped: int

    def resp_len(self, i: int) -> int:
        return len(self.ids[i]) - self.prompt_lens[i]

    def loss_mask(self, i: int) -> list[bool]:
        """True on the response tokens of sample i (the tokens that are scored)."""
        p = self.prompt_lens[i]
        return [False] * p + [True] * (len(self.ids[i]) - p)


def load_rollouts(cfg: OfflineConfig, tokenizer: Any) -> Rollouts:
    rows = list(shards.iter_rows(cfg.input_dir, Verified))
    if not rows:
        raise TrainingError(f"{cfg.input_dir}: the Verified shard holds no samples")
    prompts: dict[str, list[int]] = {}
    kept: list[dict] = []
    ids, plens, old, dropped = [], [], [], 0
    for r in rows:
        if r["prompt"] not in prompts:
            prompts[r["prompt"]] = tokenizer(r["prompt"], add_special_tokens=False)["input_ids"]
        p = prompts[r["prompt"]]
        resp = r.get("token_ids")
        if resp is None:
            resp = tokenizer(r["response"], add_special_tokens=False)["input_ids"]
            if r["finish_reason"] == "stop":
                resp = resp + [tokenizer.eos_token_id]
        if not resp or len(p) + len(resp) > cfg.max_tokens:
            dropped += 1
            continue
        kept.append(r)
        ids.append(p + list(resp))
        plens.append(len(p))
        old.append(r.get("logprobs"))
    if not kept:
        raise TrainingError(f"every sample of {cfg.input_dir} is empty or longer than "
                            f"max_tokens={cfg.max_tokens}")
    group_of = {pid: g for g, pid in enumerate(dict.fromkeys(r["id"] for r in kept))}
    t = lambda xs, dt=torch.float32: torch.tensor(xs, dtype=dt)  # noqa: E731
    return Rollouts(
        keys=[(r["id"], r["sample_idx"]) for r in kept], ids=ids, prompt_lens=plens,
        rewards=t([r["reward"] for r in kept]), groups=t([group_of[r["id"]] for r in kept], torch.long),
        group_acc=t([r["group_accuracy"] for r in kept]), reasoning=t([r["reasoning_tokens"] for r in kept]),
        has_answer=t([r.get("extracted") is not None for r in kept], torch.bool),
        old_logp=old if all(o is not None for o in old) else None, dropped=dropped,
    )


def sampling_of(verified_dir) -> dict | None:
    """The sampling settings (temperature, top_k, top_p, ...) of the samples a Verified shard
    was made from, read from the manifests (None when they cannot be found)."""
    manifest = shards.read_manifest(verified_dir) or {}
    source = (manifest.get("inputs") or {}).get("samples")
    samples = shards.read_manifest(source) if source else None
    return ((samples or {}).get("config") or {}).get("sampling")


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


def token_scope(data: Rollouts, obj: ObjectiveConfig) -> list[list[float]] | None:
    """Per-token 1/0 masks restricting negatives to their divergent suffix (pcl's neg_scope)."""
    if not isinstance(obj, PCLObjective) or obj.neg_scope == "all":
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


def sample_signal(obj: ObjectiveConfig, data: Rollouts) -> Tensor:
    """Per-sample reward or advantage (M,) the objective trains with, computed once."""
    r = data.rewards
    if isinstance(obj, PCLObjective):
        if obj.baseline == "group":
            r = losses.group_advantages(r, data.groups, "none")
        scale = torch.full_like(r, obj.neg_weight)
        if obj.balance:  # each group's negatives weigh as much, together, as its positives
            p = data.group_acc.clamp(0.0, 1 - 1e-6)
            scale = scale * p / (1 - p)
        return torch.where(r < 0, r * scale, r)
    if not isinstance(obj, CLIPPED):  # rft, oreal: the reward itself
        return r
    if isinstance(obj, DiscountedObjective):
        r = losses.discounted_reward(r > 0, data.reasoning, obj.gamma,
                                     obj.format_reward * data.has_answer.float())
    if obj.overlong_max_len:
        lengths = torch.tensor([data.resp_len(i) for i in range(len(data.ids))])
        r = r + losses.soft_overlong_penalty(lengths, obj.overlong_max_len,
                                             obj.overlong_cache_len, obj.overlong_factor)
    return losses.group_advantages(r, data.groups, obj.advantage)
