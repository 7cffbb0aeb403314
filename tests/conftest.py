"""Shared fixtures: a tiny model and synthetic data built from scratch once per session."""

from __future__ import annotations

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
