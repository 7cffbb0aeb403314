"""The stage configs: every shipped YAML loads, and each stage's own cross-field rules."""

from pathlib import Path

import pytest

from reasoner.config import ConfigError, OfflineConfig, load


def test_every_shipped_config_loads():
    from reasoner.cli import CONFIG_MODELS

    root = Path(__file__).resolve().parents[3] / "configs"
    checked = recipes = 0
    for path in sorted(root.rglob("*.yaml")):
        first = path.read_text().splitlines()[0]
        assert first.startswith("# reasoner "), f"{path} must open with the command that runs it"
        command = first.removeprefix("# ").split()
        key = " ".join(command[1:3]) if command[1] in ("data", "model", "eval", "export") else command[1]
        if key in CONFIG_MODELS and key != "run":
            load(CONFIG_MODELS[key], path)
            checked += 1
        if key == "run":  # a recipe: every stage's config resolves too
            from reasoner.pipeline import run as pipeline
            from reasoner.pipeline.recipe import load_recipe

            stages = pipeline.resolve(load_recipe(path, []), path.parent)
            assert stages and all(s.out.parent == Path(stages[0].out.parent) for s in stages)
            recipes += 1
    assert checked >= 2 and recipes == 19  # quickstart (10), lengths, pcl, prorl, oreal, discounted,
    #                                     smollm2_cpu, gsm8k_1gpu (3: 0.5B, 1.5B, 7B LoRA)


def test_packed_rows_must_hold_the_longest_sample():
    """max_tokens > seq_len with packing is refused at load, not at the first long sample."""
    base = ["model.name_or_path=m", "input_dir=v", "output_dir=o"]
    with pytest.raises(ConfigError, match=r"max_tokens \(51200\) is larger than seq_len \(8192\)"):
        load(OfflineConfig, None, [*base, "seq_len=8192"])
    assert load(OfflineConfig, None, [*base, "seq_len=8192", "packing=false"]).seq_len == 8192
    assert load(OfflineConfig, None, base).seq_len == 51200  # the defaults fit each other
