"""Where pi_old comes from: the behaviour log-probs the clipped objectives divide by, and the
samples' sampling settings, found through the Verified shard's manifest, that decide it."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from reasoner import outputs, shards
from reasoner.config import DAPOObjective, InferConfig, PCLObjective, VerifyConfig
from reasoner.errors import TrainingError
from reasoner.train_offline.behaviour import behaviour_logprobs, sampling_of

STORED = SimpleNamespace(old_logp=[[-0.1]], keys=[("p", 0)])  # rollouts with stored log-probs
PLAIN = {"temperature": 1.0, "top_k": 0, "top_p": 1.0}
QUICKSTART = {"temperature": 0.6, "top_k": 40, "top_p": 0.95}  # configs/quickstart/infer.yaml


def verified_from(root: Path, sampling: dict) -> Path:
    """A Sample shard's manifest as `reasoner infer` writes it with these sampling settings, and
    the manifest `reasoner verify` writes for the Verified shard made from it."""
    samples, verified = root / "samples", root / "verified"
    infer = InferConfig.model_validate({"model": {"name_or_path": "m"}, "data": {"path": "d"},
                                        "output_dir": str(samples), "sampling": sampling})
    outputs.begin(samples, outputs.Identity.of("infer", infer.result_config(), infer.inputs()),
                  "new")
    shards.finish(samples, {"samples": 1})
    verify = VerifyConfig(input_dir=samples, output_dir=verified)
    outputs.begin(verified, outputs.Identity.of("verify", verify.result_config(),
                                                verify.inputs()), "new")
    shards.finish(verified, {"samples": 1})
    return verified


def test_stored_logprobs_are_used_when_the_samples_were_drawn_as_scored(tmp_path):
    """verify's manifest names the folder it read; infer's manifest there says how the samples
    were drawn: at the scoring temperature without truncation, the stored log-probs are pi_old
    (a lookup under a key verify does not write once left them unused whatever the settings)."""
    verified = verified_from(tmp_path, PLAIN)
    drawn = sampling_of(verified)
    assert {k: drawn.settings[k] for k in PLAIN} == PLAIN and drawn.unknown_because == ""
    assert behaviour_logprobs(DAPOObjective(), STORED, verified) == (False, "stored by infer")


def test_behaviour_logprobs_are_recomputed_unless_sampled_as_scored(tmp_path):
    """Stored log-probs are of logits/T after top-k/top-p; the policy is scored at
    logprob_temperature over the whole vocabulary: only a match gives ratio 1 at theta_old.
    The quickstart's samples (T 0.6, top-k 40, top-p 0.95) are recomputed, saying why."""
    verified = verified_from(tmp_path, QUICKSTART)
    assert behaviour_logprobs(DAPOObjective(), STORED, verified) == (
        True, "recomputed by the starting model (sampled at temperature 0.6, scored at "
        "objective.logprob_temperature 1.0; sampled with top_k 40 / top_p 0.95, which truncate "
        "the distribution)")
    at_06 = DAPOObjective(logprob_temperature=0.6, old_logprobs="samples")
    assert behaviour_logprobs(at_06, STORED, verified) == (
        False, "stored by infer (sampled with top_k 40 / top_p 0.95, which truncate the "
        "distribution: the ratio is below 1 at theta_old)")
    with pytest.raises(TrainingError, match="logprob_temperature=0.6"):
        behaviour_logprobs(DAPOObjective(old_logprobs="samples"), STORED, verified)
    none = SimpleNamespace(old_logp=None, keys=[("p", 0)])
    assert behaviour_logprobs(DAPOObjective(), none, verified) == (
        True, "recomputed by the starting model (the samples carry none)")
    assert behaviour_logprobs(DAPOObjective(old_logprobs="recompute"), STORED, verified)[0]


