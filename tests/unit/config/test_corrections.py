"""The corrections' settings: one key under every objective with a ratio, each correction with
its own keys, refused where it does not fit, and left out of a run's identity when none."""

import pytest

from reasoner.config import CORRECTIONS, OBJECTIVE_MODELS, ConfigError, OfflineConfig, dump, load

BASE = ["model.name_or_path=m", "input_dir=v", "output_dir=o"]


def test_a_correction_takes_only_its_own_keys():
    cfg = load(OfflineConfig, None, [*BASE, "objective.name=dapo",
                                     "objective.correction.name=token-tis",
                                     "objective.correction.cap=3"])
    assert cfg.objective.correction.name == "token-tis" and cfg.objective.correction.cap == 3
    with pytest.raises(ConfigError) as err:  # cap is the IS corrections', not icepop's
        load(OfflineConfig, None, [*BASE, "objective.name=dapo",
                                   "objective.correction.name=icepop",
                                   "objective.correction.cap=3"])
    assert ("unknown key 'objective.correction.cap'; valid keys for objective.correction "
            "'icepop': low, high, name") in str(err.value)
    with pytest.raises(ConfigError, match="'objective.correction.name' must be one of 'none', "
                                          "'token-tis', 'seq-tis', 'icepop', 'geo-mask', "
                                          "'m2-mask'"):
        load(OfflineConfig, None, [*BASE, "objective.name=dapo", "objective.correction.name=x"])
    with pytest.raises(ConfigError, match="low .2.0. must be below high .1.5."):
        load(OfflineConfig, None, [*BASE, "objective.name=gspo", "objective.correction.name=icepop",
                                   "objective.correction.low=2", "objective.correction.high=1.5"])


@pytest.mark.parametrize("name", sorted(OBJECTIVE_MODELS))
def test_only_objectives_with_a_ratio_take_a_correction(name):
    """pcl, rft and oreal have no ratio: `correction` under them is an unknown key naming their
    valid keys; oapl takes a whole-sample mask only."""
    cfg = [*BASE, f"objective.name={name}", "objective.correction.name=geo-mask"]
    if not OBJECTIVE_MODELS[name]().needs_old_logprobs:
        with pytest.raises(ConfigError, match=f"unknown key 'objective.correction'; valid keys "
                                              f"for objective '{name}':"):
            load(OfflineConfig, None, cfg)
        return
    assert load(OfflineConfig, None, cfg).objective.correction.name == "geo-mask"
    for kind in CORRECTIONS:
        overrides = [*BASE, f"objective.name={name}", f"objective.correction.name={kind}"]
        if name == "oapl" and kind not in ("none", "geo-mask"):
            with pytest.raises(ConfigError, match=f"correction '{kind}' does not fit oapl"):
                load(OfflineConfig, None, overrides)
        else:
            assert load(OfflineConfig, None, overrides).objective.correction.name == kind


def test_no_correction_and_the_diagnostics_leave_the_identity_as_it_was():
    """A run made before corrections and diagnostics existed keeps its identity: a correction
    left at none is not dumped, and objective.diagnostics changes metrics, never weights."""
    plain = load(OfflineConfig, None, [*BASE, "objective.name=dapo"])
    assert "correction" not in dump(plain)["objective"]
    off = load(OfflineConfig, None, [*BASE, "objective.name=dapo", "objective.diagnostics=none"])
    assert off.result_config() == plain.result_config()
    tis = load(OfflineConfig, None, [*BASE, "objective.name=dapo",
                                     "objective.correction.name=seq-tis"])
    assert dump(tis)["objective"]["correction"] == {"name": "seq-tis", "cap": 2.0}
    with pytest.raises(ConfigError, match="diagnostics=starting is for objectives without a "
                                          "ratio: dapo"):
        load(OfflineConfig, None, [*BASE, "objective.name=dapo", "objective.diagnostics=starting"])


@pytest.mark.parametrize("name", sorted(OBJECTIVE_MODELS))
@pytest.mark.parametrize("correction", CORRECTIONS)
def test_which_settings_leave_nothing_to_bound_the_drift(name, correction):
    """Unbounded: cispo (its capped weight drops no token) and an IS correction that replaces
    the ratio (the clip sees a ratio of 1); a mask keeps the objective's own clipped ratio, and
    pcl, rft, oreal and oapl have no weight to run away with."""
    sets = [*BASE, f"objective.name={name}"]
    if correction != "none":
        sets.append(f"objective.correction.name={correction}")
    try:
        obj = load(OfflineConfig, None, sets).objective
    except ConfigError:  # a correction the objective refuses (tested above)
        return
    why = obj.unbounded
    assert (why is not None) == (name == "cispo" or correction in ("token-tis", "seq-tis"))
    if correction in ("token-tis", "seq-tis"):
        assert why == (f"objective.correction {correction} weighs each term by its capped ratio "
                       f"to pi_old in place of {name}'s ratio, so no clip ever binds")
    elif name == "cispo":
        assert why == "cispo weighs every token's gradient by its capped ratio to pi_old and drops none"


@pytest.mark.parametrize("correction", ["none", "m2-mask"])
def test_a_clip_opened_past_any_ratio_leaves_nothing_to_bound_the_drift(correction):
    """M2PO's objective is dapo with its clips opened: measured, its second-moment mask drops the
    outliers only and the rest drifts (docs/train-offline.md), so it is flagged like cispo; a
    clip that can still bind (eps_high below e^20 - 1, or eps_low below 1) is not."""
    sets = [*BASE, "objective.name=dapo", "objective.eps_low=1", "objective.eps_high=1e9",
            f"objective.correction.name={correction}"]
    assert load(OfflineConfig, None, sets).objective.unbounded == (
        "dapo's clip is opened past any ratio (eps_low >= 1, eps_high >= e^20 - 1) and never "
        "binds, whatever mask is set")
    for still_binds in ("objective.eps_high=1e8", "objective.eps_low=0.99"):
        assert load(OfflineConfig, None, [*sets, still_binds]).objective.unbounded is None
