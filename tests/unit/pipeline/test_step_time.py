"""A training step's time before it runs (pipeline/step_time.py), hand-computed;
tests/unit/pipeline/test_rehearsal.py holds its FLOPs and bytes to a rehearsal's counts."""

from pathlib import Path

import pytest
import yaml

from reasoner.config import OfflineConfig, SFTConfig
from reasoner.models.shapes import Shape, shape_of
from reasoner.pipeline import step_time

PCL = Path(__file__).resolve().parents[3] / "configs" / "pcl_reasoner_v1_5"


def test_flops_count_the_multiplying_parameters_and_attention_as_flash_computes_it():
    """8 x the parameters that multiply (an untied embedding is a lookup) x tokens with the
    recompute, 6 without; attention 2 x layers x hidden x attended a token forward, 2.5 times
    that backward, once more for the recompute."""
    s = Shape(layers=2, hidden=8, intermediate=16, heads=2, kv_heads=1, head_dim=4, vocab=10,
              tied=False)
    multiplying = s.params - 10 * 8
    assert step_time.step_flops(s, 100, 50, True) == 8 * multiplying * 100 + 2 * 2 * 8 * 50 * 100 * 4.5
    assert step_time.step_flops(s, 100, 50, False) == 6 * multiplying * 100 + 2 * 2 * 8 * 50 * 100 * 3.5
    tied = Shape(2, 8, 16, 2, 1, 4, 10, True)
    assert step_time.step_flops(tied, 100, 0, True) == 8 * tied.params * 100


def test_collectives_take_each_micro_batch_s_bytes_at_the_link_s_bandwidth():
    """PCL's train-offline on 64 H100s at SP 2: 128 samples of one row each over 32
    data-parallel groups, 4 micro-batches a process; each sends 382.9 GB, 63/64 of it over a
    50 GB/s link: 30.2 s a step (the rehearsal's count, docs/run.md). sft: 128 rows over 64."""
    cfg = OfflineConfig.model_validate(yaml.safe_load((PCL / "train_offline.yaml").read_text()))
    assert step_time.micro_batches_per_step(cfg, 64) == 4
    seconds, gb = step_time.collective_seconds(cfg, shape_of("Qwen/Qwen2.5-32B"), 64, "h100", 2,
                                               "fsdp")
    assert gb == pytest.approx(382.9, abs=0.05)
    assert seconds == pytest.approx(4 * gb * 1e9 * 63 / 64 / 50e9)
    sft = SFTConfig.model_validate(yaml.safe_load((PCL / "sft.yaml").read_text()))
    assert step_time.micro_batches_per_step(sft, 64) == 2
    assert step_time.collective_seconds(sft, shape_of("Qwen/Qwen2.5-32B"), 1, "h100", 2,
                                        "whole") == (0.0, 0.0)
