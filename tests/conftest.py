"""Shared fixtures: a tiny model and synthetic data built from scratch once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from reasoner.config import SynthConfig, TinyConfig, TinyModelConfig

TINY_SHAPE = TinyModelConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, intermediate_size=128,
                             max_position_embeddings=512, vocab_size=384, seed=0)


@pytest.fixture(scope="session")
def tiny_shape() -> TinyModelConfig:
    return TINY_SHAPE


@pytest.fixture(scope="session")
def synth_dir(tmp_path_factory) -> Path:
    from reasoner.data import synthetic

    out = tmp_path_factory.mktemp("synth")
    synthetic.run(SynthConfig(output_dir=out, seed=0, num_train=300, num_test=50))
    return out


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, synth_dir) -> Path:
    from reasoner import models

    out = tmp_path_factory.mktemp("tiny") / "model"
    return models.build_tiny(TinyConfig(output_dir=out, corpus=[synth_dir / "sft"], model=TINY_SHAPE))


def pytest_configure(config):
    """Under pytest-xdist (`-n 2` in pyproject.toml) each worker, and every `reasoner` process it
    starts, gets one torch thread: two workers then fill two cores without four busy threads
    fighting over them. (The tiny models here gain little from a second thread: measured on a
    2-core Xeon, one 2-thread SFT process made 0.98 steps/s, two 1-thread processes 1.02 each.)"""
    # `model.dtype: auto` resolves to fp32 on every machine here, as the exact numbers of the
    # suite were computed in it (on an AMX or AVX512-BF16 CPU the probe would pick bf16:
    # reasoner.cpu); tests/unit/test_cpu.py fakes the probe's every answer instead
    os.environ.setdefault("REASONER_CPU_BF16", "0")
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        check_loadgroup_works(config)
        return
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)


def check_loadgroup_works(config) -> None:
    """Under `--dist loadgroup` pytest-xdist adds `@group` to each grouped test's id, and tests
    sharing a group run on one worker, which builds their session fixtures (the quickstart SFT
    model, a module's torchrun) once. pytest 9.2 keeps ids where pytest-xdist 3.8 cannot add
    it: every xdist_group mark is silently ignored and each worker builds them again (measured:
    the quickstart's SFT trained on both workers). Stop instead of running twice as long."""
    from importlib.metadata import version

    from packaging.version import Version

    if config.getoption("dist", "no") != "loadgroup":
        return
    if Version(version("pytest")) >= Version("9.2") and Version(version("pytest-xdist")) <= Version("3.8.0"):
        raise pytest.UsageError(
            f"pytest {version('pytest')} with pytest-xdist {version('pytest-xdist')} ignores "
            "xdist_group marks (--dist loadgroup): install the dev extra's pytest<9.2 "
            "(pip install -e '.[dev]'), or run with -n 0")


# The quickstart recipe at CI scale: the shipped recipe and stage configs, with less of each
# (100 SFT steps instead of 1,095, 100 held-out problems x 2 samples per eval instead of
# 1,000 x 8, 60 train problems to sample, one round). The full recipe's claim, RL above SFT with
# the paired interval above 0, is measured by scripts/quickstart_seeds.py (docs/quickstart.md): it takes 6
# minutes on the reference machine and over an hour on the slowest machines CI runs on.
QUICKSTART_CI_SCALE = ["rounds=1", "data.num_test=100", "sft.run.max_steps=100",
                       "samples.data.limit=60", "eval-sft.sampling.n=2", "eval-rl.sampling.n=2",
                       "sft.run.progress=false", "rl.run.progress=false"]


@pytest.fixture(scope="session")
def quickstart_sft(tmp_path_factory) -> Path:
    """The quickstart recipe's data and SFT model at CI scale, made once by `reasoner run --until
    sft`; the quickstart test continues the same run folder. The tests that use it are one xdist
    group ("quickstart"), so one worker makes it."""
    from tests_helpers import reasoner

    root = tmp_path_factory.mktemp("quickstart")
    repo = Path(__file__).resolve().parents[1]
    out = reasoner("run", repo / "configs/quickstart/recipe.yaml", f"run_dir={root}",
                   *QUICKSTART_CI_SCALE, "--until", "sft", cwd=repo)
    assert out.returncode == 0, out.stderr[-3000:]
    return root


@pytest.fixture(scope="session")
def verified_dir(tmp_path_factory, synth_dir, tiny_model_dir):
    """A Verified shard with mixed rewards (planted: the tiny model is random)."""
    from reasoner import infer, shards
    from reasoner.config import InferConfig
    from reasoner.records import Sample, Verified

    root = tmp_path_factory.mktemp("verified")
    samples = infer.run(InferConfig.model_validate({
        "model": {"name_or_path": str(tiny_model_dir)},
        "data": {"path": str(synth_dir / "test_problems"), "limit": 6},
        "output_dir": str(root / "samples"), "backend": "hf", "progress": False,
        "sampling": {"n": 4, "max_tokens": 12, "temperature": 1.0, "logprobs": True}}))
    rows = []
    for s in shards.iter_rows(samples, Sample):
        reward = 1.0 if (s["sample_idx"] + len(s["id"])) % 3 == 0 else -1.0
        rows.append(Verified(**s, extracted="1", verdict="correct" if reward > 0 else "incorrect",
                             reward=reward, verifier="rule", group_size=4, group_accuracy=0.25,
                             reasoning_tokens=3))
    out = root / "verified"
    shards.write_rows(out, rows)
    shards.finish(out, {"samples": len(rows)})
    return out
