import math

import pytest
import torch
from tests_helpers import quiet

from reasoner import infer, shards
from reasoner.config import InferConfig, SamplingConfig
from reasoner.infer.base import Request, processed_logprobs, sample_seed, transform_logits
from reasoner.records import Sample


def cfg_for(synth_dir, model_dir, out, **kw) -> InferConfig:
    base = {"model": {"name_or_path": str(model_dir)},
            "data": {"path": str(synth_dir / "test_problems"), "limit": 3},
            "output_dir": str(out), "template": {"instruction": ""},
            "sampling": {"n": 4, "max_tokens": 12, "temperature": 1.0, "top_k": 40, "top_p": 0.95,
                         "logprobs": True, "seed": 0},
            "backend": "hf", "batch_size": 5}
    for key, value in kw.items():
        node = base
        *parents, last = key.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return InferConfig.model_validate(base)


def rows(folder):
    return list(shards.iter_rows(folder, Sample))


def test_n_samples_per_problem_with_keys_and_reproducible_seeds(tmp_path, synth_dir, tiny_model_dir):
    a = rows(infer.run(quiet(cfg_for(synth_dir, tiny_model_dir, tmp_path / "a"))))
    assert sorted((r["id"], r["sample_idx"]) for r in a) == sorted(
        (p["id"], k) for p in list(shards.iter_rows(synth_dir / "test_problems"))[:3] for k in range(4))
    assert all(r["seed"] == sample_seed(0, r["id"], r["sample_idx"]) for r in a)
    assert all(len(r["token_ids"]) == len(r["logprobs"]) == r["response_tokens"] for r in a)
    # same seed, other batching: identical samples; other seed: different samples
    b = rows(infer.run(quiet(cfg_for(synth_dir, tiny_model_dir, tmp_path / "b", batch_size=3))))
    key = lambda r: (r["id"], r["sample_idx"])  # noqa: E731
    assert [r["token_ids"] for r in sorted(a, key=key)] == [r["token_ids"] for r in sorted(b, key=key)]
    c = rows(infer.run(quiet(cfg_for(synth_dir, tiny_model_dir, tmp_path / "c", sampling__seed=1))))
    assert [r["token_ids"] for r in sorted(a, key=key)] != [r["token_ids"] for r in sorted(c, key=key)]
    # samples of one problem differ from each other (seeds differ per sample_idx)
    first = [r["token_ids"] for r in a if r["id"] == a[0]["id"]]
    assert len({tuple(t) for t in first}) > 1
    manifest = shards.read_manifest(tmp_path / "a")
    assert manifest["complete"] and manifest["counts"]["samples"] == 12
    # the entropy estimate ProRL watches: mean surprisal of the sampled tokens
    nll = [-x for r in a for x in r["logprobs"]]
    assert manifest["counts"]["token_entropy"] == pytest.approx(sum(nll) / len(nll), rel=1e-12)
    assert "token_entropy" not in shards.read_manifest(infer.run(quiet(cfg_for(
        synth_dir, tiny_model_dir, tmp_path / "d", sampling__logprobs=False))))["counts"]


def test_behaviour_logprobs_match_teacher_forced_recomputation(tmp_path, synth_dir, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    out = infer.run(quiet(cfg_for(synth_dir, tiny_model_dir, tmp_path / "a", sampling__max_tokens=20)))
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    sampling = SamplingConfig(temperature=1.0, top_k=40, top_p=0.95)
    checked = 0
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    for r in rows(out):
        prompt = tok(r["prompt"], add_special_tokens=False)["input_ids"]
        ids = torch.tensor([prompt + r["token_ids"]])
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt) - 1:-1]  # (T, V) predicting each response token
        recomputed = processed_logprobs(logits, torch.tensor(r["token_ids"]), sampling)
        # tolerance: fp32 logits of a batched, KV-cached pass vs one full pass
        assert torch.allclose(recomputed, torch.tensor(r["logprobs"]), atol=1e-4), r["sample_idx"]
        assert all(math.isfinite(x) for x in r["logprobs"])
        checked += len(r["token_ids"])
    assert checked > 50


