"""Ulysses sequence parallelism on two gloo processes against one process, in fp64.

    python -m torch.distributed.run --nproc_per_node=2 tests/sequence_parallel_check.py OUT.json

Each process builds the same tiny Qwen2 model twice: once as one process runs it (the kernel
alone) and once sequence-parallel over both processes. A packed flat row whose samples straddle
the slice boundary goes through both: the token log-probs must be equal, and the gradient of the
same loss, summed over the two processes (as FSDP2 sums them), must equal one process's; the row
goes with the collator's layout (host data: nothing read back), and without it the same numbers
come out. Also:
key/value heads that the group splits (2 of them) and that it replicates (1); sdpa and eager; a
micro-batch of one token, whose second slice is all padding. Rank 0 writes the largest
differences to OUT.json.
"""

import copy
import json
import sys

import numpy as np
import torch
import torch.distributed as dist
from tests_helpers import leave_process_group, strict_autograd
from transformers import AutoModelForCausalLM, Qwen2Config

from reasoner.data.packing import Layout
from reasoner.models import sequence_parallel
from reasoner.models.logprobs import PolicyLogprobs
from reasoner.models.sequence_parallel import SequenceGroup

LENGTHS = [5, 9, 4, 7]  # one flat row of 25 tokens: padded to 26, sliced at 13 (inside sample 1)


def layout(labels: torch.Tensor) -> Layout:
    """What the collator knows of the row, on the host: its targets and its samples."""
    return Layout(np.flatnonzero(labels.reshape(-1).numpy() >= 0), tuple(LENGTHS))


def row() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(1, 64, (1, sum(LENGTHS)), generator=g)
    pos = torch.cat([torch.arange(n) for n in LENGTHS])[None]
    labels = torch.full_like(ids, -100)
    start = 0
    for n in LENGTHS:  # every token but each sample's first is a target of the one before
        labels[0, start:start + n - 1] = ids[0, start + 1:start + n]
        start += n
    return ids, pos, labels


def compare(kernel: str, kv_heads: int, sp: SequenceGroup) -> dict:
    config = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=kv_heads,
                         tie_word_embeddings=True)
    torch.manual_seed(0)
    alone = AutoModelForCausalLM.from_config(config, attn_implementation=kernel,
                                             dtype=torch.float64)
    shared = AutoModelForCausalLM.from_config(  # its own config: loading sets the kernel on it
        copy.deepcopy(config), attn_implementation=sequence_parallel.enable(sp, kernel),
        dtype=torch.float64)
    shared.load_state_dict(alone.state_dict())
    one, two = PolicyLogprobs(alone, 16), PolicyLogprobs(shared, 16, sp=sp)
    ids, pos, labels = row()
    weight = torch.linspace(0.5, 1.5, int((labels >= 0).sum()), dtype=torch.float64)
    ref = one(ids, pos, None, labels)  # (N,)
    (ref * weight).sum().backward()
    got = two(ids, pos, None, labels, layout(labels))  # (N,), the whole row's on both
    (got * weight / sp.size).sum().backward()  # each process 1/size of the loss
    with torch.no_grad():  # no layout given: read back from the tensors, the same numbers
        found = two(ids, pos, None, labels)
    grads = []
    for a, b in zip(alone.parameters(), shared.parameters(), strict=True):
        g = b.grad.clone()
        dist.all_reduce(g)  # FSDP2 sums each parameter's gradient over the processes
        grads.append(float((g - a.grad).abs().max()))
    return {"logp": float((got - ref).abs().max()), "grad": max(grads), "tokens": ref.numel(),
            "found": float((found - got).abs().max())}


def one_token(sp: SequenceGroup) -> dict:
    """A micro-batch of one token (no target): the second process's slice is padding alone."""
    config = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        config, attn_implementation=sequence_parallel.enable(sp, "sdpa"), dtype=torch.float64)
    policy = PolicyLogprobs(model, 16, sp=sp)
    logp = policy(torch.tensor([[5]]), torch.tensor([[0]]), None, torch.tensor([[-100]]))
    loss = logp.sum() + 0.0 * sum(p.sum() for p in model.parameters())
    loss.backward()
    finite = all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    return {"tokens": logp.numel(), "loss": float(loss), "finite": bool(finite)}


def main(out: str) -> None:
    strict_autograd()  # a collective without a backward raises instead of zeroing gradients
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    sp = SequenceGroup(2, rank, dist.new_group([0, 1]))
    result = {f"{kernel}-kv{kv}": compare(kernel, kv, sp)
              for kernel in ("sdpa", "eager") for kv in (2, 1)}
    result["one_token"] = one_token(sp)
    dist.barrier()
    if rank == 0:
        with open(out, "w") as fh:
            json.dump(result, fh)
    leave_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
