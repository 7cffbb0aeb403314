"""Benchmark: peak memory and time of `token_logprobs` vs the naive log_softmax + gather.

    python scripts/bench_logprobs.py [--tokens 8192] [--vocab 151936] [--hidden 64] [--chunk 1024]

Each variant runs forward + backward in its own subprocess, which reports the growth of its
peak resident memory (VmHWM, `reasoner.device.peak_rss_bytes`) over the inputs, and the wall
time. Default shape: 8,192 response tokens and Qwen2.5's 151,936-token vocabulary on CPU (the
naive form needs ~15 GB).
Target: chunked peak <= 1/8 of naive.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import json, sys, time, torch
from reasoner.device import peak_rss_bytes
from reasoner.models.logprobs import token_logprobs
N, V, H, chunk = map(int, sys.argv[1:5])
torch.manual_seed(0)
h = torch.randn(N, H, requires_grad=True); w = (torch.randn(V, H) * 0.02).requires_grad_()
t = torch.randint(0, V, (N,))
base = peak_rss_bytes()
start = time.perf_counter()
if chunk:
    out = token_logprobs(h, w, t, chunk)
else:
    out = torch.log_softmax(h @ w.T, -1).gather(1, t[:, None])[:, 0]
out.sum().backward()
seconds = time.perf_counter() - start
peak = peak_rss_bytes() - base
print(json.dumps({"peak_bytes": peak, "seconds": seconds}))
"""


def measure(tokens: int, vocab: int, hidden: int, chunk: int) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(tokens), str(vocab), str(hidden),
                          str(chunk)], capture_output=True, text=True)
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr else f"exit {out.returncode}"}
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--chunk", type=int, default=1024)
    args = ap.parse_args()
    naive = measure(args.tokens, args.vocab, args.hidden, 0)
    chunked = measure(args.tokens, args.vocab, args.hidden, args.chunk)
    print(f"\n{args.tokens} tokens x {args.vocab} vocabulary, hidden {args.hidden}, chunk {args.chunk}\n")
    print("| variant | peak memory growth | time (fwd+bwd) |\n|---|---|---|")
    for name, r in (("naive log_softmax + gather", naive), ("token_logprobs (chunked)", chunked)):
        if "error" in r:
            print(f"| {name} | failed: {r['error']} | |")
        else:
            print(f"| {name} | {r['peak_bytes'] / 2**30:.2f} GiB | {r['seconds']:.2f} s |")
    if "error" not in naive and "error" not in chunked:
        print(f"\nchunked / naive memory: {chunked['peak_bytes'] / naive['peak_bytes']:.3f} "
              f"(target <= 0.125); time ratio {chunked['seconds'] / naive['seconds']:.2f}x")


if __name__ == "__main__":
    main()
