"""The objectives' settings: each takes only its own keys and answers what training it needs."""

import pytest

from reasoner.config import (
    OBJECTIVE_MODELS,
    CISPOObjective,
    ConfigError,
    DAPOObjective,
    DiscountedObjective,
    GSPOObjective,
    OAPLObjective,
    OfflineConfig,
    OREALObjective,
    PCLObjective,
    ProRLObjective,
    RFTObjective,
    load,
)


def test_each_objective_takes_only_its_own_keys():
    base = ["model.name_or_path=m", "input_dir=v", "output_dir=o"]
    cfg = load(OfflineConfig, None, [*base, "objective.name=discounted", "objective.gamma=0.9"])
    assert cfg.objective.name == "discounted" and cfg.objective.gamma == 0.9
    assert load(OfflineConfig, None, [*base, "objective.neg_scope=first"]).objective.name == "pcl"
    with pytest.raises(ConfigError) as err:  # gamma is discounted's, not dapo's: never ignored
        load(OfflineConfig, None, [*base, "objective.name=dapo", "objective.gamma=0.9"])
    msg = str(err.value)
    assert "unknown key 'objective.gamma'; valid keys for objective 'dapo':" in msg
    assert "eps_high" in msg and "neg_scope" not in msg
    with pytest.raises(ConfigError, match="'objective.name' must be one of 'pcl', 'rft'"):
        load(OfflineConfig, None, [*base, "objective.name=ppo"])
    with pytest.raises(ConfigError, match=r"did you mean 'objective.neg_scope'\?"):
        load(OfflineConfig, None, [*base, "objective.neg_scop=first"])


@pytest.mark.parametrize("name, theirs, foreign", [
    ("gspo", "eps_high", "clip_ratio_c"),  # dapo's dual clip is not in GSPO
    ("cispo", "eps_high", "clip_ratio_c"),
    ("oapl", "beta_value", "advantage"),   # OAPL's advantage is its own: r - V(x)
])
def test_the_objectives_for_aged_data_take_only_their_own_keys(name, theirs, foreign):
    base = ["model.name_or_path=m", "input_dir=v", "output_dir=o", f"objective.name={name}"]
    assert getattr(load(OfflineConfig, None, base).objective, theirs) is not None
    with pytest.raises(ConfigError) as err:
        load(OfflineConfig, None, [*base, f"objective.{foreign}=1"])
    msg = str(err.value)
    assert f"unknown key 'objective.{foreign}'; valid keys for objective '{name}':" in msg
    assert theirs in msg




@pytest.mark.parametrize("obj, reference, moves, resident, old_logprobs, token_rm, held_out", [
    (PCLObjective(), False, None, False, False, False, False),
    (PCLObjective(kl_coef=0.1), True, None, False, False, False, False),
    (RFTObjective(), False, None, False, False, False, False),
    (OREALObjective(), True, None, False, False, True, False),
    (OREALObjective(token_weights="uniform"), True, None, False, False, False, False),
    (DAPOObjective(), False, None, False, True, False, False),
    (DAPOObjective(kl_coef=0.1), True, None, False, True, False, False),
    (ProRLObjective(reset_every=50), False, "reset_every", False, True, False, False),
    (ProRLObjective(kl_coef=0.1, reset_every=50), True, "reset_every", True, True, False, False),
    (ProRLObjective(kl_coef=0.1, reset_patience=3), True, "reset_patience", True, True, False,
     True),
    (DiscountedObjective(ref_update_every=10), False, "ref_update_every", False, True, False,
     False),
    (DiscountedObjective(kl_coef=0.1, ref_update_every=10), True, "ref_update_every", True, True,
     False, False),
    (GSPOObjective(), False, None, False, True, False, False),
    (CISPOObjective(kl_coef=0.1), True, None, False, True, False, False),
    (OAPLObjective(), False, None, False, True, False, False),
])
def test_each_objective_says_what_training_it_needs(obj, reference, moves, resident,
                                                    old_logprobs, token_rm, held_out):
    assert obj.needs_reference is reference
    assert obj.reference_moved_by == moves
    assert obj.moves_reference is (moves is not None)
    assert obj.resident_reference is resident
    assert obj.resident_bytes_per_param == 4 * resident + 16 * token_rm
    assert obj.needs_old_logprobs is old_logprobs
    assert obj.uses_token_rm is token_rm
    assert obj.holds_out_groups is held_out


def test_resets_and_averages_fall_on_their_steps():
    prorl = ProRLObjective(kl_coef=0.1, reset_every=3)
    assert [s for s in range(1, 10) if prorl.resets_at(s)] == [3, 6, 9]
    assert not any(prorl.averages_at(s) for s in range(1, 10))
    moving = DiscountedObjective(kl_coef=0.1, ref_update_every=4)
    assert [s for s in range(1, 10) if moving.averages_at(s)] == [4, 8]
    assert not any(moving.resets_at(s) for s in range(1, 10))
    assert not any(m().resets_at(s) or m().averages_at(s) for m in OBJECTIVE_MODELS.values()
                   for s in range(1, 10))  # nothing moves unless asked


def test_every_objective_has_a_training_side():
    from reasoner.train_offline.objectives import OBJECTIVES

    assert set(OBJECTIVES) == set(OBJECTIVE_MODELS)
