"""What bf16 costs on this CPU against fp32, and what `model.dtype: auto` picks here.

    python scripts/bench_cpu_dtype.py [--threads 1]
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 python scripts/bench_cpu_dtype.py  # AVX2-only

Prints the CPU probe (reasoner.cpu), then for fp32 and bf16: a 1024^2 matmul's GFLOP/s (per
thread), and the hf decode step of a 135M-shaped Llama (SmolLM2's widths, 4 of its 30 layers) at
batch 16, and the bf16 / fp32 ratio of each. Ratios, not absolute times: machines are shared.
"""

from __future__ import annotations

import argparse
import time

import torch


def best_of(fn, repeats: int = 5) -> float:
    fn()  # warm-up (oneDNN builds its kernels on the first call)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def matmul_gflops(dtype: torch.dtype, n: int = 1024) -> float:
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    return 2 * n ** 3 / best_of(lambda: a @ b) / 1e9


def decode_seconds(dtype: torch.dtype, rows: int = 16, steps: int = 8) -> float:
    from transformers import LlamaConfig, LlamaForCausalLM

    from reasoner.infer.decode_step import DecodeStep, greedy_logits

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=4,
                      num_attention_heads=9, num_key_value_heads=3, vocab_size=49152,
                      tie_word_embeddings=True, attn_implementation="sdpa")
    model = LlamaForCausalLM(cfg).to(dtype).eval()
    step = DecodeStep.for_model(model)
    ids = torch.randint(3, 1000, (rows, 32))

    def run():
        greedy_logits(model, step, ids, steps)

    return best_of(run, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from reasoner import cpu

    found = cpu.features()
    print(found.describe(cpu.auto_dtype()))
    print(f"model.dtype: auto on this CPU -> {str(cpu.auto_dtype()).removeprefix('torch.')}")
    mm = {d: matmul_gflops(d) for d in (torch.float32, torch.bfloat16)}
    dec = {d: decode_seconds(d) for d in (torch.float32, torch.bfloat16)}
    print(f"| what ({args.threads} thread(s)) | fp32 | bf16 | bf16 / fp32 time |")
    print("|---|---|---|---|")
    print(f"| 1024^2 matmul, GFLOP/s | {mm[torch.float32]:.1f} | {mm[torch.bfloat16]:.1f} | "
          f"{mm[torch.float32] / mm[torch.bfloat16]:.2f}x |")
    print(f"| decode step, 16 rows x 8 tokens, s | {dec[torch.float32]:.3f} | "
          f"{dec[torch.bfloat16]:.3f} | {dec[torch.bfloat16] / dec[torch.float32]:.2f}x |")


if __name__ == "__main__":
    main()
