"""Bytes a training process sends per micro-batch (models/traffic.py), hand-computed for
Qwen2.5-32B at PCL's scale; tests/unit/pipeline/test_rehearsal.py holds them to what a
rehearsal's step sends on its fake process group."""

import pytest

from reasoner.models.shapes import shape_of
from reasoner.models.traffic import micro_batch_traffic

QWEN_32B = shape_of("Qwen/Qwen2.5-32B")


def test_fsdp2_gathers_twice_in_the_compute_dtype_and_reduces_once_in_fp32():
    """64 devices, fp16, the embedding and lm-head FSDP2 units: every parameter gathered in
    forward and again in backward (2 x 2 bytes), its gradient reduce-scattered in fp32: 131.1
    GB and 131.1 GB a micro-batch, as rehearsed. One process sends nothing."""
    t = micro_batch_traffic(QWEN_32B, 64, 1, 32_768, 2, "fsdp", True)
    assert t == {"all-gather": 4.0 * QWEN_32B.params, "reduce-scatter": 4.0 * QWEN_32B.params}
    assert t["all-gather"] / 1e9 == pytest.approx(131.1, abs=0.05)
    assert micro_batch_traffic(QWEN_32B, 1, 1, 32_768, 2, "fsdp", True) == {}


def test_sequence_parallel_all_to_alls_and_the_vocab_parallel_activations():
    """PCL's train-offline on 8 devices at SP 2 (25,600 tokens a process), vocabulary-parallel:
    the two vocab matrices leave FSDP2's gathers; Ulysses sends q, k, v and the output (2 x
    5,120 + 2 x 8 x 128 a token, fp16) in 64 layers, three times with the recompute: 120.8 GB;
    the vocabulary layout's activations `vocab_traffic_bytes`' 16.8 GB. LoRA reduces only its
    adapters' gradient."""
    t = micro_batch_traffic(QWEN_32B, 8, 2, 25_600, 2, "vocab-parallel", True)
    rows = 2 * QWEN_32B.vocab * QWEN_32B.hidden
    assert t["all-gather"] == 4.0 * (QWEN_32B.params - rows)
    assert t["reduce-scatter"] == 4.0 * (QWEN_32B.params - rows)
    assert t["all-to-all"] == 3 * 64 * 25_600 * (2 * 5120 + 2 * 8 * 128) * 2 == 120_795_955_200
    assert t["broadcast + reduce"] == 8 * 25_600 * (8 + 4 * 5120 + 4 * 5120 + 8 + 4 * 5120 + 4
                                                    + 4 * 5120)
    no_recompute = micro_batch_traffic(QWEN_32B, 8, 2, 25_600, 2, "vocab-parallel", False)
    assert no_recompute["all-to-all"] == t["all-to-all"] * 2 / 3
    lora = micro_batch_traffic(QWEN_32B, 8, 1, 4096, 2, "fsdp", True, adapters=1_000_000)
    assert lora["reduce-scatter"] == 4.0e6 and lora["all-gather"] == 4.0 * QWEN_32B.params


def test_the_models_beside_the_policy_send_their_own():
    """A moving reference's forward gathers its shards once (no gradient); OREAL's token RM
    gathers its trunk twice and reduce-scatters its gradient (its untied lm-head is never
    used), and under SP it all-to-alls as the policy does: OREAL-32B at 32 devices, SP 2, two
    16K rows a micro-batch: 259.0 GB of gathers, 259.0 of reduce-scatters and 154.6 of
    all-to-alls, as rehearsed at full depth."""
    plain = micro_batch_traffic(QWEN_32B, 32, 2, 16_384, 2, "fsdp", True)
    ref = micro_batch_traffic(QWEN_32B, 32, 2, 16_384, 2, "fsdp", True, reference=True)
    assert ref["all-gather"] - plain["all-gather"] == 2.0 * QWEN_32B.params
    assert ref["reduce-scatter"] == plain["reduce-scatter"]
    assert ref["all-to-all"] == plain["all-to-all"] * 4 / 3
    rm = micro_batch_traffic(QWEN_32B, 32, 2, 16_384, 2, "fsdp", True, token_rm=True)
    trunk = QWEN_32B.params - QWEN_32B.vocab * QWEN_32B.hidden
    assert rm["all-gather"] - plain["all-gather"] == 4.0 * trunk
    assert rm["reduce-scatter"] - plain["reduce-scatter"] == 4.0 * trunk
    assert [round(rm[k] / 1e9, 1) for k in ("all-gather", "reduce-scatter", "all-to-all")] == \
        [259.0, 259.0, 154.6]
