import subprocess
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from reasoner.models.logprobs import token_logprobs


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


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_under_autocast_the_log_softmax_of_the_low_precision_logits_is_taken_in_fp32(dtype):
    """bf16 / fp16 autocast makes the lm-head product low-precision (as every trainer runs it);
    the log-sum-exp over the vocabulary must not be: in bf16 it is off by up to 0.2 nats at
    logits of about 10 (the log-probs of a bf16 run were that wrong before)."""
    g = torch.Generator().manual_seed(0)
    h = 3 * torch.randn(64, 64, generator=g)
    w = torch.randn(500, 64, generator=g)
    t = torch.randint(0, 500, (64,), generator=g)
    with torch.autocast("cpu", dtype=dtype, cache_enabled=False):
        ours = token_logprobs(h, w, t, 16)
        logits = h @ w.T
    assert logits.dtype == dtype
    ref = torch.log_softmax(logits.float(), -1).gather(1, t[:, None])[:, 0]
    assert ours.dtype == torch.float32
    assert (ours - ref).abs().max() < 1e-4


def straight_through_reference(h, w, t, dtype):
    """log-softmax of the `dtype`-rounded logits, in fp64, with the rounding passed straight
    through: the function the forward computes, and the gradient backward must return."""
    hd, wd = h.double().requires_grad_(), w.double().requires_grad_()
    exact = hd @ wd.T
    rounded = (h.to(dtype) @ w.to(dtype).T).double()
    logits = exact + (rounded - exact).detach()
    return hd, wd, torch.log_softmax(logits, -1).gather(1, t[:, None])[:, 0]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_under_autocast_backward_is_the_gradient_of_what_forward_returned(dtype):
    """Backward recomputes the lm-head product in the forward's precision, so its softmax is
    the one whose log-sum-exp the forward returned: the gradient is that of the returned value
    against the fp64 reference (recomputed in fp32, a confident token's gradient is several
    percent off in bf16)."""
    g = torch.Generator().manual_seed(1)
    h = (3 * torch.randn(48, 64, generator=g)).requires_grad_()
    w = torch.randn(300, 64, generator=g).requires_grad_()
    t = (h.detach() @ w.detach().T).argmax(-1)  # confident tokens: p(target) near 1
    coef = torch.randn(48, generator=g)
    with torch.autocast("cpu", dtype=dtype, cache_enabled=False):
        ours = token_logprobs(h, w, t, 16)
    (ours * coef).sum().backward()
    hd, wd, ref = straight_through_reference(h.detach(), w.detach(), t, dtype)
    (ref * coef.double()).sum().backward()
    assert (ours.double() - ref).abs().max() < 1e-5
    for mine, exact in ((h.grad, hd.grad), (w.grad, wd.grad)):
        assert float((mine.double() - exact).norm() / exact.norm()) < 5e-5


class Widened(TorchDispatchMode):
    """Counts the fp32 tensors of `shape` that any op makes: whole fp32 copies of a weight."""

    def __init__(self, shape: tuple[int, ...]):
        super().__init__()
        self.shape, self.made = shape, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.dtype == torch.float32 \
                    and tuple(t.shape) == self.shape:
                self.made += 1
        return out