def test_objectives_without_a_ratio_read_behaviour_logprobs_for_the_diagnostics_only(tmp_path):
    """pcl (the quickstart's) trains on nothing the samples' manifests say: it reads them only
    to say, in the summary, what its off-policy diagnostics compare with; the stored log-probs
    when there are any (no scoring pass), a broken or missing manifest said, never raised."""
    stored = "stored by infer, for the off-policy diagnostics only"
    verified = verified_from(tmp_path, QUICKSTART)
    assert behaviour_logprobs(PCLObjective(), STORED, verified) == (
        False, f"{stored} (sampled at temperature 0.6, scored at objective.logprob_temperature "
        "1.0; sampled with top_k 40 / top_p 0.95, which truncate the distribution: rho is not "
        "1 at theta_old)")
    assert behaviour_logprobs(PCLObjective(), STORED, verified_from(tmp_path / "t1", PLAIN)) == (
        False, stored)
    recompute, said = behaviour_logprobs(PCLObjective(), STORED, tmp_path / "absent")
    assert not recompute and "sampling settings are unknown" in said
    (verified / shards.MANIFEST).write_text("{")
    assert "not valid JSON" in behaviour_logprobs(PCLObjective(), STORED, verified)[1]
    none = SimpleNamespace(old_logp=None, keys=[("p", 0)])
    recompute, said = behaviour_logprobs(PCLObjective(), none, verified)
    assert recompute and "the samples carry none; objective.diagnostics=none skips it" in said
    assert behaviour_logprobs(PCLObjective(diagnostics="starting"), STORED, verified)[0]
    assert behaviour_logprobs(PCLObjective(diagnostics="none"), none, verified) == (
        False, "not used (objective.diagnostics=none)")


def test_a_verified_shard_of_an_older_reasoner_still_finds_its_samples(tmp_path):
    """verify once recorded the folder it read as `inputs.samples`, without its identity."""
    verified = verified_from(tmp_path, PLAIN)
    manifest = shards.read_manifest(verified)
    manifest["inputs"] = {"samples": manifest["inputs"].pop("input_dir")}
    del manifest["input_identity"]
    (verified / shards.MANIFEST).write_text(json.dumps(manifest))
    assert behaviour_logprobs(DAPOObjective(), STORED, verified) == (False, "stored by infer")


def recomputed_because(verified: Path, obj: DAPOObjective = DAPOObjective()) -> str:
    recompute, said = behaviour_logprobs(obj, STORED, verified)
    assert recompute
    prefix = "recomputed by the starting model (the samples' sampling settings are unknown: "
    assert said.startswith(prefix)
    return said[len(prefix):]


def test_a_broken_chain_to_the_samples_recomputes_them_and_says_why(tmp_path):
    """A Verified shard made by hand, a samples folder moved or regenerated since verify read
    it, a broken samples manifest: the settings are unknown, the log-probs are recomputed (auto)
    and the summary says which link broke."""
    by_hand = tmp_path / "by_hand"
    shards.finish(by_hand, {"samples": 1})
    assert "names no samples folder" in recomputed_because(by_hand)

    verified = verified_from(tmp_path / "moved", PLAIN)
    (tmp_path / "moved" / "samples").rename(tmp_path / "moved" / "elsewhere")
    why = recomputed_because(verified)
    assert why.startswith(f"{tmp_path / 'moved' / 'samples'}, the samples {verified} was "
                          "verified from, has no manifest.json (moved or deleted since")

    verified = verified_from(tmp_path / "rerun", QUICKSTART)
    samples = tmp_path / "rerun" / "samples"
    shards.update_manifest(samples, config={"sampling": PLAIN})  # infer rerun at T 1 since
    assert "has changed since" in recomputed_because(verified)

    verified = verified_from(tmp_path / "broken", PLAIN)
    (tmp_path / "broken" / "samples" / shards.MANIFEST).write_text("{")
    assert "not valid JSON" in recomputed_because(verified)
    explicit = DAPOObjective(old_logprobs="samples")  # asked for: used, saying what is unknown
    recompute, said = behaviour_logprobs(explicit, STORED, verified)
    assert not recompute and said.startswith(
        "stored by infer, as objective.old_logprobs=samples asks (the samples' sampling "
        "settings are unknown: ")
