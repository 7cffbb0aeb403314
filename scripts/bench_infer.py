"""Benchmark: generated tokens/s of the `hf` backend versus batch size (and vLLM if present).

    python scripts/bench_infer.py [--samples 256] [--max-tokens 64] [--model FOLDER]

Default model: a tiny Qwen2 built from scratch (random weights, so nearly every sample runs to
max_tokens and the numbers measure decoding alone). With `--vllm` and a GPU, the same requests
go through the vllm backend too. Prints a markdown table; ratios are what carry over between
machines.
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
from reasoner.infer.base import Request, sample_seed
from reasoner.models import build_tiny


def requests_for(tokenizer, n: int, max_tokens: int) -> list[Request]:
    train, _ = synthetic.generate(SynthConfig(output_dir=Path("-"), num_train=n, num_test=1))
    out = []
    for i, p in enumerate(train):
        ids = tokenizer(render_prompt(synthetic.problem_text(p), TemplateConfig(), tokenizer),
                        add_special_tokens=False)["input_ids"]
        out.append(Request(f"p{i}", 0, ids, sample_seed(0, f"p{i}", 0), max_tokens))
    return out


def measure(gen, requests: list[Request], sampling: SamplingConfig, batch: int) -> tuple[float, float]:
    started, tokens = time.perf_counter(), 0
    for i in range(0, len(requests), batch):
        tokens += sum(len(c.token_ids) for c in gen.generate(requests[i:i + batch], sampling))
    seconds = time.perf_counter() - started
    return tokens / seconds, len(requests) / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--batch-sizes", default="1,8,32,128")
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--vllm", action="store_true")
    ap.add_argument("--out", type=Path, default=Path("runs/bench_infer"))
    args = ap.parse_args()
    model = args.model or build_tiny(TinyConfig(output_dir=args.out / "model", overwrite=True))
    from reasoner.infer.hf import HFGenerator

    gen = HFGenerator(ModelConfig(name_or_path=str(model)))
    sampling = SamplingConfig(n=1, temperature=0.6, top_k=40, top_p=0.95,
                              max_tokens=args.max_tokens, logprobs=True)
    reqs = requests_for(gen.tokenizer, args.samples, args.max_tokens)
    measure(gen, reqs[:4], sampling, 4)  # warm-up
    rows = []
    for b in [int(x) for x in args.batch_sizes.split(",")]:
        n = reqs if b > 4 else reqs[: max(8, args.samples // 8)]
        tps, sps = measure(gen, n, sampling, b)
        rows.append((f"hf, batch {b}", tps, sps))
    if args.vllm:
        from reasoner.infer.vllm import VLLMGenerator

        vgen = VLLMGenerator(ModelConfig(name_or_path=str(model)), VLLMConfig(), None, 0, True)
        tps, sps = measure(vgen, reqs, sampling, len(reqs))
        rows.append(("vllm, all at once", tps, sps))
    base = rows[0][1]
    print(f"\n{model}: {args.samples} prompts, {args.max_tokens} new tokens each\n")
    print("| backend | generated tokens/s | samples/s | vs batch 1 |\n|---|---|---|---|")
    for name, tps, sps in rows:
        print(f"| {name} | {tps:,.0f} | {sps:.1f} | {tps / base:.1f}x |")


if __name__ == "__main__":
    main()
