"""The offline objectives' settings: one model per objective, chosen by `name`.

`OfflineConfig.objective` is a tagged union of these, so each objective accepts its own keys
only: `gamma` under `dapo` is an error naming dapo's valid keys, never silently ignored. Each
model also answers what training it needs (a reference? a moving one? behaviour log-probs? a
token reward model? held-out groups?), so no other module probes its fields or its class. Its
signal and loss step are in train_offline/objectives.py, the losses themselves in
train_offline/losses.py.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from reasoner.config.corrections import CorrectionConfig, NoCorrection
from reasoner.config.files import Strict


class _ObjectiveBase(Strict):
    """Settings every objective shares."""

    logprob_temperature: float = Field(
        1.0, gt=0, description="divide logits by this when scoring (match the sampling temperature)"
    )
    diagnostics: Literal["auto", "starting", "none"] = Field(
        "auto", description="off-policy diagnostics on every step (KL, chi2, ratio spread, lag) "
        "against the behaviour log-probs: an objective with a ratio uses its own; one without "
        "reads those the samples carry, else scores the starting model once (auto); starting: "
        "always the starting model's (one scoring pass, cached); none: no comparison and no "
        "pass (the lag is still counted)")

    @property
    def needs_reference(self) -> bool:
        """The loss reads the reference model's log-probs (a KL term, OREAL's BC anchor)."""
        return False

    @property
    def reference_moved_by(self) -> str | None:
        """The key that makes the reference move or reset during training, or None."""
        return None

    @property
    def moves_reference(self) -> bool:
        """The reference moves or resets during training (`reference_moved_by` says why)."""
        return self.reference_moved_by is not None

    @property
    def resident_reference(self) -> bool:
        """A second model stays in memory: the reference is used and moves with the policy."""
        return self.needs_reference and self.moves_reference

    @property
    def needs_old_logprobs(self) -> bool:
        """The loss is a ratio to the behaviour policy (pi / pi_old)."""
        return False

    @property
    def unbounded(self) -> str | None:
        """Why nothing stops the policy's drift from a fixed pi_old (no clip, or one that never
        binds), or None. Offline, pi_old stays the samples' policy for the whole run, so such an
        objective keeps pushing as the data ages (docs/train-offline.md, "Aged data")."""
        return None

    @property
    def reads_behaviour(self) -> bool:
        """Behaviour log-probs reach the step: for the ratio, or for the diagnostics."""
        return self.needs_old_logprobs or self.diagnostics != "none"

    @property
    def uses_token_rm(self) -> bool:
        """A token reward model is trained beside the policy (OREAL's token weights)."""
        return False

    @property
    def holds_out_groups(self) -> bool:
        """Whole groups are held out of training to watch a validation margin."""
        return False

    @property
    def resident_bytes_per_param(self) -> int:
        """Bytes per policy parameter of the models kept beside the policy while it trains: a
        moving reference (fp32 weights: 4) and a token RM (trained with AdamW: 16)."""
        return 4 * self.resident_reference + 16 * self.uses_token_rm

    def resets_at(self, step: int) -> bool:
        """After optimiser step `step` (1-based), reference <- policy and optimiser cleared."""
        return False

    def averages_at(self, step: int) -> bool:
        """After step `step`, ref <- a*pi + (1-a)*ref (a = ref_alpha)."""
        return False


class PCLObjective(_ObjectiveBase):
    """PCL-Reasoner-V1.5: -R * exp(mean log p); the options below are all off as published."""

    name: Literal["pcl"] = Field("pcl", description="PCL-Reasoner-V1.5's offline objective")
    neg_weight: float = Field(1.0, ge=0, description="scale of the negatives' term (1 = published)")
    balance: bool = Field(
        False, description="weigh each group's negatives by p/(1-p) (p = group accuracy) so they "
        "carry the weight of its positives (off = published)"
    )
    neg_scope: Literal["all", "divergent", "first"] = Field(
        "all", description="tokens a negative is pushed down on: all (published); divergent: "
        "from where it leaves every correct response of its group on; first: that token only"
    )
    baseline: Literal["none", "group"] = Field(
        "none", description="use R - mean of its group instead of R (none = published)"
    )
    kl_coef: float = Field(0.0, ge=0, description="KL (k3) to the starting model; 0 = none")

    @property
    def needs_reference(self) -> bool:
        return self.kl_coef > 0


class RFTObjective(_ObjectiveBase):
    """Rejection-sampling fine-tuning: token-mean NLL on the positives (the baseline)."""

    name: Literal["rft"] = Field("rft", description="SFT on the correct samples only")


class OREALObjective(_ObjectiveBase):
    """OREAL: behaviour cloning on positives, reshaped policy gradient on negatives, KL."""

    name: Literal["oreal"] = Field("oreal", description="OREAL (Lyu et al. 2025)")
    eta: float = Field(0.5, ge=0, description="weight of the negatives' term")
    beta: float = Field(0.01, ge=0, description="KL (k3) coefficient")
    token_weights: Literal["rm", "uniform"] = Field(
        "rm", description="token weights from a token reward model, or all 1"
    )
    rm_lr: float = Field(1e-5, gt=0, description="token reward model learning rate")
    rm_min_lr: float | None = Field(
        None, ge=0, description="cosine-decay the token RM's learning rate from rm_lr to this "
        "over its warm-up and the policy's steps (OREAL's 32B config: 2e-6 to 4e-7); "
        "null = constant rm_lr")
    rm_warmup_steps: int = Field(
        0, ge=0, description="steps that train only the token reward model before the policy "
        "starts (OREAL's actor_freeze_steps, 10 in its configs): a fresh RM gives p = 0.5, so "
        "weights clip(2p - 1) = 0 and the policy would learn nothing until it has learned")

    @property
    def needs_reference(self) -> bool:
        return True

    @property
    def uses_token_rm(self) -> bool:
        return self.token_weights == "rm"


class _RatioObjective(_ObjectiveBase):
    """An objective whose loss has a ratio to the behaviour policy pi_old: where pi_old comes
    from, and the correction it can take."""

    old_logprobs: Literal["auto", "samples", "recompute"] = Field(
        "auto", description="behaviour log-probs: those stored by infer (samples), or the "
        "starting model's computed once at logprob_temperature (recompute); auto takes the "
        "stored ones only when they come from the distribution the policy is scored on (same "
        "temperature, no top-k / top-p truncation), so that the ratio is 1 at theta_old"
    )
    allow_recompute: bool = Field(
        True, description="compute the starting model's log-probs when samples lack them"
    )
    old_logprobs_tolerance: float = Field(
        0.05, gt=0, description="stored behaviour log-probs are checked against the trainer's "
        "own on the first samples: above this mean |difference| per token (nats) they are "
        "recomputed (allow_recompute) or refused; vLLM's bf16 kernels and the trainer's differ")
    correction: CorrectionConfig = Field(
        default_factory=NoCorrection, description="off-policy correction, chosen by `name`: "
        "none, token-tis, seq-tis, icepop, geo-mask, m2-mask (docs/design.md, Corrections)")

    @property
    def needs_old_logprobs(self) -> bool:
        return True

    @property
    def unbounded(self) -> str | None:
        if self.correction.name in ("token-tis", "seq-tis"):
            return (f"objective.correction {self.correction.name} weighs each term by its capped "
                    f"ratio to pi_old in place of {self.name}'s ratio, so no clip ever binds")
        return None

    @model_serializer(mode="wrap")
    def _unsaid_when_none(self, handler: SerializerFunctionWrapHandler) -> dict:
        """A correction left at none is left out of the dumped config (a run's identity), so a
        run made before corrections existed keeps its identity."""
        data = handler(self)
        if isinstance(data, dict) and self.correction.name == "none":
            data.pop("correction", None)
        return data

    @model_validator(mode="after")
    def _diagnosed_against_pi_old(self) -> _RatioObjective:
        if self.diagnostics == "starting":
            raise ValueError(f"objective.diagnostics=starting is for objectives without a ratio: "
                             f"{self.name} compares with its own pi_old (objective.old_logprobs="
                             "recompute makes that the starting model's)")
        return self


class _GroupPolicyGradient(_RatioObjective):
    """A policy gradient on group advantages (DAPO and the objectives built like it)."""

    advantage: Literal["grpo", "rloo", "none"] = Field("grpo", description="group advantage")
    kl_coef: float = Field(0.0, ge=0, description="KL (k3) to the reference model; 0 = none")
    overlong_max_len: int | None = Field(None, ge=1, description="soft overlong: max length (DAPO 20480)")
    overlong_cache_len: int = Field(4096, ge=1, description="soft overlong: penalty ramp (DAPO 4096)")
    overlong_factor: float = Field(1.0, ge=0, description="soft overlong: penalty at max length")

    @property
    def needs_reference(self) -> bool:
        return self.kl_coef > 0


class _ClippedObjective(_GroupPolicyGradient):
    """Clipped policy gradient with group advantages (DAPO and the objectives built on it)."""

    eps_low: float = Field(0.2, ge=0, description="lower clip range (DAPO: 0.2)")
    eps_high: float = Field(0.28, ge=0, description="upper clip range (DAPO: 0.28; ProRL: 0.4)")
    clip_ratio_c: float = Field(
        3.0, gt=1, description="dual clip: for a negative advantage the token loss is at most "
        "clip_ratio_c x |A| however far the policy has moved from the behaviour policy "
        "(verl's clip_ratio_c, 3; Ye et al. 2020, dual-clip PPO)")
    agg: Literal["token-mean", "seq-mean-token-mean"] = Field(
        "token-mean", description="how token losses are averaged"
    )

    @property
    def unbounded(self) -> str | None:
        why = super().unbounded
        # the ratio is exp of a log-ratio clamped to [-20, 20]: past these no clip can bind
        if why is None and self.eps_low >= 1 and self.eps_high >= math.exp(20) - 1:
            why = (f"{self.name}'s clip is opened past any ratio (eps_low >= 1, eps_high >= "
                   "e^20 - 1) and never binds, whatever mask is set")
        return why


class DAPOObjective(_ClippedObjective):
    """DAPO (Yu et al. 2025): decoupled clip, token-mean loss, soft overlong penalty."""

    name: Literal["dapo"] = Field("dapo", description="clipped policy gradient (DAPO)")


class ProRLObjective(_ClippedObjective):
    """ProRL (Liu et al. 2025): DAPO plus a KL anchor whose reference is reset now and then."""

    name: Literal["prorl"] = Field("prorl", description="DAPO + KL + reference resets (ProRL)")
    reset_every: int | None = Field(
        None, ge=1, description="every N steps reference <- policy and optimiser state cleared"
    )
    reset_patience: int | None = Field(
        None, ge=1, description="also reset when the validation margin (held-out positives' "
        "minus negatives' geometric-mean probability) has not improved for N checks"
    )
    val_fraction: float = Field(0.05, gt=0, lt=1, description="share of groups held out for "
                                "the validation margin (only with reset_patience)")
    val_every: int = Field(20, ge=1, description="steps between validation checks")

    @property
    def reference_moved_by(self) -> str | None:
        return ("reset_every" if self.reset_every else
                "reset_patience" if self.reset_patience else None)

    @property
    def holds_out_groups(self) -> bool:
        return self.reset_patience is not None

    def resets_at(self, step: int) -> bool:
        return bool(self.reset_every) and step % self.reset_every == 0


class DiscountedObjective(_ClippedObjective):
    """Length-efficient RL: reward gamma^K for a correct answer after K reasoning tokens."""

    name: Literal["discounted"] = Field("discounted", description="discounted reward (clipped PG)")
    gamma: float = Field(0.999, gt=0, le=1, description="reward gamma^K (K think tokens)")
    format_reward: float = Field(0.0, description="undiscounted reward for a final answer")
    ref_update_every: int | None = Field(
        None, ge=1, description="moving reference, updated every M steps"
    )
    ref_alpha: float = Field(0.1, ge=0, le=1, description="moving reference: ref <- a*pi + (1-a)*ref")

    @property
    def reference_moved_by(self) -> str | None:
        return "ref_update_every" if self.ref_update_every else None

    def averages_at(self, step: int) -> bool:
        return bool(self.ref_update_every) and step % self.ref_update_every == 0


class GSPOObjective(_GroupPolicyGradient):
    """GSPO (Zheng et al. 2025): the clipped objective on each response's length-normalised
    sequence ratio, every response weighing the same."""

    name: Literal["gspo"] = Field("gspo", description="clipped sequence-level ratio (GSPO)")
    eps_low: float = Field(3e-4, ge=0, description="lower clip range of the sequence ratio "
                           "(GSPO, Sec. 5.1: 3e-4)")
    eps_high: float = Field(4e-4, ge=0, description="upper clip range of the sequence ratio "
                            "(GSPO, Sec. 5.1: 4e-4)")


class CISPOObjective(_GroupPolicyGradient):
    """CISPO (MiniMax-M1, 2025): every token's log-prob under a clipped, stop-gradient importance
    weight; no token's gradient is dropped."""

    name: Literal["cispo"] = Field("cispo", description="clipped IS weight, stop-gradient (CISPO)")
    eps_low: float | None = Field(None, ge=0, description="the weight's lower bound is 1 - "
                                  "eps_low; null: none (MiniMax-M1 sets none)")
    eps_high: float = Field(4.0, ge=0, description="the weight's upper bound is 1 + eps_high "
                            "(5: ScaleRL's recommended cap for CISPO, as TRL documents it)")
    agg: Literal["token-mean", "seq-mean-token-mean"] = Field(
        "token-mean", description="how token losses are averaged (MiniMax-M1: token-mean)")

    @property
    def unbounded(self) -> str | None:
        return super().unbounded or ("cispo weighs every token's gradient by its capped ratio to "
                                     "pi_old and drops none")


class OAPLObjective(_RatioObjective):
    """OAPL (Ritter et al. 2026): a least-squares regression of beta * log(pi / pi_lag) onto the
    optimal advantage r - V(x), V from the rewards of x's group; no importance weights."""

    name: Literal["oapl"] = Field("oapl", description="optimal-advantage regression to the "
                                  "lagged policy (OAPL)")
    beta: float = Field(1e-3, gt=0, description="KL coefficient of the regression: "
                        "beta * sum_t log(pi/pi_lag) is fitted to r - V(x) (A*-PO's beta2, 1e-3)")
    beta_value: float = Field(0.5, gt=0, description="temperature of the value estimate "
                              "V(x) = beta_value * ln mean_j exp(r_j / beta_value) over x's "
                              "group (A*-PO's beta1, 0.5)")

    @model_validator(mode="after")
    def _sequence_corrections_only(self) -> OAPLObjective:
        if self.correction.name not in ("none", "geo-mask"):
            raise ValueError(
                f"objective.correction {self.correction.name!r} does not fit oapl: it regresses "
                "toward the lagged policy itself, without importance weights, and a token mask "
                "would change the sequence log-ratio it fits; none or geo-mask (a whole sample)")
        return self


ObjectiveConfig = Annotated[
    PCLObjective | RFTObjective | OREALObjective | DAPOObjective | ProRLObjective
    | DiscountedObjective | GSPOObjective | CISPOObjective | OAPLObjective,
    Field(discriminator="name"),
]
OBJECTIVE_MODELS: dict[str, type[Strict]] = {
    "pcl": PCLObjective, "rft": RFTObjective, "oreal": OREALObjective, "dapo": DAPOObjective,
    "prorl": ProRLObjective, "discounted": DiscountedObjective, "gspo": GSPOObjective,
    "cispo": CISPOObjective, "oapl": OAPLObjective}
