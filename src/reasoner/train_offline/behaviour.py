"""pi_old of the objectives with a ratio: where the behaviour log-probs come from, and a check
that the stored ones are the trainer's own at theta_old; for the others, those the off-policy
diagnostics read (`for_diagnostics`).

Stored log-probs are those of the distribution the sampler drew from (logits / T, top-k,
top-p) computed by the sampler's kernels. The clipped objectives assume the ratio pi / pi_old
is 1 at theta_old; that holds only when the policy is scored at the same temperature over the
whole vocabulary with the same numerics. `behaviour_logprobs` decides from the samples'
sampling settings (`sampling_of` follows the Verified shard's manifest to the samples' own);
`check_behaviour` scores the first samples with the starting policy and compares.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from reasoner import device as dev
from reasoner import outputs, shards
from reasoner.config import ObjectiveConfig
from reasoner.device import Env
from reasoner.errors import ShardError, TrainingError
from reasoner.train_offline import kl_reference
from reasoner.train_offline.rollouts import Batching, Rollouts

CHECKED = 16  # samples whose stored behaviour log-probs are compared with the trainer's

def gap_parts(stored: list[list[float]], scored: list[list[float]]) -> tuple[list[float],
                                                                         list[float]]:
    """What `behaviour_gap` is made of, as sums (|stored - scored|, ratio, tokens) and maxima
    (|stored - scored|, ratio, -ratio) that add up and max up over processes."""
    a = torch.tensor([x for row in stored for x in row], dtype=torch.float64)  # (N,)
    b = torch.tensor([x for row in scored for x in row], dtype=torch.float64)  # (N,)
    if a.shape != b.shape:
        raise TrainingError(f"stored behaviour log-probs cover {a.numel()} tokens, the trainer "
                            f"scores {b.numel()}: the samples do not match their token ids")
    if not a.numel():
        return [0.0, 0.0, 0.0], [-math.inf, -math.inf, -math.inf]
    gap, ratio = (a - b).abs(), (b - a).exp()
    return ([float(gap.sum()), float(ratio.sum()), float(a.numel())],
            [float(gap.max()), float(ratio.max()), float(-ratio.min())])


def gap_of(sums: list[float], tops: list[float]) -> dict[str, float]:
    """mean and max |stored - scored| per token, and the mean and extremes of the ratio
    exp(scored - stored), which the clipped objectives assume is 1 at theta_old."""
    n = max(sums[2], 1.0)
    return {"mean_abs_diff": sums[0] / n, "max_abs_diff": tops[0], "ratio_mean": sums[1] / n,
            "ratio_min": -tops[2], "ratio_max": tops[1]}


def behaviour_gap(stored: list[list[float]], scored: list[list[float]]) -> dict[str, float]:
    """How far stored behaviour log-probs are from the trainer's own at theta_old (`gap_of`)."""
    return gap_of(*gap_parts(stored, scored))


@dataclass(frozen=True)
class Drawn:
    """How the samples of a Verified shard were drawn, as infer recorded it (`settings`: its
    `sampling` config), or why that cannot be known (`unknown_because`)."""

    settings: dict | None
    unknown_because: str = ""


def samples_manifest(verified_dir: Path) -> tuple[dict | None, str]:
    """(the manifest of the Sample shard a Verified shard was made from, that folder), found
    through verify's manifest (it records the folder it read, and what that folder was then),
    or (None, why it cannot be had). A broken chain is no error: what reads it says why (a
    broken manifest of the Verified shard itself raises ShardError)."""
    manifest = shards.read_manifest(verified_dir) or {}
    inputs = manifest.get("inputs") or {}
    key = "input_dir" if "input_dir" in inputs else "samples"  # older verify: "samples"
    source = inputs.get(key)
    if not source:
        return None, (f"{Path(verified_dir) / shards.MANIFEST} names no samples folder (a "
                      "Verified shard made by hand or by an older reasoner); rerun "
                      "`reasoner verify` on the samples")
    try:
        samples = shards.read_manifest(source)
    except ShardError as exc:  # a broken manifest of the samples: say so
        return None, str(exc)
    if samples is None:
        return None, (f"{source}, the samples {verified_dir} was verified from, has no "
                      f"{shards.MANIFEST} (moved or deleted since; a relative path is read "
                      "from the current folder)")
    then = ((manifest.get("input_identity") or {}).get(key) or {}).get("digest")
    if then is not None and outputs.input_identity("shard folder", source)["digest"] != then:
        return None, (f"{source} has changed since {verified_dir} was verified from it "
                      "(infer rerun there?), so its settings may not be these samples'")
    return samples, str(source)


