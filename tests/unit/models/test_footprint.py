"""What a training process holds: the plan's bytes per activation element are the trainer's."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tests_helpers import SUBPROCESS_ENV, torchrun_two_processes, why

from reasoner.models.footprint import residual_bytes, scoring_bytes, training_bytes
from reasoner.models.shapes import shape_of

CHECK = Path(__file__).parents[2] / "activation_bytes_check.py"


@pytest.mark.slow
def test_the_plans_bytes_per_activation_element_are_what_the_layers_receive(tmp_path,
                                                                            tiny_model_dir):
    """The hidden states entering a decoder layer (what activation checkpointing keeps) are fp32
    in one process whatever the compute dtype (fp32 master weights under autocast), and the
    compute dtype's under FSDP2 (bf16 / fp16 gathers make the residual stream half): read off
    a forward pre-hook in 1 and 2 processes, fp32 / bf16 / fp16, equal to the plan's."""
    seen = {}
    for processes in (1, 2):
        out = tmp_path / f"{processes}.json"
        cmd = ([sys.executable, str(CHECK), tiny_model_dir, out] if processes == 1 else
               torchrun_two_processes(CHECK, tiny_model_dir, out))
        done = subprocess.run(list(map(str, cmd)), capture_output=True, text=True,
                              env=SUBPROCESS_ENV, timeout=600, cwd=CHECK.parent)
        assert done.returncode == 0, why(done)
        seen[processes] = json.loads(out.read_text())
    for processes, result in seen.items():
        assert result["processes"] == processes
        for dtype, nbytes in (("float32", 4), ("bfloat16", 2), ("float16", 2)):
            plan = residual_bytes(nbytes, processes)
            assert result[dtype] == {"first": plan, "second": plan}, (processes, dtype, result)
    assert seen[1]["bfloat16"]["first"] == 4 and seen[2]["bfloat16"]["first"] == 2


def test_sequence_parallel_divides_the_activations_and_scoring_holds_less_than_training():
    """Qwen2.5-32B, 64 devices, a 51,200-token row: each process of a group of 4 holds the
    activations of 12,800 tokens, a quarter of the whole row's; a scoring forward (no
    gradient) of the same micro-batch holds less than training does."""
    s = shape_of("Qwen/Qwen2.5-32B")
    whole = training_bytes(s, 64, 51_200, 2, True, 4096, vocab_layout="fsdp")
    quarter = training_bytes(s, 64, 12_800, 2, True, 4096, vocab_layout="fsdp")
    # the whole row's peak is the last layer's backward: each layer's input held, one layer
    # recomputed; a quarter's is the lm-head's, 4 more hidden-sized tensors held
    assert whole["activations"] == 64 * 51_200 * 5120 * 2
    assert quarter["activations"] == (64 + 4) * 12_800 * 5120 * 2
    assert sum(quarter.values()) < 0.5 * sum(whole.values())
    assert scoring_bytes(s, 64, 12_800, 2, 4096) < sum(quarter.values())
