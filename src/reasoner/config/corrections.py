"""The off-policy corrections an objective with a ratio can take: one model per correction,
chosen by `name` under `objective.correction` (a tagged union, like the objectives: `cap` under
`icepop` is an error naming icepop's keys). What each one computes is
`train_offline/losses.correct`'s (docs/design.md, "Corrections"); every field below goes to it
by name.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from reasoner.config.files import Strict


class NoCorrection(Strict):
    """No correction: the objective's own ratio to the behaviour policy, as published."""

    name: Literal["none"] = Field("none", description="no correction")


class TokenTIS(Strict):
    """Token-level truncated importance sampling: each token's term weighted by
    sg(min(rho_t, cap)) in place of the objective's ratio (taken to the step's own policy)."""

    name: Literal["token-tis"] = Field("token-tis", description="token-level truncated IS")
    cap: float = Field(2.0, gt=0, description="C: the largest weight (verl's rollout_is_threshold "
                       "default, 2)")


class SequenceTIS(Strict):
    """Sequence-level truncated importance sampling: every token of a sample weighted by
    sg(min(prod_t rho_t, cap)) in place of the objective's ratio."""

    name: Literal["seq-tis"] = Field("seq-tis", description="sequence-level truncated IS")
    cap: float = Field(2.0, gt=0, description="C: the largest weight (verl's rollout_is_threshold "
                       "default, 2)")


class _Band(Strict):
    low: float
    high: float

    @model_validator(mode="after")
    def _ordered(self) -> _Band:
        if self.low >= self.high:
            raise ValueError(f"objective.correction: low ({self.low}) must be below high "
                             f"({self.high})")
        return self


class IcePop(_Band):
    """IcePop-style token masking: a token whose rho_t is below low or above high is dropped
    from the loss; the others keep the objective's own ratio to the behaviour policy."""

    name: Literal["icepop"] = Field("icepop", description="token mask: rho below low or above "
                                    "high")
    low: float = Field(0.5, gt=0, description="alpha: a token whose rho is below it is dropped "
                       "(IcePop's 0.5)")
    high: float = Field(5.0, gt=0, description="beta: a token whose rho is above it is dropped "
                        "(IcePop's 5)")


class GeometricMask(_Band):
    """Geometric sequence masking: a sample whose geometric-mean ratio exp(mean_t log rho_t) is
    below low or above high is dropped whole; the others keep the objective's own ratio."""

    name: Literal["geo-mask"] = Field("geo-mask", description="sequence mask: the geometric-mean "
                                      "ratio below low or above high")
    low: float = Field(0.999, gt=0, description="below it a sample is dropped (verl's geometric "
                       "RS preset, 0.999: built for sampler mismatch; widen it for aged data)")
    high: float = Field(1.001, gt=0, description="above it a sample is dropped (verl's, 1.001)")


class SecondMomentMask(Strict):
    """M2PO's second-moment mask: the tokens with the largest (log rho_t)^2 are dropped, largest
    first, until the mean of the others is below tau; the others keep the objective's ratio."""

    name: Literal["m2-mask"] = Field("m2-mask", description="token mask: the largest squared "
                                     "log-ratios until their mean over the rest is below tau")
    tau: float = Field(0.04, gt=0, description="tau_M2: the bound on the kept tokens' mean "
                       "(log rho)^2 (M2PO's 0.04)")


CorrectionConfig = Annotated[
    NoCorrection | TokenTIS | SequenceTIS | IcePop | GeometricMask | SecondMomentMask,
    Field(discriminator="name")]
CORRECTIONS = ("none", "token-tis", "seq-tis", "icepop", "geo-mask", "m2-mask")
