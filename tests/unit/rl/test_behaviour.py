"""Where pi_old comes from: the behaviour log-probs the clipped objectives divide by."""

import pytest

from reasoner.rl.behaviour import behaviour_logprobs


def test_behaviour_logprobs_are_recomputed_unless_sampled_as_scored():
    """Stored log-probs are of logits/T after top-k/top-p; the policy is scored at
    logprob_temperature over the whole vocabulary: only a match gives ratio 1 at theta_old."""
    from types import SimpleNamespace

    from reasoner.config import DAPOObjective, PCLObjective
    from reasoner.errors import TrainingError

    stored = SimpleNamespace(old_logp=[[-0.1]], keys=[("p", 0)])
    plain = {"temperature": 1.0, "top_k": 0, "top_p": 1.0}
    truncated = {"temperature": 0.6, "top_k": 40, "top_p": 0.95}
    assert behaviour_logprobs(DAPOObjective(), stored, plain) == (False, "stored by infer")
    recompute, why = behaviour_logprobs(DAPOObjective(), stored, truncated)
    assert recompute and "temperature 0.6" in why and "top_k 40" in why
    assert behaviour_logprobs(DAPOObjective(), stored, None)[0]  # settings unknown: recompute
    at_06 = DAPOObjective(logprob_temperature=0.6, old_logprobs="samples")
    assert behaviour_logprobs(at_06, stored, truncated) == (
        False, "stored by infer (sampled with top_k 40 / top_p 0.95, which truncate the "
        "distribution: the ratio is below 1 at theta_old)")
    with pytest.raises(TrainingError, match="logprob_temperature=0.6"):
        behaviour_logprobs(DAPOObjective(old_logprobs="samples"), stored, truncated)
    assert behaviour_logprobs(PCLObjective(), stored, truncated) == (False, "not used")