def sampling_of(verified_dir: Path) -> Drawn:
    """How the samples of a Verified shard were drawn: infer's sampling settings, read from the
    samples' manifest (`samples_manifest`). A broken chain is no error: the stored log-probs
    are then recomputed, and `Drawn` says why."""
    samples, where = samples_manifest(verified_dir)
    if samples is None:
        return Drawn(None, where)
    settings = (samples.get("config") or {}).get("sampling")
    if not isinstance(settings, dict):
        return Drawn(None, f"{Path(where) / shards.MANIFEST} records no sampling settings")
    return Drawn(settings)


def samples_model(verified_dir: Path) -> tuple[str | None, str]:
    """(the model infer wrote the samples of a Verified shard with, or None; why not)."""
    try:
        samples, where = samples_manifest(verified_dir)
    except ShardError as exc:
        return None, str(exc)
    model = ((samples or {}).get("config") or {}).get("model") or {}
    if samples is not None and not model.get("name_or_path"):
        return None, f"{Path(where) / shards.MANIFEST} records no model"
    return model.get("name_or_path"), where


def _mismatch(obj: ObjectiveConfig, sampling: dict | None) -> list[str]:
    """Why the distribution the samples were drawn from is not the one the policy is scored
    on: another temperature, a truncation (empty when they match or are unknown)."""
    if sampling is None:
        return []
    found = []
    t = sampling.get("temperature", 1.0)
    if abs(t - obj.logprob_temperature) > 1e-9:
        found.append(f"sampled at temperature {t}, scored at objective.logprob_temperature "
                     f"{obj.logprob_temperature}")
    if (sampling.get("top_k") or 0) > 0 or sampling.get("top_p", 1.0) < 1.0:
        found.append(f"sampled with top_k {sampling.get('top_k')} / top_p "
                     f"{sampling.get('top_p')}, which truncate the distribution")
    return found


def behaviour_logprobs(obj: ObjectiveConfig, data: Rollouts, verified_dir: Path
                       ) -> tuple[bool, str]:
    """(recompute them with the starting model?, where they come from, in words).

    Stored log-probs are those of the distribution the sampler drew from: logits / T, top-k,
    top-p. The policy is scored at logprob_temperature over the whole vocabulary, so the
    ratio pi/pi_old is 1 at theta_old only when T matches and nothing was truncated; `auto`
    uses them only then (the settings read through `sampling_of`) and recomputes them
    otherwise; an explicit `samples` with another temperature is an error. Objectives without
    a ratio read nothing here.
    """
    if not obj.needs_old_logprobs:
        return for_diagnostics(obj, data, verified_dir)
    mode = obj.old_logprobs
    if data.old_logp is None and mode != "recompute" and not obj.allow_recompute:
        raise TrainingError(
            f"objective {obj.name} needs the behaviour log-probs of the samples, and "
            f"{data.keys[0]} has none: rerun `reasoner infer` with sampling.logprobs=true, "
            "or set objective.allow_recompute=true to use the starting model's log-probs")
    if mode == "recompute":
        return True, "recomputed by the starting model (objective.old_logprobs=recompute)"
    if data.old_logp is None:
        return True, "recomputed by the starting model (the samples carry none)"
    drawn = sampling_of(verified_dir)
    mismatch = _mismatch(obj, drawn.settings)
    unknown = f"the samples' sampling settings are unknown: {drawn.unknown_because}"
    if mode == "auto" and (mismatch or drawn.settings is None):
        return True, f"recomputed by the starting model ({'; '.join(mismatch) or unknown})"
    if drawn.settings is None:
        return False, f"stored by infer, as objective.old_logprobs=samples asks ({unknown})"
    if mismatch and mismatch[0].startswith("sampled at temperature"):
        raise TrainingError(
            f"objective.old_logprobs=samples, but the samples were {mismatch[0]}: the ratio "
            f"would not be 1 at theta_old. Set objective.logprob_temperature="
            f"{drawn.settings['temperature']}, or objective.old_logprobs=auto to recompute them")
    if mismatch:
        return False, f"stored by infer ({mismatch[-1]}: the ratio is below 1 at theta_old)"
    return False, "stored by infer"


