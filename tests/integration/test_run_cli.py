"""`reasoner run` on a miniature recipe: every stage runs, a rerun skips them all, a changed stage
reruns with everything after it, and --dry-run changes nothing."""

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from reasoner.cli import app
from reasoner.pipeline import run as pipeline
from reasoner.pipeline.recipe import load_recipe

CONFIGS = {
    "data_synth.yaml": {"output_dir": "x", "num_train": 30, "num_test": 6, "seed": 0},
    "tiny_model.yaml": {"output_dir": "x", "model": {
        "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
        "num_key_value_heads": 1, "intermediate_size": 64, "max_position_embeddings": 512,
        "vocab_size": 320}},
    "sft.yaml": {"model": {"name_or_path": "x"}, "data": {"path": "x"}, "output_dir": "x",
                 "seq_len": 256, "max_tokens": 256,
                 "run": {"global_batch": 2, "max_steps": 2, "progress": False}},
    "eval.yaml": {"model": {"name_or_path": "x"}, "output_dir": "x", "backend": "hf",
                  "sampling": {"n": 2, "max_tokens": 8}, "workers": 1, "bootstrap": 100,
                  "length_buckets": [4, 8]},
    "infer.yaml": {"model": {"name_or_path": "x"}, "data": {"path": "x", "limit": 4},
                   "output_dir": "x", "backend": "hf",
                   "sampling": {"n": 2, "max_tokens": 8, "logprobs": True}},
    "verify.yaml": {"input_dir": "x", "output_dir": "x", "workers": 1,
                    "filters": {"drop_zero_variance": False}},
    "train_offline.yaml": {"model": {"name_or_path": "x"}, "input_dir": "x", "output_dir": "x",
                           "seq_len": 256, "max_tokens": 256,
                           "run": {"global_batch": 4, "max_steps": 1, "progress": False}},
}

RECIPE = {
    "run_dir": "RUN",
    "stages": [
        {"name": "data", "command": "data synth", "config": "data_synth.yaml"},
        {"name": "init", "command": "model tiny", "config": "tiny_model.yaml",
         "set": {"corpus": ["{data}/sft"]}},
        {"name": "sft", "command": "sft", "config": "sft.yaml",
         "set": {"model.name_or_path": "{init}", "data.path": "{data}/sft"}},
        {"name": "eval-sft", "command": "eval", "config": "eval.yaml",
         "set": {"model.name_or_path": "{policy}", "data": [{"path": "{data}/test_problems"}]}},
        {"name": "samples", "command": "infer", "config": "infer.yaml", "repeat": True,
         "set": {"model.name_or_path": "{policy}", "data.path": "{data}/train_problems"}},
        {"name": "verified", "command": "verify", "config": "verify.yaml", "repeat": True,
         "set": {"input_dir": "{samples}"}},
        {"name": "rl", "command": "train-offline", "config": "train_offline.yaml", "repeat": True,
         "set": {"model.name_or_path": "{policy}", "input_dir": "{verified}"}},
        {"name": "eval-rl", "command": "eval", "config": "eval.yaml", "repeat": True,
         "set": {"model.name_or_path": "{policy}", "data": [{"path": "{data}/test_problems"}]}},
        {"name": "compare", "command": "compare"},
    ],
}


def write_recipe(root: Path, **changes) -> Path:
    for name, body in CONFIGS.items():
        (root / name).write_text(f"# reasoner test {name}\n" + yaml.safe_dump(body))
    recipe = {**RECIPE, "run_dir": str(root / "run"), **changes}
    path = root / "recipe.yaml"
    path.write_text("# reasoner run recipe.yaml\n" + yaml.safe_dump(recipe, sort_keys=False))
    return path


def go(path: Path, *overrides: str, **kw) -> list[pipeline.StageRun]:
    return pipeline.run(load_recipe(path, list(overrides)), path.parent, echo=lambda _: None,
                        **kw)


def snapshot(run: Path) -> dict[str, float]:
    return {str(p): p.stat().st_mtime_ns for p in run.rglob("*")}


