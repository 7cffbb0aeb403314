"""What a command's closing summary says is true (issue 51, finding 15): a filter that removed
nothing says so (it printed "-0 problems"), and a LoRA run says it trained adapters (its summary
never said LoRA)."""

from __future__ import annotations

import pytest
from test_stage_reruns import QS, infer, sft
from tests_helpers import reasoner


def test_a_filter_that_removed_nothing_says_so(tmp_path, tiny_model_dir, synth_dir):
    samples, verified = tmp_path / "samples", tmp_path / "verified"
    assert reasoner(*infer(tiny_model_dir, synth_dir / "test_problems", samples)).returncode == 0
    r = reasoner("verify", QS / "verify.yaml", f"input_dir={samples}", f"output_dir={verified}",
                 "filters.drop_zero_variance=false", "filters.min_group_mean_tokens=0",
                 "filters.max_positive_tokens=100000")
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())
    assert "-0 " not in text and "nothing removed" in text


@pytest.mark.parametrize("lora", [False, True])
def test_a_trainer_says_what_it_trained(tmp_path, tiny_model_dir, synth_dir, lora):
    if lora:
        pytest.importorskip("peft")
    extra = ["model.lora={r: 8, alpha: 16}"] if lora else []
    r = reasoner(*sft(synth_dir, tiny_model_dir, tmp_path / "sft", "run.max_steps=1", *extra))
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())
    if lora:
        assert "LoRA adapters (r 8, alpha 16, on" in text and "final/adapter/" in text
    else:
        assert "every parameter" in text and "LoRA" not in text
