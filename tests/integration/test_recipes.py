"""The published and one-GPU recipes as a user starts them: every outside input checked before
the first stage, the PCL problem pool read from its hub shape, the one-GPU plan fitting, the
one-GPU recipe's data path run on CPU with the local GSM8K benchmark file."""

import json
from pathlib import Path

import pytest
from tests_helpers import SHARED_EVAL, reasoner, shared_eval_rows

from reasoner import hub
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


def hub_holding_everything(monkeypatch) -> list[tuple[str, str]]:
    """A stand-in hub that holds every id it is asked for (tests never reach the real one);
    returns the (id, kind) asked, in order."""
    asked = []

    def lookup(name, kind, timeout_s=hub.TIMEOUT_S):
        asked.append((name, kind))

    monkeypatch.setattr(hub, "lookup", lookup)
    return asked


def test_every_shipped_recipe_can_start_or_names_what_another_run_makes(tmp_path, monkeypatch):
    """Published recipes start from hub ids (here a stand-in hub holds them all); the two that
    read another run's folders (recipe_vllm.yaml after the quickstart, smollm2_cpu after its
    model import) name only those, under runs/."""
    hub_holding_everything(monkeypatch)
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


PCL = REPO / "configs/pcl_reasoner_v1_5/recipe.yaml"


def test_a_dry_run_asks_the_hub_and_names_each_input_it_could_not_reach(tmp_path, monkeypatch):
    """Issue 51, finding 13: the PCL dry-run checked only that hub ids were well formed and
    exited 0 with no network; `eval aime` then failed after 25 s of retries. Now each hub id a
    stage still to run reads is looked up once (5 s at most); one that cannot be reached and
    is not cached here stops the dry run with its name, beside a missing local path."""
    from huggingface_hub import HfApi

    asked = []

    def no_answer(self, repo_id, timeout=None, **kw):
        asked.append((repo_id, timeout))
        raise TimeoutError("timed out")

    monkeypatch.setattr(HfApi, "model_info", no_answer)
    monkeypatch.setattr(HfApi, "dataset_info", no_answer)
    monkeypatch.setattr(hub, "in_cache", lambda name, kind: False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    gone = tmp_path / "judge-prompt.txt"
    out = reasoner("run", PCL, f"run_dir={tmp_path}/run", f"verify.judge.prompt_file={gone}",
                   "--dry-run", cwd=REPO)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert {t for _, t in asked} == {5.0}
    assert {name for name, _ in asked} == {
        "Qwen/Qwen2.5-32B", "a-m-team/AM-DeepSeek-R1-0528-Distilled",
        "nvidia/Nemotron-Post-Training-Dataset-v1", "Qwen/Qwen3-32B",
        "HuggingFaceH4/aime_2024", "opencompass/AIME2025"}
    said = " ".join(out.stderr.split())
    assert (f"verify: judge.prompt_file={gone}: no such file") in said
    assert ("verify: decontam.benchmarks.0.path=HuggingFaceH4/aime_2024: the hub could not be "
            "reached "
            "(TimeoutError: timed out; a look-up waits 5 s at most), and it is not in this "
            "machine's hub cache") in said
    assert "sft: model.name_or_path=Qwen/Qwen2.5-32B: the hub could not be reached" in said
    assert "HF_HUB_OFFLINE=1" in said  # what to do
    assert not (tmp_path / "run").exists()
    # cached here: the stage finds it offline, so the dry run goes on, saying so
    monkeypatch.setattr(hub, "in_cache", lambda name, kind: True)
    out = reasoner("run", PCL, f"run_dir={tmp_path}/run", "--dry-run", cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert "asked the hub for 6 id(s): 0 found, 6 not reachable but cached here" in " ".join(
        out.stderr.split())


def test_a_hub_id_the_hub_does_not_hold_is_named_before_any_stage(tmp_path, monkeypatch):
    """The hub answers: a data set it does not hold, a model repository without config.json."""
    from types import SimpleNamespace

    from huggingface_hub import HfApi

    def model_info(self, repo_id, timeout=None, **kw):
        return SimpleNamespace(siblings=[SimpleNamespace(rfilename="model.gguf")])

    def dataset_info(self, repo_id, timeout=None, **kw):
        if repo_id == "HuggingFaceH4/aime_2024":
            return SimpleNamespace(siblings=[])
        raise hub_not_found(repo_id)

    monkeypatch.setattr(HfApi, "model_info", model_info)
    monkeypatch.setattr(HfApi, "dataset_info", dataset_info)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    out = reasoner("run", REPO / "configs/gsm8k_1gpu/recipe.yaml", f"run_dir={tmp_path}",
                   "--dry-run", cwd=REPO)
    said = " ".join(out.stderr.split())
    assert out.returncode == 2
    assert ("eval-start: model.name_or_path=Qwen/Qwen2.5-0.5B-Instruct: on the hub, but with "
            "no config.json: not a transformers model") in said
    assert ("eval-start: data.0.path=openai/gsm8k: no such dataset on the hub (or a private "
            "one: log in first)") in said
    assert "aime_2024" not in said


def hub_not_found(repo_id: str) -> Exception:
    """The error huggingface_hub raises for a 404 on a repository."""
    import httpx2
    from huggingface_hub.errors import RepositoryNotFoundError

    url = f"https://huggingface.co/api/datasets/{repo_id}"
    response = httpx2.Response(404, request=httpx2.Request("GET", url))
    return RepositoryNotFoundError(f"404 Client Error: {url}", response=response)


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
    """The one-GPU recipe's own configs, with the local GSM8K benchmark file instead of the hub,
    the tiny model instead of Qwen and the hf backend, at a few problems."""
    shared_eval_rows("gsm8k.jsonl")  # skips with the reason when it is absent
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
