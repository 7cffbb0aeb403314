import subprocess
import sys

import pytest
import torch

from reasoner.logprobs import token_logprobs


@pytest.mark.parametrize("chunk", [1, 3, 7, 64, 4096])
def test_token_logprobs_equals_log_softmax_gather_values_and_grads(chunk):
    g = torch.Generator().manual_seed(chunk)
    h = torch.randn(37, 16, generator=g, dtype=torch.float64).requires_grad_()
    w = torch.randn(50, 16, generator=g, dtype=torch.float64).requires_grad_()
    t = torch.randint(0, 50, (37,), generator=g)
    coef = torch.randn(37, generator=g, dtype=torch.float64)
    ours = token_logprobs(h, w, t, chunk)
    (ours.double() * coef).sum().backward()
    gh, gw = h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None
    ref = torch.log_softmax(h @ w.T, -1).gather(1, t[:, None])[:, 0]
    (ref * coef).sum().backward()
    assert torch.allclose(ours.double(), ref, atol=1e-6)
    assert torch.allclose(gh, h.grad, atol=1e-6) and torch.allclose(gw, w.grad, atol=1e-6)


def test_empty_selection():
    w = torch.randn(5, 4, requires_grad=True)
    out = token_logprobs(torch.zeros(0, 4), w, torch.zeros(0, dtype=torch.long))
    assert out.shape == (0,)


PEAK = r"""
import resource, sys, torch
from reasoner.logprobs import token_logprobs
N, V, H, chunk = 4096, 32768, 64, int(sys.argv[1])
h = torch.randn(N, H, requires_grad=True); w = torch.randn(V, H, requires_grad=True)
t = torch.randint(0, V, (N,))
torch.ones(1)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
if chunk:
    token_logprobs(h, w, t, chunk).sum().backward()
else:
    torch.log_softmax(h @ w.T, -1).gather(1, t[:, None]).sum().backward()
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) * 1024)
"""


def test_peak_memory_stays_near_one_chunk():
    def peak(chunk: int) -> int:
        out = subprocess.run([sys.executable, "-c", PEAK, str(chunk)], capture_output=True,
                             text=True, check=True)
        return int(out.stdout.strip())

    logits_bytes = 4096 * 32768 * 4  # 512 MiB of fp32 logits
    chunked, naive = peak(256), peak(0)
    assert naive > logits_bytes  # the naive form holds at least the full logits
    assert chunked < logits_bytes / 8, (chunked, naive)
