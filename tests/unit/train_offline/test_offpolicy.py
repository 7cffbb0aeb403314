"""Off-policy diagnostics against hand-computed values, and the lag found through the manifests."""

import math

import pytest
import torch

from reasoner import shards
from reasoner.train_offline import offpolicy

# rho = 2, 0.5 (sample 0) and 1, 4 (sample 1): geometric means 1 and 2
LOGP = torch.log(torch.tensor([2.0, 0.5, 1.0, 4.0]))
OLD = torch.zeros(4)
IDX = torch.tensor([0, 0, 1, 1])


def read(gap: offpolicy.Gap) -> dict[str, float]:
    return {k: float(v) for part in (gap.shares, gap.maxima, gap.minima) for k, v in part.items()}


def test_diagnostics_hand_computed():
    """k3 = mean(rho - 1 - log rho) = ((1 - ln 2) + (-0.5 + ln 2) + 0 + (3 - ln 4)) / 4;
    chi2 = mean(rho^2) - 1 = (4 + 0.25 + 1 + 16) / 4 - 1; mean log-ratio ln 4 / 4; one token
    of four outside [1/2, 2] (the bounds are inside); geometric means 1 and 2: mean 1.5, std
    sqrt(((1 - 1)^2 + (2 - 1)^2) / 2 - (1.5 - 1)^2) = 0.5."""
    m = offpolicy.spread(read(offpolicy.diagnostics(LOGP, OLD, IDX, 2)))
    assert m == pytest.approx({
        "offpolicy_kl_k3": (3.5 - 2 * math.log(2)) / 4, "offpolicy_chi2": 4.3125,
        "offpolicy_log_ratio": math.log(4) / 4, "offpolicy_ratio_outside": 0.25,
        "offpolicy_seq_ratio": 1.5, "offpolicy_seq_ratio_std": 0.5,
        "offpolicy_seq_ratio_max": 2.0, "offpolicy_seq_ratio_min": 1.0})
    same = read(offpolicy.diagnostics(OLD, OLD, IDX, 2))  # the policy is the behaviour policy
    assert same["offpolicy_kl_k3"] == same["offpolicy_chi2"] == same["offpolicy_log_ratio"] == 0
    assert same["offpolicy_seq_ratio_sq"] == 0.0 and same["offpolicy_seq_ratio"] == 1.0


def test_diagnostics_of_micro_batches_add_up_to_the_batchs():
    """Given the global counts, each micro-batch's values are shares that sum to the whole
    batch's (as `training.accumulate` sums them); extremes are maxima and minima."""
    whole = read(offpolicy.diagnostics(LOGP, OLD, IDX, 2))
    parts = [read(offpolicy.diagnostics(LOGP[s], OLD[s], torch.tensor([0, 0]), 1,
                                        global_tokens=4, global_samples=2))
             for s in (slice(0, 2), slice(2, 4))]
    for k, v in whole.items():
        if k.endswith("_max"):
            assert max(p[k] for p in parts) == v
        elif k.endswith("_min"):
            assert min(p[k] for p in parts) == v
        else:
            assert sum(p[k] for p in parts) == pytest.approx(v), k


def test_nothing_is_differentiated_or_read_back():
    logp = LOGP.clone().requires_grad_()
    gap = offpolicy.diagnostics(logp, OLD, IDX, 2)
    assert all(not v.requires_grad and v.dim() == 0 for v in gap.shares.values())


def write(folder, **fields):
    shards.update_manifest(folder, **fields)
    return folder


def test_the_lag_follows_the_models_back_to_the_one_that_wrote_the_samples(tmp_path):
    """Samples of sft/final, trained on by round 2's run, which starts from round 1's final (250
    steps from sft/final): one round and 250 steps before it starts; from sft/final: none."""
    sft = tmp_path / "sft" / "final"
    samples = write(tmp_path / "samples", stage="infer",
                    config={"model": {"name_or_path": str(sft)}})
    verified = write(tmp_path / "verified", stage="verify", inputs={"input_dir": str(samples)})
    write(tmp_path / "rl", stage="train-offline", counts={"steps": 250},
          config={"model": {"name_or_path": str(sft)}})
    lag = offpolicy.lag_of(str(tmp_path / "rl" / "final"), verified)
    assert (lag.rounds, lag.steps) == (1, 250) and lag.at(3) == {"lag_steps": 253.0,
                                                                 "lag_rounds": 1.0}
    assert "1 round(s) and 250 step(s) before" in lag.said
    at_40 = offpolicy.lag_of(str(tmp_path / "rl" / "checkpoint-40"), verified)
    assert (at_40.rounds, at_40.steps) == (1, 40)
    assert offpolicy.lag_of(str(sft), verified).at(7) == {"lag_steps": 7.0, "lag_rounds": 0.0}


def test_an_unknown_lag_counts_this_runs_steps_and_says_why(tmp_path):
    verified = write(tmp_path / "verified", stage="verify")  # made by hand: no samples folder
    lag = offpolicy.lag_of("any/model", verified)
    assert (lag.rounds, lag.steps) == (0, 0) and "names no samples folder" in lag.said
    samples = write(tmp_path / "samples", stage="infer", config={"model": {"name_or_path": "a"}})
    verified = write(tmp_path / "v2", stage="verify", inputs={"input_dir": str(samples)})
    lag = offpolicy.lag_of("b", verified)
    assert lag.said.startswith("unknown: the samples' model a is neither b nor")
    (verified / shards.MANIFEST).write_text("{")  # broken: said, never raised
    assert "not valid JSON" in offpolicy.lag_of("b", verified).said


def test_an_unbounded_objective_is_named_at_the_start_by_the_main_process_only(capsys):
    from reasoner.config import OfflineConfig, load

    base = ["model.name_or_path=m", "input_dir=v", "output_dir=o"]
    cispo = load(OfflineConfig, None, [*base, "objective.name=cispo"]).objective
    offpolicy.warn_unbounded(cispo, is_main=False)
    assert capsys.readouterr().err == ""
    offpolicy.warn_unbounded(cispo, is_main=True)
    err = capsys.readouterr().err
    assert err.startswith("reasoner train-offline: warning: cispo weighs every token's gradient")
    assert 'docs/train-offline.md, "Aged data"' in err
    for bounded in ("dapo", "gspo", "pcl", "oapl"):
        obj = load(OfflineConfig, None, [*base, f"objective.name={bounded}"]).objective
        offpolicy.warn_unbounded(obj, is_main=True)
        assert capsys.readouterr().err == ""
