"""Off-policy diagnostics: how far the policy being trained has moved from the policy that wrote
its samples, and how long ago that was (docs/design.md, "Off-policy diagnostics").

Every train-offline step compares the log-probs it computes anyway with the behaviour log-probs
(the objective's pi_old, or those read for the diagnostics alone: behaviour.py), so they cost
no forward. With rho_t = pi(y_t) / pi_b(y_t) on the behaviour policy's own tokens:
KL(pi_b || pi) by Schulman's k3, E[rho^2] - 1 (chi-square, what importance weights' variance
grows with), the mean log-ratio, the share of tokens whose rho is outside [1/c, c], and the
spread of each sample's geometric-mean ratio. Each is a share of its mean over the global batch,
as the losses are (losses.global_share), so micro-batches and processes add up to the batch's
value. The lag is counted on the host: optimiser steps since the samples' model, and rounds.
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from reasoner import shards
from reasoner.config import ObjectiveConfig
from reasoner.errors import ShardError
from reasoner.train_offline import behaviour, losses

BAND = 2.0  # c: a token whose rho is outside [1/2, 2] counts as far off the behaviour policy
SQUARES = "offpolicy_seq_ratio_sq"  # E[(g - 1)^2] over samples: becomes the std (`spread`)


@dataclass(frozen=True)
class Gap:
    """A micro-batch's diagnostics: shares of global means (they add up over the step), and
    extremes (the step's largest and smallest)."""

    shares: dict[str, Tensor]
    maxima: dict[str, Tensor] = field(default_factory=dict)
    minima: dict[str, Tensor] = field(default_factory=dict)


def diagnostics(logp: Tensor, old_logp: Tensor, sample_index: Tensor, num_samples: int,
                band: float = BAND, global_tokens: float | None = None,
                global_samples: float | None = None) -> Gap:
    """The policy's log-probs `logp` (N,) against the behaviour's `old_logp` (N,), with
    d = log rho clamped to [-20, 20] and g_i = exp(m_i(d)) each sample's geometric-mean ratio:

      offpolicy_kl_k3        mean_t (rho - 1 - d)     KL(pi_b || pi), k3 (Schulman 2020)
      offpolicy_chi2         mean_t rho^2 - 1         chi-square(pi || pi_b)
      offpolicy_log_ratio    mean_t d                 -KL(pi_b || pi), k1
      offpolicy_ratio_outside  share of tokens with rho < 1/band or rho > band
      offpolicy_seq_ratio    mean_i g_i (its std: `spread`, from mean_i (g_i - 1)^2;
                             _max, _min: extremes)

    Token means are shares of `global_tokens`, sample means of `global_samples` (None: this
    batch's own means). Nothing here is read back, nor differentiated.
    """
    with torch.no_grad():
        d = (logp.detach() - old_logp).clamp(-20.0, 20.0)  # (N,)
        rho = d.exp()  # (N,)
        geo = losses.segment_mean(d, sample_index, num_samples).exp()  # (B,)

        def per_token(x: Tensor) -> Tensor:
            return losses.global_share(x.mean(), x.numel(), global_tokens).detach()

        def per_sample(x: Tensor) -> Tensor:
            return losses.global_share(x.mean(), num_samples, global_samples).detach()

        return Gap({"offpolicy_kl_k3": per_token(rho - 1 - d),
                    "offpolicy_chi2": per_token(rho * rho - 1),
                    "offpolicy_log_ratio": per_token(d),
                    "offpolicy_ratio_outside": per_token(((rho < 1 / band) | (rho > band)).float()),
                    "offpolicy_seq_ratio": per_sample(geo),
                    SQUARES: per_sample((geo - 1) * (geo - 1))},
                   {"offpolicy_seq_ratio_max": geo.max()}, {"offpolicy_seq_ratio_min": geo.min()})


def spread(metrics: dict[str, float]) -> dict[str, float]:
    """A step's reduced metrics with E[(g - 1)^2] replaced by the standard deviation of the
    samples' geometric-mean ratios, sqrt(E[(g - 1)^2] - (E[g] - 1)^2), both moments summed over
    the whole step. Taken about 1, where g lies: E[g^2] - E[g]^2 would subtract two numbers
    that agree to 6 digits in float32 (1e-6 apart at the quickstart's first steps)."""
    if SQUARES not in metrics:
        return metrics
    squares, shift = metrics.pop(SQUARES), metrics["offpolicy_seq_ratio"] - 1
    metrics["offpolicy_seq_ratio_std"] = math.sqrt(max(squares - shift * shift, 0.0))
    return metrics


@dataclass(frozen=True)
class Lag:
    """How old the samples are when this run starts: train-offline rounds between the model
    that wrote them and the starting model, and the optimiser steps of those rounds."""

    rounds: int
    steps: int
    said: str  # in words, for the summary

    def at(self, step: int) -> dict[str, float]:
        """The lag at 0-based step `step` of this run: `step` updates since its start."""
        return {"lag_steps": float(self.steps + step), "lag_rounds": float(self.rounds)}


def _same(a: str, b: str) -> bool:
    return a == b or Path(a).resolve() == Path(b).resolve()


def _trained_from(model: str) -> tuple[str, int] | None:
    """(the model a train-offline run started from, its optimiser steps) when `model` is that
    run's `final/` or `checkpoint-N/`; None when it is not a train-offline output."""
    path = Path(model)
    try:
        manifest = shards.read_manifest(path.parent) if path.parent.is_dir() else None
    except ShardError:  # a broken manifest: the chain ends here, the summary says so
        return None
    if not manifest or manifest.get("stage") != "train-offline":
        return None
    checkpoint = re.fullmatch(r"checkpoint-(\d+)", path.name)
    steps = (int(checkpoint.group(1)) if checkpoint else
             (manifest.get("counts") or {}).get("steps") if path.name == "final" else None)
    start = ((manifest.get("config") or {}).get("model") or {}).get("name_or_path")
    return (str(start), int(steps)) if start and steps is not None else None


def lag_of(start: str, verified_dir: Path, hops: int = 64) -> Lag:
    """The lag of a run from `start` on the samples of `verified_dir`: the samples' model is
    found through the shards' manifests (behaviour.samples_model), then looked for among
    `start` and the models it was trained from by train-offline, each hop one round. Not found:
    rounds and earlier steps are unknown, the lag counts this run's steps, and `said` says why."""
    wrote, why = behaviour.samples_model(verified_dir)
    if wrote is None:
        return Lag(0, 0, f"unknown ({why}): lag_steps counts this run's steps only")
    model, rounds, steps = start, 0, 0
    for _ in range(hops):
        if _same(model, wrote):
            return Lag(rounds, steps, f"samples written by {wrote}, {rounds} round(s) and "
                                      f"{steps} step(s) before this run's start")
        earlier = _trained_from(model)
        if earlier is None:
            break
        model, rounds, steps = earlier[0], rounds + 1, steps + earlier[1]
    return Lag(0, 0, f"unknown: the samples' model {wrote} is neither {start} nor a model it "
                     "was trained from by train-offline; lag_steps counts this run's steps only")


def warn_unbounded(obj: ObjectiveConfig, is_main: bool) -> None:
    """Say at the start when nothing bounds how far the objective moves the policy from the
    samples' (`ObjectiveConfig.unbounded`): on aged data such objectives collapsed."""
    if obj.unbounded and is_main:
        print(f"reasoner train-offline: warning: {obj.unbounded}, so nothing bounds how far the "
              "policy moves from the samples' over many steps on one rollout set (measured "
              "collapses: docs/train-offline.md, \"Aged data\"); dapo's or gspo's clipped ratio "
              "bounds it", file=sys.stderr)