@pytest.mark.slow
def test_run_skip_rerun_dry_run(tmp_path):
    path = write_recipe(tmp_path, rounds=2)
    run = tmp_path / "run"
    first = go(path)
    names = [s.name for s in first]
    assert names == ["data", "init", "sft", "eval-sft", "samples", "verified", "rl", "eval-rl",
                     "samples-r2", "verified-r2", "rl-r2", "eval-rl-r2", "compare"]
    assert all(s.status == "run" for s in first)
    for s in first:
        assert (run / s.name).is_dir() and (run / "configs" / f"{s.name}.yaml").is_file()
    # round 2 starts from round 1's checkpoint, with its own sampling seed
    r2 = yaml.safe_load((run / "configs" / "samples-r2.yaml").read_text())
    assert r2["model"]["name_or_path"] == str(run / "rl" / "final")
    assert r2["sampling"]["seed"] == 1000
    rl2 = yaml.safe_load((run / "configs" / "rl-r2.yaml").read_text())
    assert rl2["input_dir"] == str(run / "verified-r2")
    compare = json.loads((run / "compare" / "compare.json").read_text())
    assert [Path(r["name"]).name for r in compare["runs"]] == ["eval-sft", "eval-rl", "eval-rl-r2"]
    assert "pass@1" in first[3].headline and first[-1].metrics["diff_ci95"]

    before = snapshot(run)
    again = go(path)
    assert all(s.status == "skip" for s in again)
    assert [s.headline for s in again] == [s.headline for s in first]
    assert snapshot(run) == {**before, str(run / "pipeline.json"): before[str(run / "pipeline.json")]}

    # a changed stage reruns with everything after it; the stages before it are untouched
    plan = go(path, "rl.optim.lr=1e-4", dry_run=True)
    assert snapshot(run) == before  # --dry-run wrote nothing
    assert [s.status for s in plan] == ["skip"] * 6 + ["rerun"] * 7
    assert plan[6].reason == "config changed" and plan[7].reason == "an earlier stage reran"
    changed = go(path, "rl.optim.lr=1e-4")
    assert [s.status for s in changed] == ["skip"] * 6 + ["rerun"] * 7
    after = snapshot(run)
    kept = ("data", "init", "sft", "eval-sft", "samples", "verified")
    untouched = [p for p in before if Path(p).relative_to(run).parts[0] in kept]
    assert untouched and all(after[p] == before[p] for p in untouched)
    for name in ("rl", "rl-r2"):  # the override reaches every round's copy of the stage
        assert yaml.safe_load((run / "configs" / f"{name}.yaml").read_text())["optim"]["lr"] == 1e-4
    # the replaced outputs were moved aside, not deleted: one previous copy of each
    for name in ("rl", "eval-rl", "rl-r2"):
        previous = run / f"{name}.previous"
        assert previous.is_dir() and (previous / "manifest.json").exists(), name
    assert (run / "rl.previous" / "final" / "model.safetensors").exists()

    # --from reruns that stage and the later ones; --until stops early
    part = go(path, "rl.optim.lr=1e-4", start="eval-rl", until="verified-r2")
    assert [s.status for s in part] == ["skip"] * 7 + ["rerun"] * 3


def identities(run: Path, names: tuple[str, ...]) -> dict[str, str]:
    return {n: json.loads((run / n / "manifest.json").read_text())["identity"] for n in names}


@pytest.mark.slow
def test_an_override_tried_then_dropped_brings_the_first_outputs_back(tmp_path):
    """Issue 51, finding 4: `sft.optim.lr=1e-3` and back used to retrain SFT (and everything
    after it) from scratch, overwriting the override's SFT in `sft.previous`. Now each stage
    finds the output made with its identity among the kept copies and brings it back; the one
    it replaces is kept in its turn, so the override costs nothing a second time either."""
    path = write_recipe(tmp_path)
    run, upto = tmp_path / "run", "verified"
    made = ("sft", "eval-sft", "samples", "verified")
    go(path, until=upto)
    first = identities(run, made)
    weights = run / "sft" / "final" / "model.safetensors"
    trained = weights.stat().st_mtime_ns
    tried = go(path, "sft.optim.lr=1e-3", until=upto)
    assert [s.status for s in tried] == ["skip"] * 2 + ["rerun"] * 4
    plan = go(path, until=upto, dry_run=True)  # --dry-run says so, and moves nothing
    assert [s.status for s in plan] == ["skip"] * 2 + ["restore"] * 4
    assert plan[2].reason == "config changed; sft.previous has this identity: brought back"
    assert identities(run, made) != first
    lines: list[str] = []
    back = pipeline.run(load_recipe(path, []), path.parent, until=upto, echo=lines.append)
    assert [s.status for s in back] == ["skip"] * 2 + ["restore"] * 4
    assert identities(run, made) == first and weights.stat().st_mtime_ns == trained
    assert "pass@1" in back[3].headline and back[4].headline.startswith("8 samples")
    assert any(line.startswith("[restore] sft: config changed; sft.previous has this "
                               "identity: brought back; the replaced output is kept in ")
               for line in lines), lines
    sft_then = json.loads((run / "sft.previous" / "manifest.json").read_text())
    assert sft_then["config"]["optim"]["lr"] == 1e-3  # the override's SFT, kept in its turn
    # a setting outside every identity (infer's batch size) keeps the outputs where they are
    kept = go(path, "samples.batch_size=3", until=upto)
    assert [s.status for s in kept] == ["skip"] * 4 + ["keep"] * 2
    assert identities(run, made) == first
    again = go(path, "sft.optim.lr=1e-3", until=upto)  # the override again: brought back too
    assert [s.status for s in again] == ["skip"] * 2 + ["restore"] * 4
    assert identities(run, ("sft.previous",))["sft.previous"] == first["sft"]


