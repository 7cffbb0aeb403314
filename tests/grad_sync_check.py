"""Run under torchrun with two processes: gradients stay sharded between the micro-batches of
one global batch (training.accumulate), so no device holds a whole fp32 gradient.

    python -m torch.distributed.run --nproc_per_node=2 tests/grad_sync_check.py OUT.json

A tiny Qwen2 policy sharded with FSDP2 as the trainers shard it; three micro-batches per step.
After each micro-batch's backward, every sharded parameter must already hold its gradient as
this process's shard (a DTensor whose local part is its rows), not nothing (FSDP2 then keeps
an unsharded fp32 copy until the last micro-batch). Rank 0 writes what it saw to OUT.json."""

import json
import sys
from types import SimpleNamespace

import torch
import torch.distributed as dist
from tests_helpers import leave_process_group
from transformers import Qwen2Config, Qwen2ForCausalLM

from reasoner import training
from reasoner.device import DistInfo
from reasoner.models.fsdp import shard_modules
from reasoner.models.logprobs import PolicyLogprobs


def main(out: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    policy = PolicyLogprobs(Qwen2ForCausalLM(config), 16)
    shard_modules(policy, policy.model)
    sharded = [p for p in policy.parameters() if hasattr(p, "full_tensor")]
    run = SimpleNamespace(dist=DistInfo(rank, 2, rank), device=torch.device("cpu"), policy=policy,
                          scaler=None)
    seen = []

    def step(mb, scale):
        g = torch.Generator().manual_seed(10 * rank + mb)
        ids = torch.randint(1, 64, (1, 8), generator=g)
        labels = ids.clone()
        labels[0, :2] = -100
        logp = policy(ids, torch.arange(8)[None], None, labels)
        (-logp.sum() * scale).backward()
        held = [p.grad is not None and tuple(p.grad.to_local().shape) == tuple(p.to_local().shape)
                for p in sharded]
        seen.append(all(held))
        return training.MicroOut({"n": 1.0})

    training.accumulate(run, 3, step)
    policy.zero_grad(set_to_none=True)
    dist.barrier()  # every reduce-scatter done on both processes before either leaves
    if rank == 0:
        with open(out, "w") as fh:
            json.dump({"sharded_params": len(sharded), "grads_sharded_after_each": seen}, fh)
    leave_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
