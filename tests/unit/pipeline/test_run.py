"""`reasoner run`'s decisions: which stages skip, run, rerun or resume, and why."""

import dataclasses
import json
from pathlib import Path

import pytest

from reasoner.errors import ConfigError
from reasoner.pipeline import run as pipeline
from reasoner.pipeline.recipe import StageSpec, load_recipe


def stages(tmp_path: Path, names=("a", "b", "c")) -> list[pipeline.StageRun]:
    out = []
    for n in names:
        (tmp_path / n).mkdir(exist_ok=True)
        out.append(pipeline.StageRun(n, StageSpec(name=n, command="verify"), tmp_path / n, {},
                                  chain=f"chain-{n}", digest=f"digest-{n}"))
    return out


def done(*names, status="done", **changed) -> dict:
    return {"stages": {n: {"chain": changed.get(n, f"chain-{n}"), "digest": f"digest-{n}",
                           "status": status, "seconds": 1.0, "headline": n} for n in names}}


def decided(plan):
    return [(s.status, s.reason) for s in plan]


def test_new_finished_and_interrupted(tmp_path):
    assert decided(pipeline.decide(stages(tmp_path), {"stages": {}}, None, None)) == [("run", "new")] * 3
    plan = pipeline.decide(stages(tmp_path), done("a", "b", "c"), None, None)
    assert {s.status for s in plan} == {"skip"} and plan[0].headline == "a"
    state = done("a", "b")
    state["stages"]["c"] = {**done("c")["stages"]["c"], "status": "running"}
    assert decided(pipeline.decide(stages(tmp_path), state, None, None))[2] == (
        "resume", "interrupted last time")


def test_a_changed_stage_reruns_with_everything_after_it(tmp_path):
    plan = pipeline.decide(stages(tmp_path), done("a", "b", "c", b="old-chain"), None, None)
    assert [s.status for s in plan] == ["skip", "rerun", "rerun"]
    assert [s.reason for s in plan[1:]] == ["an earlier stage reran"] * 2  # its chain changed
    state = done("a", "b", "c", b="old-chain")
    state["stages"]["b"]["digest"] = "old-digest"  # its own config changed
    assert [s.reason for s in pipeline.decide(stages(tmp_path), state, None, None)[1:]] == [
        "config changed", "an earlier stage reran"]


def test_output_missing_reruns(tmp_path):
    s = stages(tmp_path)
    (tmp_path / "b").rmdir()
    assert decided(pipeline.decide(s, done("a", "b", "c"), None, None)) == [
        ("skip", "finished with this config"), ("rerun", "output missing"),
        ("rerun", "an earlier stage reran")]


def test_from_and_until(tmp_path):
    plan = pipeline.decide(stages(tmp_path), done("a", "b", "c"), "b", "b")
    assert [s.name for s in plan] == ["a", "b"]
    assert decided(plan) == [("skip", "before --from"), ("rerun", "--from")]
    plan = pipeline.decide(stages(tmp_path), {"stages": {}}, "b", None)
    assert plan[0].reason == "before --from (not finished with this config!)"
    with pytest.raises(ConfigError, match="--until x: no such stage"):
        pipeline.decide(stages(tmp_path), {"stages": {}}, None, "x")
    with pytest.raises(ConfigError, match="comes after"):
        pipeline.decide(stages(tmp_path), {"stages": {}}, "c", "a")


def test_the_pcl_recipe_asks_every_stage_with_the_official_prompt_and_a_drift_is_refused():
    base = Path(__file__).parents[3] / "configs" / "pcl_reasoner_v1_5"
    stages = pipeline.resolve(load_recipe(base / "recipe.yaml", []), base)
    asked = {s.name: s.config.template for s in stages if s.spec.command in ("sft", "infer", "eval")}
    assert set(asked) == {"sft", "samples", "aime24", "aime25"}
    for t in asked.values():
        assert t.instruction == "Please reason step by step, and put your final answer within \\boxed{}."
        assert t.system_prompt.startswith("You are a helpful assistant. To answer the user's")
    drifted = load_recipe(base / "recipe.yaml", ["samples.template.system_prompt=Hi."])
    with pytest.raises(ConfigError, match="'sft' and 'samples' render prompts differently"):
        pipeline.resolve(drifted, base)