def test_dry_run_cli_prints_plan_and_writes_nothing(tmp_path):
    path = write_recipe(tmp_path)
    result = CliRunner().invoke(app, ["run", str(path), "seed=3", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "run").exists()
    lines = [line for line in result.output.splitlines() if " new " in line]
    assert len(lines) == 9
    assert "reasoner sft" in lines[2] and f"model.name_or_path={tmp_path}/run/init" in lines[2]
    assert "run.seed=3" in lines[2]
    assert "reasoner eval compare" in lines[-1]


@pytest.mark.parametrize("override, message", [
    ("nope=1", "neither a recipe key"),
    ("sft.optim.lrr=1", "did you mean 'optim.lr'"),
    ("rounds=0", "rounds"),
])
def test_bad_overrides_exit_2(tmp_path, override, message):
    path = write_recipe(tmp_path)
    result = CliRunner().invoke(app, ["run", str(path), override, "--dry-run"])
    assert result.exit_code == 2 and message in result.output


def test_recipe_errors(tmp_path):
    path = write_recipe(tmp_path)
    recipe = load_recipe(path, [])
    bad = recipe.model_copy(deep=True)
    bad.stages[2].set = {"data.path": "{nowhere}/sft"}
    with pytest.raises(pipeline.ConfigError, match=r"\{nowhere\} names no earlier stage"):
        pipeline.resolve(bad, tmp_path)
    bad = recipe.model_copy(deep=True)
    bad.stages[1].set = {"corpus": ["{policy}"]}
    with pytest.raises(pipeline.ConfigError, match="needs an sft or train-offline stage before it, or the recipe.s start_model"):
        pipeline.resolve(bad, tmp_path)
    bad = recipe.model_copy(deep=True)
    bad.stages[5].name = "samples"
    with pytest.raises(pipeline.ConfigError, match="unique"):
        pipeline.resolve(bad, tmp_path)
    with pytest.raises(pipeline.ConfigError, match="--from nope"):
        go(path, start="nope", dry_run=True)
    with pytest.raises(ValueError, match="not finished"):
        go(path, start="sft")


def test_recipe_seed_shifts_every_seed(tmp_path):
    path = write_recipe(tmp_path)
    stages = pipeline.resolve(load_recipe(path, ["seed=5"]), tmp_path)
    by = {s.name: s.config for s in stages}
    assert by["data"].seed == 5 and by["init"].model.seed == 5 and by["sft"].run.seed == 5
    assert by["samples"].sampling.seed == 5 and by["eval-rl"].seed == 5
    assert by["eval-rl"].sampling.seed == by["eval-sft"].sampling.seed


def test_extends_takes_the_base_stages_up_to_a_name(tmp_path):
    write_recipe(tmp_path)
    sub = tmp_path / "variants"
    sub.mkdir()
    (sub / "rft.yaml").write_text(yaml.safe_dump({
        "extends": "../recipe.yaml", "extends_until": "verified", "seed": 2,
        "stages": [{"name": "rl-rft", "command": "train-offline", "config": "../train_offline.yaml",
                    "repeat": True, "set": {"model.name_or_path": "{policy}", "input_dir": "{verified}",
                                            "objective.name": "rft"}},
                   {"name": "eval-rft", "command": "eval", "config": "../eval.yaml", "repeat": True,
                    "set": {"model.name_or_path": "{policy}", "data": [{"path": "{data}/test_problems"}]}}]}))
    recipe = load_recipe(sub / "rft.yaml", ["rounds=2"])
    stages = pipeline.resolve(recipe, sub)
    assert [s.name for s in stages] == ["data", "init", "sft", "eval-sft", "samples", "verified",
                                        "rl-rft", "eval-rft", "samples-r2", "verified-r2", "rl-rft-r2",
                                        "eval-rft-r2"]
    assert recipe.run_dir == tmp_path / "run" and recipe.seed == 2  # base's run_dir, own seed
    base = pipeline.resolve(load_recipe(tmp_path / "recipe.yaml", ["seed=2"]), tmp_path)
    assert [s.chain for s in stages[:6]] == [s.chain for s in base[:6]]  # shared stages are skipped
    assert stages[6].config.objective.name == "rft"
    (sub / "loop.yaml").write_text(yaml.safe_dump({"extends": "loop.yaml", "stages": []}))
    with pytest.raises(pipeline.ConfigError, match="loops back"):
        load_recipe(sub / "loop.yaml", [])
    (sub / "bad.yaml").write_text(yaml.safe_dump({"extends": "../recipe.yaml", "extends_until": "nope",
                                                  "stages": []}))
    with pytest.raises(pipeline.ConfigError, match="extends_until 'nope' is no stage"):
        load_recipe(sub / "bad.yaml", [])