def test_transform_logits_top_k_top_p_greedy():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isinf(transform_logits(logits, 1.0, 2, 1.0)[0, 2:]).all()
    kept = transform_logits(logits, 1.0, 0, 0.8)[0]  # 0.5 + 0.3 reach 0.8: the rest goes
    assert torch.isfinite(kept[:2]).all() and torch.isinf(kept[2:]).all()
    kept = transform_logits(logits, 1.0, 0, 0.81)[0]
    assert torch.isfinite(kept[:3]).all() and torch.isinf(kept[3])
    greedy = transform_logits(logits, 0.0, 40, 0.95)[0]
    assert greedy.tolist() == [0.0, float("-inf"), float("-inf"), float("-inf")]
    p = processed_logprobs(logits[0].repeat(2, 1), torch.tensor([0, 1]), SamplingConfig(
        temperature=1.0, top_k=0, top_p=0.8))
    assert torch.allclose(p, torch.log(torch.tensor([0.5 / 0.8, 0.3 / 0.8])))


def test_bad_inputs(tmp_path, synth_dir, tiny_model_dir):
    missing = tmp_path / "missing.jsonl"
    missing.write_text('{"id": "a", "problem": "1+1", "answer": "2"}\n{"id": "b", "problem": "x"}\n')
    with pytest.raises(shards.ShardError, match=f'{missing}:2: missing field "answer"'):
        infer.run(cfg_for(synth_dir, tiny_model_dir, tmp_path / "o", data__path=str(missing)))
    dup = tmp_path / "dup.jsonl"
    dup.write_text('{"id": "a", "problem": "1", "answer": "1"}\n' * 2)
    with pytest.raises(ValueError, match=r"duplicate problem ids \['a'\]"):
        infer.run(cfg_for(synth_dir, tiny_model_dir, tmp_path / "o", data__path=str(dup)))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match="no problems"):
        infer.run(cfg_for(synth_dir, tiny_model_dir, tmp_path / "o", data__path=str(empty)))
    mapped = tmp_path / "mapped.jsonl"  # the local eval files use prompt/answer; ids are made
    mapped.write_text('{"id": 1, "question": "Mia has 3 apples.", "answer": 3}\n'
                      '{"id": 2, "question": "' + "Mia has 3 apples. " * 60 + '", "answer": 4}\n')
    out = infer.run(quiet(cfg_for(synth_dir, tiny_model_dir, tmp_path / "long", data__path=str(mapped),
                            data__fields={"problem": "question"}, max_model_len=200)))
    got = rows(out)
    too_long = [r for r in got if r.get("error") == "prompt_too_long"]
    assert len(too_long) == 4 and all(r["id"] == "2" and r["response"] == "" for r in too_long)
    assert shards.read_manifest(out)["counts"]["prompt_too_long"] == 4
    assert len(got) == 8


