"""The training core: the lr schedule, metric reduction over micro-batches, the metrics file."""

import math

import pytest
import torch

from reasoner import training
from reasoner.config import OptimConfig
from reasoner.device import DistInfo
from reasoner.training import schedule


def test_lr_warmup_then_cosine_to_min_lr():
    cfg = OptimConfig(lr=1.0, min_lr=0.1, warmup_ratio=0.2)
    lrs = [schedule.lr_at(s, 10, cfg) for s in range(10)]
    assert lrs[:2] == [0.5, 1.0]  # 2 warmup steps: linear up to the peak
    assert lrs[2] == 1.0 and lrs[-1] == pytest.approx(0.1)  # cosine from the peak to min_lr
    # step 5 is 3 of the cosine's 7 intervals in
    assert lrs[5] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 3 / 7)))
    assert all(a >= b for a, b in zip(lrs[2:], lrs[3:], strict=False))
    flat = OptimConfig(lr=2.0, min_lr=2.0)
    assert {schedule.lr_at(s, 5, flat) for s in range(5)} == {2.0}


class _Run:
    """The parts of training.Run that `accumulate` reads."""

    def __init__(self):
        self.dist, self.device, self.policy = DistInfo(), torch.device("cpu"), torch.nn.Linear(1, 1)
        self.scaler = None


def test_accumulate_sums_weights_means_skips_nan_and_keeps_extremes():
    outs = [training.MicroOut({"loss": 0.25, "tokens": 10}, {"geo": 0.5, "ratio_max": 1.5,
                                                            "ratio_min": 0.9}, 0.25),
            training.MicroOut({"loss": 0.5, "tokens": 30}, {"geo": math.nan, "ratio_max": 1.1,
                                                           "ratio_min": 0.7}, 0.75)]
    seen = []

    def step(mb, scale):
        seen.append((mb, scale))
        return outs[mb]

    m = training.accumulate(_Run(), [0, 1], step, dummy=0)
    assert seen == [(0, 1.0), (1, 1.0)]
    assert m["loss"] == 0.75 and m["tokens"] == 40
    assert m["geo"] == 0.5  # the NaN micro-batch (no positives) does not pull it towards 0
    assert m["ratio_max"] == 1.5 and m["ratio_min"] == 0.7


def test_accumulate_pads_a_process_with_fewer_micro_batches_with_zero_weight_passes(monkeypatch):
    """With 2 processes, one holding 1 micro-batch and the other 3: it runs 2 dummy passes at
    scale 0 (collectives inside FSDP would hang otherwise); their metrics count for nothing."""
    from reasoner import device as dev

    run = _Run()
    run.dist = DistInfo(rank=1, world_size=2)
    reduced = []

    def fake_all_reduce(values, dist, device, op="sum"):
        reduced.append((list(values), op))
        return [3] if op == "max" and len(values) == 1 else list(values)

    monkeypatch.setattr(dev, "all_reduce", fake_all_reduce)
    calls = []

    def step(mb, scale):
        calls.append((mb, scale))
        return training.MicroOut({"loss": 1.0}, {"m": 5.0 if mb == "real" else 99.0}, 0.5)

    m = training.accumulate(run, ["real"], step, dummy="dummy")
    assert calls == [("real", 1.0), ("dummy", 0.0), ("dummy", 0.0)]  # grads are summed
    assert reduced[0] == ([1], "max")  # the count is agreed on first
    assert m["loss"] == 1.0 and m["m"] == 5.0