def frozen_head_backward(w: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The hidden states' gradient through a frozen head `w` (300, 32) under bf16 autocast, and
    the whole fp32 copies of `w` its backward made."""
    g = torch.Generator().manual_seed(2)
    h = (3 * torch.randn(40, 32, generator=g)).requires_grad_()
    t = torch.randint(0, 300, (40,), generator=g)
    coef = torch.randn(40, generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
        out = token_logprobs(h, w, t, 16)
    with Widened(tuple(w.shape)) as seen:
        (out * coef).sum().backward()
    return h.grad, seen.made


def test_a_frozen_half_precision_head_is_never_widened_whole_in_backward():
    """A frozen bf16 lm-head (a LoRA base's; Qwen2.5-7B's would be a 2.03 GiB fp32 copy) is
    widened 16 rows at a time in backward, never whole, and gives the gradient the whole fp32
    copy gives, to fp32 rounding. A frozen fp32 head is used as it is: the same numbers as a
    trained fp32 head, bit for bit."""
    w = torch.randn(300, 32, generator=torch.Generator().manual_seed(3))
    half = w.bfloat16()
    grad, made = frozen_head_backward(half)
    assert made == 0
    widened, _ = frozen_head_backward(half.float())  # the same values, already fp32
    assert torch.allclose(grad, widened, rtol=1e-5, atol=1e-6)
    frozen, made_fp32 = frozen_head_backward(w)
    trained, _ = frozen_head_backward(w.clone().requires_grad_())
    assert made_fp32 == 0 and torch.equal(frozen, trained)


def test_empty_selection():
    w = torch.randn(5, 4, requires_grad=True)
    out = token_logprobs(torch.zeros(0, 4), w, torch.zeros(0, dtype=torch.long))
    assert out.shape == (0,)


PEAK = r"""
import sys, torch
from reasoner.device import peak_rss_bytes
from reasoner.models.logprobs import token_logprobs
V, H, chunk = 32768, 64, int(sys.argv[1])
torch.ones(1)
base = peak_rss_bytes()
for N in map(int, sys.argv[2:]):
    g = torch.Generator().manual_seed(N)
    h = torch.randn(N, H, requires_grad=True, generator=g)
    w = torch.randn(V, H, requires_grad=True, generator=g)
    t = torch.randint(0, V, (N,), generator=g)
    if chunk:
        token_logprobs(h, w, t, chunk).sum().backward()
    else:
        torch.log_softmax(h @ w.T, -1).gather(1, t[:, None]).sum().backward()
    print(peak_rss_bytes() - base)
"""


def test_peak_memory_is_a_few_chunks_and_does_not_grow_with_tokens():
    def peaks(chunk: int, *tokens: int) -> list[int]:
        out = subprocess.run([sys.executable, "-c", PEAK, str(chunk), *map(str, tokens)],
                             capture_output=True, text=True, check=True)
        return [int(line) for line in out.stdout.split()]

    # The parent touches more memory than either child will use, as a pytest worker that has
    # loaded models does: a child's ru_maxrss starts at its parent's peak, which hid the naive
    # form's peak in CI (it read 0). The children read their own peak (VmHWM).
    ballast = bytearray(3 * 2**30)
    ballast[::4096] = b"\1" * len(range(0, len(ballast), 4096))
    try:
        (naive,) = peaks(0, 4096)
        chunked, chunked_2x = peaks(256, 4096, 8192)
    finally:
        del ballast
    logits_bytes = 4096 * 32768 * 4  # 512 MiB of fp32 logits for 4,096 tokens
    assert naive > logits_bytes  # the naive form holds at least the full logits
    # 256-token chunks (32 MiB of logits each): a few chunk-sized buffers and allocator slack
    # (measured 139-163 MiB), a fraction of the naive form's 1.5 GiB.
    assert chunked < logits_bytes / 2, (chunked, naive)
    # Twice the tokens (512 MiB more logits) adds only the (N, H) buffers (measured 0-15 MiB).
    assert chunked_2x - chunked < 64 * 2**20, (chunked, chunked_2x)


def varlen_standin(seen: list):
    """A flash kernel's stand-in: records the boundaries it is given, computes sdpa per
    sequence (the boundaries read through numpy: a host sync no real varlen kernel makes, kept
    out of what `HostSyncs` records)."""

    def varlen(module, q, k, v, mask, dropout=0.0, scaling=None, **kw):  # (B, H, T, D) in
        seen.append({n: kw.get(n) for n in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q",
                                           "max_length_k")})
        cu = kw["cu_seq_lens_q"].numpy().tolist()
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
        outs = [torch.nn.functional.scaled_dot_product_attention(
            q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], is_causal=True, scale=scaling)
            for a, b in zip(cu[:-1], cu[1:], strict=True)]
        return torch.cat(outs, dim=2).transpose(1, 2), None  # (B, T, H, D)

    return varlen


def test_a_flat_packed_row_hands_its_boundaries_to_every_layers_varlen_kernel(tiny_model_dir,
                                                                               monkeypatch):
    """A flat micro-batch (1, T) of 3 packed samples (5, 3 and 4 tokens) under a flash kernel:
    every decoder layer's attention call receives the boundaries computed once from the position
    ids (cu_seq_lens [0, 5, 8, 12], longest 5), so transformers need not derive them (and sync
    with the host) in each layer. The flash kernel is a stand-in that records what it is given
    and computes sdpa per sequence; the log-probs equal the three samples scored apart."""
    from transformers import AutoModelForCausalLM
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from reasoner.models.logprobs import PolicyLogprobs

    seen = []
    # (its own entries: restored, an item of the instance would stay behind as one)
    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS._local_mapping, "flash_attention_2",
                        varlen_standin(seen))
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation="sdpa").eval()
    g = torch.Generator().manual_seed(0)
    samples = [torch.randint(3, 100, (n,), generator=g) for n in (5, 3, 4)]
    ids = torch.cat(samples).unsqueeze(0)
    pos = torch.cat([torch.arange(len(s)) for s in samples]).unsqueeze(0)
    labels = torch.cat([torch.cat([s[1:], s.new_tensor([-100])]) for s in samples]).unsqueeze(0)
    policy = PolicyLogprobs(model)
    with torch.no_grad():
        apart = torch.cat([policy(s.unsqueeze(0), torch.arange(len(s)).unsqueeze(0), None,
                                  torch.cat([s[1:], s.new_tensor([-100])]).unsqueeze(0))
                           for s in samples])
        model.config._attn_implementation = "flash_attention_2"
        flat = policy(ids, pos, None, labels)
    layers = model.config.num_hidden_layers
    assert len(seen) == layers
    for got in seen:
        assert got["cu_seq_lens_q"].tolist() == [0, 5, 8, 12] and got["cu_seq_lens_q"].dtype == torch.int32
        assert got["cu_seq_lens_k"] is got["cu_seq_lens_q"]  # computed once, shared by layers
        assert (got["max_length_q"], got["max_length_k"]) == (5, 5)
    assert seen[0]["cu_seq_lens_q"] is seen[-1]["cu_seq_lens_q"]
    torch.testing.assert_close(flat, apart, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kernel", ["sdpa", "flash_attention_2"])
def test_given_the_collators_layout_a_forward_and_backward_read_nothing_back(
        tiny_model_dir, monkeypatch, kernel):
    """Issue 52: with the batch's layout (where its targets and sequences lie, host data from the
    collator) the policy selects its targets and bounds its sequences without reading the
    device: the only host read left in forward and backward is transformers' own check of the
    position ids for packed sequences (which it skips on fake tensors). Without it, the layout
    is read back from the tensors once; the log-probs and gradients are the same bit for bit."""
    from transformers import AutoModelForCausalLM
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from reasoner.data.packing import collate_packed
    from reasoner.models.logprobs import PolicyLogprobs
    from reasoner.training.host_syncs import HostSyncs

    seen = []
    # (its own entries: restored, an item of the instance would stay behind as one)
    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS._local_mapping, "flash_attention_2",
                        varlen_standin(seen))
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation="sdpa")
    model.config._attn_implementation = kernel
    g = torch.Generator().manual_seed(0)
    samples = [(torch.randint(3, 100, (n,), generator=g).tolist(), [i > 1 for i in range(n)])
               for n in (5, 3, 4)]
    b = collate_packed([samples[:2], samples[2:]], seq_len=9, pad_id=0, flat=True)
    policy = PolicyLogprobs(model, chunk_size=4)
    results = []
    for layout in (b.layout, None):
        model.zero_grad()
        with HostSyncs() as syncs:
            logp = policy(b.input_ids, b.position_ids, None, b.labels, layout)  # (N,)
            (logp * torch.arange(logp.numel())).sum().backward()
        results.append((logp.detach(), [p.grad.clone() for p in model.parameters()], syncs))
    (given, grads, syncs), (found, grads_found, syncs_found) = results
    assert given.numel() == int((b.labels >= 0).sum()) == 6
    assert torch.equal(given, found) and all(map(torch.equal, grads, grads_found))
    assert [(s.op, s.via.split(":")[0]) for s in syncs.found] == [
        ("__bool__", "transformers/masking_utils.py")]
    assert sorted(s.op for s in syncs_found.found) == ["__bool__", "tolist"]
    if kernel.startswith("flash"):  # the layout's boundaries, given to every layer
        assert seen[0]["cu_seq_lens_q"].tolist() == [0, 5, 8, 9, 13, 18]
        assert seen[0]["max_length_q"] == 5