def for_diagnostics(obj: ObjectiveConfig, data: Rollouts, verified_dir: Path
                    ) -> tuple[bool, str]:
    """An objective without a ratio reads behaviour log-probs for the off-policy diagnostics
    alone: (score the starting model once, cached?, where they come from, in words). Those the
    samples carry when they carry them (`auto`; the words say when the samples were drawn from
    another distribution than the policy is scored on: rho is then not 1 at theta_old), else the
    starting model's; nothing it trains with depends on them, nor on the manifests read here."""
    if obj.diagnostics == "none":
        return False, "not used (objective.diagnostics=none)"
    scored = "the starting model's, scored once, for the off-policy diagnostics only"
    if obj.diagnostics == "starting":
        return True, f"{scored} (objective.diagnostics=starting)"
    if data.old_logp is None:
        return True, f"{scored} (the samples carry none; objective.diagnostics=none skips it)"
    try:
        drawn = sampling_of(verified_dir)
    except ShardError as exc:  # the Verified shard's own manifest is broken: say so, go on
        drawn = Drawn(None, str(exc))
    mismatch = _mismatch(obj, drawn.settings)
    note = ("; ".join(mismatch) + ": rho is not 1 at theta_old" if mismatch else
            "" if drawn.settings is not None else
            f"the samples' sampling settings are unknown: {drawn.unknown_because}")
    return False, "stored by infer, for the off-policy diagnostics only" + (
        f" ({note})" if note else "")


def check_behaviour(obj: ObjectiveConfig, data: Rollouts, policy: nn.Module,
                    batching: Batching, env: Env, note: str
                    ) -> tuple[bool, str, dict[str, float]]:
    """Score the first samples with the starting policy and compare with the stored behaviour
    log-probs: (recompute them?, where they come from, the gap). A sampler whose kernels or
    precision differ from the trainer's (vLLM in bf16 on a GPU) gives a ratio that is not 1
    at theta_old; above objective.old_logprobs_tolerance the run recomputes them (or stops).

    Each data-parallel group scores its own share of the checked samples, packed as training
    packs them; the gap is reduced over every process before the decision, so that all make
    the same one (ranks deciding differently would wait forever in the recompute's forwards)."""
    dist = env.dist
    first = list(range(min(max(CHECKED, dist.dp_size), len(data.ids))))
    scored = kl_reference.score_share(policy, data, first, batching, env)
    mine = sorted(scored)
    sums, tops = gap_parts([list(data.old_logp[i]) for i in mine], [scored[i] for i in mine])
    if dist.sp_rank:  # a group's members scored the same samples: its first one counts them
        sums = [0.0, 0.0, 0.0]
    gap = gap_of(dev.all_reduce(sums, dist, env.device),
                 dev.all_reduce(tops, dist, env.device, "max"))
    said = (f"stored vs trainer on {len(first)} samples: mean |Δ| {gap['mean_abs_diff']:.4f}, "
            f"max {gap['max_abs_diff']:.4f}, ratio {gap['ratio_min']:.3f}-{gap['ratio_max']:.3f}")
    if gap["mean_abs_diff"] <= obj.old_logprobs_tolerance:
        return False, f"{note} ({said})", gap
    if not obj.allow_recompute:
        raise TrainingError(
            f"the stored behaviour log-probs are not the trainer's at theta_old ({said}; "
            f"objective.old_logprobs_tolerance={obj.old_logprobs_tolerance}): set "
            "objective.allow_recompute=true to recompute them, or raise the tolerance")
    return True, f"recomputed by the starting model ({said}, over the tolerance)", gap