def test_missing_vllm_names_the_extra(tmp_path, synth_dir, tiny_model_dir, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_vllm(name, *a, **kw):
        if name == "vllm" or name.startswith("vllm."):
            raise ImportError("No module named 'vllm'")
        return real_import(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_vllm)
    with pytest.raises(ImportError, match=r"pip install 'reasoner\[vllm\]'"):
        infer.run(cfg_for(synth_dir, tiny_model_dir, tmp_path / "v", backend="vllm"))


def test_vllm_backend_on_tiny_model(tmp_path, synth_dir, tiny_model_dir):
    pytest.importorskip("vllm", reason="vllm is not installed (GPU machines: pip install 'reasoner[vllm]')")
    from reasoner import device as dev

    if not dev.cuda_available():
        pytest.skip("vllm is installed but no GPU is visible")
    out = infer.run(quiet(cfg_for(synth_dir, tiny_model_dir, tmp_path / "v", backend="vllm",
                            vllm__gpu_memory_utilization=0.3)))
    got = rows(out)
    assert len(got) == 12 and all(len(r["token_ids"]) == len(r["logprobs"]) for r in got)


def test_request_is_hashable_key():
    r = Request("a", 1, [1, 2], 5, 10)
    assert (r.id, r.sample_idx) == ("a", 1)


def test_vllm_finish_reasons_keep_abort_and_error_and_verify_never_rewards_them():
    from reasoner.config import FilterConfig
    from reasoner.infer.vllm import finish_reason
    from reasoner.verify import filters

    assert [finish_reason(r) for r in ("stop", "length", "abort", "error", None)] == [
        "stop", "length", "abort", "error", "error"]
    rows = [{"id": "p", "sample_idx": k, "response": f"r{k}", "reward": 1.0, "verdict": "correct",
             "finish_reason": f, "response_tokens": 3, "reasoning_tokens": 1}
            for k, f in enumerate(("stop", "abort", "error", "length"))]
    kept, _ = filters.apply([dict(r) for r in rows], FilterConfig(truncated="negative",
                                                                   dedupe=False,
                                                                   drop_zero_variance=False))
    assert [r["reward"] for r in kept] == [1.0, -1.0, -1.0, -1.0]
    kept, _ = filters.apply([dict(r) for r in rows], FilterConfig(truncated="drop", dedupe=False,
                                                                   drop_zero_variance=False))
    assert [r["finish_reason"] for r in kept] == ["stop"]


def test_hf_row_stopped_on_a_string_keeps_no_pad_even_when_pad_is_an_eos(tiny_model_dir):
    from reasoner import models
    from reasoner.config import SamplingConfig
    from reasoner.infer.base import Request
    from reasoner.infer.hf import HFGenerator

    gen = object.__new__(HFGenerator)  # only the tokenizer and the stop ids are needed
    gen.tokenizer = models.load_tokenizer(str(tiny_model_dir))
    pad = gen.tokenizer.pad_token_id
    gen.eos_ids = {gen.tokenizer.eos_token_id, pad}
    body = gen.tokenizer("3 + 4 = 7 DONE more", add_special_tokens=False)["input_ids"]
    tokens = body + [pad, pad]
    lps = [-0.5] * len(tokens)
    c = gen._completion(tokens, lps, Request("p", 0, [1], 0, 64), SamplingConfig(stop=["DONE"]))
    assert c.finish_reason == "stop" and pad not in c.token_ids
    assert c.text.endswith("DONE") and len(c.logprobs) == len(c.token_ids) < len(body)


def test_each_sample_is_on_disk_as_soon_as_it_is_finished(tmp_path, synth_dir, tiny_model_dir,
                                                          monkeypatch):
    """A crash after 5 finished samples (of 12, in one decode batch of 12) keeps those 5; the
    rerun generates only the other 7, and the result equals an uninterrupted run."""
    from reasoner.infer.hf import HFGenerator

    real_stream = HFGenerator.stream

    def crashing(self, requests, sampling):
        for n, item in enumerate(real_stream(self, requests, sampling)):
            if n == 5:
                raise RuntimeError("node lost")
            yield item

    cfg = cfg_for(synth_dir, tiny_model_dir, tmp_path / "s", batch_size=12)
    monkeypatch.setattr(HFGenerator, "stream", crashing)
    with pytest.raises(RuntimeError, match="node lost"):
        infer.run(quiet(cfg))
    assert len(rows(tmp_path / "s")) == 5
    asked = []
    monkeypatch.setattr(HFGenerator, "stream", lambda self, requests, sampling: (
        asked.append(len(requests)) or real_stream(self, requests, sampling)))
    resumed = rows(infer.run(quiet(cfg)))
    assert asked == [7]
    whole = rows(infer.run(quiet(cfg_for(synth_dir, tiny_model_dir, tmp_path / "w"))))
    key = lambda r: (r["id"], r["sample_idx"])  # noqa: E731
    for a, b in zip(sorted(resumed, key=key), sorted(whole, key=key), strict=True):
        # the same tokens; log-probs to float rounding (another batch, other matmul shapes)
        assert {**a, "logprobs": None} == {**b, "logprobs": None}
        assert a["logprobs"] == pytest.approx(b["logprobs"], abs=1e-5)


def test_vllm_engine_settings_on_a_cpu_and_a_gpu():
    """On a CPU: fp32 for dtype auto (as hf), a KV cache of the configured size rather than
    90% of RAM, no chunked prefill (vLLM 0.32's CPU runner crashes on seeded requests whose
    prompt is split across steps) and a step budget that holds the longest prompt."""
    from reasoner.config import ModelConfig, VLLMConfig
    from reasoner.infer.vllm import engine_args

    model = ModelConfig(name_or_path="m")
    cpu = engine_args(model, VLLMConfig(cpu_kv_cache_gib=0.5), 16384, 7, True, on_cpu=True)
    assert cpu["dtype"] == "float32" and cpu["kv_cache_memory_bytes"] == 2**29
    assert cpu["enable_chunked_prefill"] is False and cpu["max_num_batched_tokens"] == 16384
    assert cpu["logprobs_mode"] == "processed_logprobs" and cpu["seed"] == 7
    assert "gpu_memory_utilization" not in cpu
    gpu = engine_args(model, VLLMConfig(), 4096, 0, False, on_cpu=False)
    assert gpu["dtype"] == "auto" and gpu["gpu_memory_utilization"] == 0.9
    assert not {"kv_cache_memory_bytes", "enable_chunked_prefill", "logprobs_mode"} & gpu.keys()
    bf16 = engine_args(ModelConfig(name_or_path="m", dtype="bfloat16"), VLLMConfig(), 4096, 0,
                       False, on_cpu=True)
    assert bf16["dtype"] == "bfloat16" and bf16["max_num_batched_tokens"] == 8192


def test_vllm_on_a_cpu_with_one_worker_runs_its_engine_in_this_process():
    """CPU, tensor parallel 1: no engine-core or worker process (each would import torch and
    vLLM again: minutes on a slow CPU); several CPU workers or a GPU keep vLLM's processes."""
    from reasoner.config import VLLMConfig
    from reasoner.infer.vllm import engine_env

    assert engine_env(VLLMConfig(), on_cpu=True) == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    assert engine_env(VLLMConfig(tensor_parallel_size=2), on_cpu=True) == {}
    assert engine_env(VLLMConfig(), on_cpu=False) == {}


def test_temperature_above_vllms_limit_is_refused_at_load():
    with pytest.raises(ValueError, match="temperature"):
        SamplingConfig(temperature=2.5)


def test_vllm_stream_tops_up_the_engine_and_aborts_what_an_early_exit_leaves(monkeypatch):
    """The step loop with a stand-in engine: at most max_pending requests in the engine, results
    as they finish, ids tagged per call, and a stream closed early aborts its leftovers (so a
    later call, e.g. a judge retry, never receives them)."""
    from types import SimpleNamespace

    import reasoner.infer.vllm as V

    class Engine:
        def __init__(self):
            self.queue, self.aborted, self.most = [], [], 0

        def add_request(self, rid, prompt, params):
            self.queue.append(rid)
            self.most = max(self.most, len(self.queue))

        def step(self):  # the newest request finishes first
            rid = self.queue.pop()
            out = SimpleNamespace(token_ids=[int(rid.split(":")[1])], logprobs=None,
                                  finish_reason="stop")
            return [SimpleNamespace(request_id=rid, finished=True, outputs=[out])]

        def abort_request(self, ids):
            self.aborted += ids
            self.queue = [r for r in self.queue if r not in ids]

    gen = object.__new__(V.VLLMGenerator)
    engine = Engine()
    gen.llm = SimpleNamespace(llm_engine=engine)
    gen.tokenizer = SimpleNamespace(decode=lambda ids, skip_special_tokens: f"t{ids[0]}")
    gen.preferred_batch, gen.calls, gen.stop_ids = 3, 0, []
    monkeypatch.setattr(V, "sampling_params", lambda sampling, r, stop_ids: None)
    sampling = SamplingConfig(temperature=0.6)
    requests = [Request("p", k, [1], k, 4) for k in range(5)]
    got = list(gen.stream(requests, sampling))
    assert [i for i, _ in got] == [2, 3, 4, 1, 0] and engine.most == 3
    assert [c.text for _, c in got] == ["t2", "t3", "t4", "t1", "t0"]
    early = gen.stream(requests, sampling)
    assert next(early)[0] == 2
    early.close()
    assert sorted(engine.aborted) == ["2:0", "2:1"] and engine.queue == []
    assert [c.text for c in gen.generate(requests[:2], sampling)] == ["t0", "t1"]


def test_the_decode_loop_uses_the_current_cache_argument(tiny_model_dir):
    """transformers 5.24 renamed the forward's past_key_values to cache; the old name warns
    (FutureWarning) and goes in 5.40. No warning from the project's own call."""
    import warnings

    from reasoner.config import ModelConfig
    from reasoner.infer.hf import HFGenerator

    gen = HFGenerator(ModelConfig(name_or_path=str(tiny_model_dir)), batch_size=4)
    ids = gen.tokenizer("Ana has 3 apples.", add_special_tokens=False)["input_ids"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        out = gen.generate([Request("p", 0, ids, 1, 5)], SamplingConfig(n=1, max_tokens=5))
    assert len(out[0].token_ids) >= 1
    import inspect

    expected = "cache" if "cache" in inspect.signature(gen.model.forward).parameters \
        else "past_key_values"
    assert gen.cache_arg == expected


def test_the_completion_check_holds_one_sample_at_a_time(tmp_path, monkeypatch):
    """At the recipe's size every node's completion check would hold ~60 GB of samples: it
    reads them one at a time, keeping keys and sums (here 200 samples, never more than 2
    alive), and still says what it said before: counts, means, entropy, duplicates."""
    import gc
    import weakref

    class Row(dict):  # a dict that can be watched
        pass

    alive, peak = [0], [0]

    def fake_rows(out, schema):
        for i in range(200):
            row = Row(id=f"p{i // 4}", sample_idx=i % 4, response_tokens=i % 7,
                      finish_reason="length" if i % 10 == 0 else "stop", logprobs=[-0.5] * (i % 7))
            alive[0] += 1
            weakref.finalize(row, lambda: alive.__setitem__(0, alive[0] - 1))
            gc.collect()
            peak[0] = max(peak[0], alive[0])
            yield row

    monkeypatch.setattr(infer.shards, "iter_rows", fake_rows)
    finished = {}
    monkeypatch.setattr(infer.shards, "finish", lambda out, counts, last_run: finished.update(counts))
    infer._finish_if_complete(tmp_path, [{"id": f"p{j}"} for j in range(50)], 4, {})
    assert peak[0] <= 2
    lengths = [i % 7 for i in range(200)]
    assert finished == {"problems": 50, "samples": 200, "mean_response_tokens": sum(lengths) / 200,
                        "max_response_tokens": 6, "truncation_rate": 0.1, "prompt_too_long": 0,
                        "token_entropy": 0.5}


def test_every_backend_implements_the_whole_generator_protocol():
    """infer, eval and the judge call every method of `Generator` on whatever backend they get
    (`engine_info` on every one: infer writes it into its manifest), so each backend class has
    them all."""
    import inspect

    from reasoner.infer.base import Generator
    from reasoner.infer.hf import HFGenerator
    from reasoner.infer.raygen import RayGenerator
    from reasoner.infer.server import ServerGenerator
    from reasoner.infer.vllm import VLLMGenerator

    methods = {n for n, v in vars(Generator).items() if inspect.isfunction(v) and not n.startswith("_")}
    assert {"stream", "generate", "engine_info", "close"} <= methods
    for backend in (HFGenerator, VLLMGenerator, ServerGenerator, RayGenerator):
        assert not [m for m in methods if not callable(getattr(backend, m, None))], backend
