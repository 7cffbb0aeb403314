"""The published and one-GPU recipes as a user starts them: every outside input checked before
the first stage, the PCL problem pool read from its hub shape, the one-GPU plan fitting, the
one-GPU recipe's data path run on CPU with the GSM8K files of ../shared."""

import json
from pathlib import Path

import pytest
from tests_helpers import SHARED_EVAL, reasoner, shared_eval_rows

from reasoner.config import DataConfig
from reasoner.data import sources
from reasoner.records import Problem

REPO = Path(__file__).resolve().parents[2]
SHARED_TRAIN = SHARED_EVAL.parent / "train"


def test_a_dry_run_names_a_missing_outside_input_before_any_stage(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "run_dir: " + str(tmp_path / "run") + "\n"
        "stages:\n"
        "  - {name: samples, command: infer, config: " + str(REPO / "configs/quickstart/infer.yaml")
        + ", set: {model.name_or_path: " + str(tmp_path / "no-model") + ", data.path: "
        + str(tmp_path / "problems.jsonl") + "}}\n")
    for extra in (["--dry-run"], []):
        out = reasoner("run", recipe, *extra)
        assert out.returncode == 2 and "Traceback" not in out.stderr
        assert f"samples: model.name_or_path={tmp_path}/no-model: no such model folder" in out.stderr
        assert f"samples: data.path={tmp_path}/problems.jsonl: no such file or folder" in out.stderr
        assert "reasoner model import" in out.stderr  # how to make it
        assert not (tmp_path / "run").exists()  # nothing ran
    ok = reasoner("run", REPO / "configs/quickstart/recipe.yaml", f"run_dir={tmp_path}/q",
                  "--dry-run")
    assert ok.returncode == 0, ok.stderr  # every input of the quickstart is made by a stage


def test_every_shipped_recipe_can_start_or_names_what_another_run_makes(tmp_path):
    """Published recipes start from hub ids; the two that read another run's folders
    (recipe_vllm.yaml after the quickstart, smollm2_cpu after its model import) name only
    those, under runs/."""
    for recipe in sorted((REPO / "configs").rglob("recipe*.yaml")):
        out = reasoner("run", recipe, f"run_dir={tmp_path / recipe.stem}", "--dry-run")
        if recipe.name == "recipe_vllm.yaml" or recipe.parent.name == "smollm2_cpu":
            if out.returncode == 0:  # this checkout has made them (its quickstart, its import)
                assert (Path.cwd() / "runs").is_dir(), (recipe, out.stderr)
                continue
            missing = [line for line in out.stderr.splitlines() if line.startswith("  ")]
            assert out.returncode == 2 and missing, (recipe, out.stderr)
            assert all("=runs/" in line for line in missing), (recipe, missing)
            continue
        assert out.returncode == 0, (recipe, out.stderr)


def nemotron_rows():
    """Rows in Nemotron-Post-Training-Dataset-v1's shape: uuid / messages / metadata."""
    def row(uuid, question, solution):
        return {"uuid": uuid, "license": "CC BY 4.0", "category": "math",
                "messages": [{"role": "user", "content": question},
                             {"role": "assistant", "content": solution}],
                "metadata": json.dumps({"expected_answer": None})}
    return [row("u1", "What is 2+3?", "<think>2+3=5</think>The answer is $\\boxed{5}$."),
            row("u2", "Prove that there are infinitely many primes.", "Suppose not... QED."),
            row("u3", "Solve x^2=4, x>0.", "<think>x=\\boxed{-2}? no</think> So $x=\\boxed{2}$.")]


def test_the_pcl_pool_derives_answers_from_the_reference_solution(tmp_path, capsys):
    pool = tmp_path / "math.jsonl"
    pool.write_text("".join(json.dumps(r) + "\n" for r in nemotron_rows()))
    shipped = json.loads(json.dumps(
        __import__("yaml").safe_load((REPO / "configs/pcl_reasoner_v1_5/infer.yaml").read_text())
        ["data"]))
    assert shipped["path"] == "nvidia/Nemotron-Post-Training-Dataset-v1"
    assert shipped["streaming"] and shipped["data_files"] == {"math": "data/math-*"}
    local = DataConfig.model_validate({**shipped, "path": str(pool), "data_files": None,
                                       "streaming": False, "limit": None})
    rows = sources.read_rows(local, Problem)
    assert [(r["id"], r["problem"], r["answer"]) for r in rows] == [
        ("u1", "What is 2+3?", "5"), ("u3", "Solve x^2=4, x>0.", "2")]
    assert "skipped 1 rows whose messages.1.content has no \\boxed{} answer; kept 2" in \
        capsys.readouterr().err


def test_the_one_gpu_recipes_fit_their_gpu_and_time_with_its_peak():
    from reasoner.pipeline.plan import plan_recipe

    small = {p.name: p for p in plan_recipe(REPO / "configs/gsm8k_1gpu/recipe.yaml", 1, 24.0,
                                            "l4")}
    assert all(p.fits for p in small.values()), {n: p.verdict for n, p in small.items()}
    assert small["rl"].need_gib < 24
    big = {p.name: p for p in plan_recipe(REPO / "configs/gsm8k_1gpu/recipe_1p5b.yaml", 1, 80.0,
                                          "h100")}
    assert all(p.fits for p in big.values()) and 25 < big["rl"].need_gib < 40
    h100 = plan_recipe(REPO / "configs/gsm8k_1gpu/recipe.yaml", 1, 24.0, "h100")
    own = plan_recipe(REPO / "configs/gsm8k_1gpu/recipe.yaml", 1, 24.0, "l4", tflops=242.0)
    rl = {p.name: p for p in h100}["rl"].step_s
    assert small["rl"].step_s == pytest.approx(rl * 989 / 121)
    assert {p.name: p for p in own}["rl"].step_s == pytest.approx(small["rl"].step_s / 2)


@pytest.mark.slow
def test_the_one_gpu_recipe_data_path_runs_on_cpu_with_gsm8k(tmp_path, tiny_model_dir):
    """The one-GPU recipe's own configs, with the GSM8K files of ../shared instead of the hub,
    the tiny model instead of Qwen and the hf backend, at a few problems."""
    shared_eval_rows("gsm8k.jsonl")  # skips with the reason when ../shared is absent
    train, test = SHARED_TRAIN / "gsm8k_train.jsonl", SHARED_EVAL / "gsm8k.jsonl"
    small = ["backend=hf", "sampling.max_tokens=8", "model.dtype=float32", "max_model_len=512"]
    out = reasoner("run", REPO / "configs/gsm8k_1gpu/recipe.yaml", f"run_dir={tmp_path}",
                   f"start_model={tiny_model_dir}", "--until", "verified",
                   f"eval-start.data=[{{path: {test}, limit: 3}}]", "eval-start.sampling.n=1",
                   *[f"eval-start.{o}" for o in small], "eval-start.bootstrap=100",
                   f"samples.data.path={train}", "samples.data.limit=3", "samples.sampling.n=2",
                   *[f"samples.{o}" for o in small], "verified.workers=1")
    assert out.returncode == 0, out.stderr[-3000:]
    from reasoner.shards import iter_rows

    samples = list(iter_rows(tmp_path / "samples"))
    train_rows = [json.loads(line) for line in train.read_text().splitlines()[:3]]
    assert len(samples) == 6
    assert {r["answer"] for r in samples} == {r["answer"].split("####")[-1].strip()
                                              for r in train_rows}
    assert json.loads((tmp_path / "eval-start" / "report.json").read_text())["problems"] == 3
    assert (tmp_path / "verified" / "manifest.json").exists()
