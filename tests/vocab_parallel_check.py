"""Run under torchrun with two processes: log-probs and gradients of a FSDP2-sharded policy
with a vocab-parallel embedding and lm-head, against the same model whole in each process.

    python -m torch.distributed.run --nproc_per_node=2 tests/vocab_parallel_check.py OUT.json

Each process scores its own row of a 2-row batch (different numbers of label tokens, pad
tokens in the inputs, and a third step where process 1 has no label tokens at all; from the
second step on, every process's counts handed in with the batch's layout); the whole
model scores both rows (then, under bf16 / fp16 autocast, the log-probs alone against an
fp64 reference). fp64, so that the sums over processes in another order agree to
~1e-12. Rank 0 writes the largest differences, and the rows of the lm-head each process held
while its forward's output was alive, to OUT.json."""

import copy
import json
import sys

import torch
import torch.distributed as dist
from tests_helpers import leave_process_group
from transformers import Qwen2Config, Qwen2ForCausalLM

from reasoner.data.packing import Layout, peer_sizes
from reasoner.models.fsdp import shard_modules
from reasoner.models.logprobs import PolicyLogprobs
from reasoner.models.vocab_layout import VocabSplit

VOCAB, PAD = 101, 0  # odd: the two processes hold 51 and 50 rows


def batch(step: int):
    g = torch.Generator().manual_seed(step)
    ids = torch.randint(1, VOCAB, (2, 12), generator=g)
    ids[0, -3:] = PAD
    labels = torch.full_like(ids, -100)
    labels[0, 2:8] = torch.randint(0, VOCAB, (6,), generator=g)
    labels[1, 5:11] = torch.randint(0, VOCAB, (6,), generator=g)
    labels[1, 3] = VOCAB - 1  # a target in the last row of the second process's half
    if step == 2:
        labels[1] = -100  # process 1 has nothing to score; it must still take part
    pos = torch.arange(12).expand(2, 12)
    return ids, pos, labels



def run(tied: bool) -> dict:
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                      tie_word_embeddings=tied, pad_token_id=PAD)
    whole = Qwen2ForCausalLM(cfg).double()
    ref = PolicyLogprobs(whole, chunk_size=5)  # several chunks per process
    pol = PolicyLogprobs(copy.deepcopy(whole), chunk_size=5)
    assert shard_modules(pol, pol.model, vocab=VocabSplit("vocab-parallel")) == "vocab-parallel"
    rank, out = dist.get_rank(), {"logprob": 0.0, "grad": 0.0, "head_rows_in_forward": []}
    for step in range(3):
        ids, pos, labels = batch(step)
        ref.zero_grad()
        pol.zero_grad()
        lp_all = ref(ids, pos, None, labels)
        coef = torch.linspace(-1.0, 2.0, lp_all.shape[0], dtype=lp_all.dtype)
        (lp_all * coef).sum().backward()
        layout = None  # step 0: every process's counts gathered from the device
        if step > 0:  # the trainers' way: every process's counts known on the host
            both = [Layout.of(labels[r:r + 1]) for r in range(2)]
            layout = both[rank].with_peers(peer_sizes(both))
        lp = pol(ids[rank:rank + 1], pos[rank:rank + 1], None, labels[rank:rank + 1], layout)
        head = pol.model.get_output_embeddings().weight
        local = head.to_local() if hasattr(head, "to_local") else head
        out["head_rows_in_forward"].append(local.shape[0])
        n0 = int((labels[0] >= 0).sum())
        share = slice(0, n0) if rank == 0 else slice(n0, None)
        if lp.numel():
            out["logprob"] = max(out["logprob"], float((lp - lp_all[share]).detach().abs().max()))
        (lp * coef[share]).sum().backward()  # each process's loss: its share of the whole's
        for p, q in zip(pol.parameters(), ref.parameters(), strict=True):
            g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad  # summed
            out["grad"] = max(out["grad"], float((g - q.grad).abs().max()))
    return out


def under_autocast(dtype: torch.dtype) -> dict:
    """`vocab_parallel.token_logprobs` under `dtype` autocast against the fp64 log-softmax of
    the `dtype`-rounded logits (rounding passed straight through), on confident tokens: the
    largest relative error of the log-probs and of both gradients."""
    from torch.distributed.device_mesh import init_device_mesh

    from reasoner.models import vocab_parallel

    g = torch.Generator().manual_seed(3)
    w = torch.randn(VOCAB, 64, generator=g)
    hs = [3 * torch.randn(n, 64, generator=g) for n in (20, 13)]  # both processes' tokens
    coefs = [torch.randn(h.shape[0], generator=g) for h in hs]
    ts = [(h @ w.T).argmax(-1) for h in hs]
    rank = dist.get_rank()
    param = vocab_parallel.shard_rows(w, init_device_mesh("cpu", (2,))).requires_grad_()
    h = hs[rank].clone().requires_grad_()
    from reasoner.training.host_syncs import HostSyncs

    counts = ((0, 20), (0, 13))  # every process's targets, known on the host (no ids here)
    with HostSyncs() as syncs:  # forward and backward, several chunks a process
        with torch.autocast("cpu", dtype=dtype, cache_enabled=False), \
                vocab_parallel.known_sizes(counts):
            lp = vocab_parallel.token_logprobs(h, param, ts[rank], 7)
        (lp * coefs[rank]).sum().backward()
    refused = ""
    try:  # a layout that says otherwise than the tokens at hand: refused before any collective
        with vocab_parallel.known_sizes(((0, 13), (0, 20))):
            vocab_parallel.token_logprobs(h, param, ts[rank], 7)
    except RuntimeError as e:
        refused = str(e)
    hd, wd = torch.cat(hs).double().requires_grad_(), w.double().requires_grad_()
    exact = hd @ wd.T
    rounded = (torch.cat(hs).to(dtype) @ w.to(dtype).T).double()
    ref = torch.log_softmax(exact + (rounded - exact).detach(), -1).gather(
        1, torch.cat(ts)[:, None])[:, 0]
    (ref * torch.cat(coefs).double()).sum().backward()
    mine = slice(0, 20) if rank == 0 else slice(20, None)
    start, stop = vocab_parallel.row_range(VOCAB)

    def rel(a, b):
        return float((a.double() - b).norm() / b.norm())

    return {"logprob": float((lp.double() - ref[mine]).abs().max()),
            "grad_hidden": rel(h.grad, hd.grad[mine]),
            "grad_rows": rel(param.grad.to_local(), wd.grad[start:stop]),
            "host_syncs": [f"{x.op} {x.site.split(':')[0]} {x.site.split(' ')[-1]}"
                           for x in syncs.found], "refused": refused}


def main() -> None:
    dist.init_process_group("gloo")
    result = {"tied": run(True), "untied": run(False),
              "bfloat16": under_autocast(torch.bfloat16), "float16": under_autocast(torch.float16)}
    if dist.get_rank() == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(result, f)
    leave_process_group()


if __name__ == "__main__":
    main()