def test_stage_overrides_drop_the_reference_stage_times():
    """A stage override changes what the recipe's expect_seconds measured (and what the stages
    after it get): no time-left estimate then, rather than a wrong one. Recipe keys keep it."""
    recipe = Path(__file__).parents[3] / "configs" / "quickstart" / "recipe.yaml"
    times = {s.name: s.expect_seconds for s in load_recipe(recipe, []).stages}
    assert times["sft"] and times["sft"] > 60
    kept = load_recipe(recipe, ["seed=1", "run_dir=elsewhere"])
    assert {s.name: s.expect_seconds for s in kept.stages} == times
    scaled = load_recipe(recipe, ["sft.run.max_steps=100"])
    assert all(s.expect_seconds is None for s in scaled.stages)


def test_a_vllm_stage_runs_in_its_own_process(monkeypatch, tmp_path):
    """vLLM keeps device memory after `del`: each engine-building stage gets a fresh process."""
    import subprocess
    import sys

    from reasoner.infer import engines

    base = Path(__file__).parents[3] / "configs" / "pcl_reasoner_v1_5"
    stages = {s.name: s for s in pipeline.resolve(load_recipe(base / "recipe.yaml", []), base)}
    assert pipeline.uses_vllm(stages["samples"]) is (engines.pick_backend("vllm") == "vllm")
    assert pipeline.uses_vllm(stages["verify"])  # the Qwen3-32B judge on vLLM
    monkeypatch.setattr(engines, "pick_backend", lambda backend: "hf")
    assert not pipeline.uses_vllm(stages["aime24"])
    monkeypatch.setattr(engines, "pick_backend", lambda backend: backend)
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, check: calls.append(cmd) or
                        subprocess.CompletedProcess(cmd, 0))
    pipeline._execute(stages["aime24"], tmp_path / "aime24.yaml")
    assert calls == [[sys.executable, "-m", "reasoner", "eval", "bench", str(tmp_path / "aime24.yaml")]]


def test_time_left_scales_the_stages_to_run_by_this_machines_speed(tmp_path):
    plan = []
    for name, expect, status in [("data", 1, "skip"), ("sft", 100, "run"), ("tiny", 2, "run"),
                                 ("eval", 20, "run"), ("done-before", 50, "skip"), ("rl", 40, "run"),
                                 ("compare", None, "run")]:
        (tmp_path / name).mkdir()
        plan.append(pipeline.StageRun(name, StageSpec(name=name, command="verify", expect_seconds=expect),
                                   tmp_path / name, {}, chain=name, status=status))
    plan[1].seconds = 250.0  # this machine ran SFT 2.5x slower than the reference
    assert pipeline.time_left(plan, plan[1]) == (
        "[time] about 3 min left for 4 stages (this machine: 2.50x the reference's stage times)")
    # (20 + 40) * 2.5 = 150 s; skipped stages and the 2-second one do not count
    plan[2].seconds = 60.0  # under 10 s expected: not evidence of speed
    plan[3].seconds = 10.0  # eval ran at the reference's half time: factor (250 + 10) / 120
    assert "this machine: 2.17x" in pipeline.time_left(plan, plan[3])
    assert pipeline.time_left(plan, plan[0]) is None  # nothing timed yet
    plan[5].seconds = 40.0
    assert pipeline.time_left(plan, plan[6]) is None  # nothing left


def test_on_a_gpu_every_stage_that_loads_a_model_runs_in_its_own_process(monkeypatch, tmp_path):
    """The one-GPU recipe: `rl` trained in `reasoner run`'s own process, and the caching
    allocator kept its memory, so the next stage's vLLM start-up check found 7 of 24 GiB free.
    With a (fake) GPU every stage that loads a model runs in a process of its own, the data
    stage stays in this one; on a CPU-only machine all of them stay (a process start there costs
    an import of torch and transformers)."""
    import subprocess

    from reasoner import device as dev
    from reasoner.infer import engines

    base = Path(__file__).parents[3] / "configs" / "gsm8k_1gpu"
    stages = {s.name: s for s in pipeline.resolve(load_recipe(base / "recipe.yaml", []), base)}
    monkeypatch.setattr(engines, "pick_backend", lambda backend: "hf")  # no vLLM here
    monkeypatch.setattr(dev, "local_devices", lambda: None)
    assert not any(pipeline.own_process(s) for s in stages.values()
                   if not s.spec.launcher)
    monkeypatch.setattr(dev, "local_devices", lambda: ("gpu", 1, 24.0))
    own = {name for name, s in stages.items() if pipeline.own_process(s)}
    assert {"rl", "samples"} <= own and "verified" not in own
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, check: calls.append(cmd) or
                        subprocess.CompletedProcess(cmd, 0))
    pipeline._execute(stages["rl"], tmp_path / "rl.yaml")
    assert calls and calls[0][-2:] == ["train-offline", str(tmp_path / "rl.yaml")]


def test_a_stage_served_by_a_server_stays_here_and_is_not_planned(monkeypatch):
    """backend openai: the model is a server's. On a (fake) GPU the stage runs in this process
    (it loads no model) and `reasoner plan` gives it no row."""
    from reasoner import device as dev
    from reasoner.pipeline import plan

    base = Path(__file__).parents[3] / "configs" / "gsm8k_1gpu"
    served = ["samples.backend=openai", "samples.server.base_url=http://judge:8000/v1"]
    stages = {s.name: s for s in pipeline.resolve(load_recipe(base / "recipe.yaml", served), base)}
    monkeypatch.setattr(dev, "local_devices", lambda: ("gpu", 1, 24.0))
    assert not pipeline.own_process(stages["samples"]) and pipeline.own_process(stages["rl"])
    names = [p.name for p in plan.plan_recipe(base / "recipe.yaml", 1, 24.0, overrides=served)]
    assert "samples" not in names and "rl" in names


def test_only_runs_one_stage_under_its_launch_prefix(monkeypatch, tmp_path):
    """`reasoner run --only NAME --launch PREFIX` (what the Slurm script calls per stage): that
    stage alone, decided as the whole recipe decides it, run as PREFIX + its command line; the
    stages before it must be finished."""
    import subprocess

    base = Path(__file__).parents[3] / "configs" / "quickstart"
    recipe = load_recipe(base / "recipe.yaml", [f"run_dir={tmp_path}"])
    with pytest.raises(ConfigError, match=r"--only sft: the stages before it are not finished "
                       r"with this recipe \(data, tiny-init\); run them first"):
        pipeline.run(recipe, base, only="sft", echo=lambda _: None)
    with pytest.raises(ConfigError, match="--only runs one stage"):
        pipeline.run(recipe, base, until="sft", only="sft", echo=lambda _: None)
    plan = pipeline.run(recipe, base, only="data", dry_run=True, echo=lambda _: None)
    assert [(s.name, s.status) for s in plan] == [("data", "run")]

    stages = {s.name: s for s in pipeline.resolve(recipe, base)}
    state = {"stages": {n: {"chain": stages[n].chain, "digest": stages[n].digest,
                            "status": "done"} for n in ("data", "tiny-init")}}
    for n in ("data", "tiny-init"):
        stages[n].out.mkdir()
    (tmp_path / "pipeline.json").write_text(json.dumps(state))
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, check: calls.append(cmd) or
                        subprocess.CompletedProcess(cmd, 0))
    monkeypatch.setitem(pipeline.STAGES, "sft", dataclasses.replace(  # no sft/ to read
        pipeline.STAGES["sft"], headline=lambda out: ("", {})))
    ran = pipeline.run(recipe, base, only="sft", launch=["bash", "job.sbatch", "train", "3"],
                       echo=lambda _: None)
    assert [(s.name, s.status) for s in ran] == [("sft", "run")]
    assert calls == [["bash", "job.sbatch", "train", "3", "reasoner", "sft",
                      str(tmp_path / "configs" / "sft.yaml")]]
    assert json.loads((tmp_path / "pipeline.json").read_text())["stages"][
        "sft"]["status"] == "done"
