"""Run under torchrun with two processes: what the sharded trainers send, and what they get.

    python -m torch.distributed.run --nproc_per_node=2 tests/collectives_check.py OUT.json

A tiny untied Qwen2 policy is sharded as the trainers shard it (`fsdp.shard_modules`), in fp32,
bf16 and fp16. Every collective torch.distributed runs is wrapped to record its name, dtype and
reduce op. Each process scores its own row of a 2-row batch with its share of the loss; the
same model whole, in this process, scores both rows. Rank 0 writes, per dtype, the collectives
seen and how far the sharded gradients are from the whole model's to OUT.json.
"""

import copy
import json
import sys

import torch
import torch.distributed as dist
from tests_helpers import leave_process_group
from transformers import Qwen2Config, Qwen2ForCausalLM

from reasoner import device as dev
from reasoner.models.fsdp import shard_modules
from reasoner.models.logprobs import PolicyLogprobs

WRAPPED = ("all_gather_single", "all_gather_into_tensor", "all_gather", "reduce_scatter_single",
           "reduce_scatter_tensor", "reduce_scatter", "all_reduce", "reduce", "broadcast")
SEEN: list[tuple[str, str, str]] = []


def record(name: str, fn):
    def wrapper(*args, **kwargs):
        tensor = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
        if tensor is None and args and isinstance(args[0], list) and args[0]:
            tensor = args[0][0]
        op = kwargs.get("op")
        SEEN.append((name, str(tensor.dtype) if tensor is not None else "?",
                     "" if op is None else str(op)))
        return fn(*args, **kwargs)
    return wrapper


def batch():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 64, (2, 10), generator=g)
    labels = ids.clone()
    labels[:, :3] = -100
    return ids, torch.arange(10).expand(2, 10), labels


def run(dtype: torch.dtype) -> dict:
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False)
    whole = PolicyLogprobs(Qwen2ForCausalLM(cfg), chunk_size=16)
    pol = copy.deepcopy(whole)
    shard_modules(pol, pol.model, dtype)
    ids, pos, labels = batch()
    cpu = torch.device("cpu")
    with dev.autocast(cpu, dtype):
        lp_all = whole(ids, pos, None, labels)
    coef = torch.linspace(-1.0, 2.0, lp_all.shape[0])
    (lp_all.float() * coef).sum().backward()
    rank = dist.get_rank()
    n0 = int((labels[0] >= 0).sum())
    share = slice(0, n0) if rank == 0 else slice(n0, None)
    SEEN.clear()
    with dev.autocast(cpu, dtype):
        lp = pol(ids[rank:rank + 1], pos[rank:rank + 1], None, labels[rank:rank + 1])
    (lp.float() * coef[share]).sum().backward()
    seen = sorted(set(SEEN))
    err = 0.0
    for p, q in zip(pol.parameters(), whole.parameters(), strict=True):
        g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        err = max(err, float((g - q.grad).norm() / q.grad.norm().clamp_min(1e-12)))
    masters = sorted({str(p.dtype) for p in pol.parameters()})
    return {"collectives": seen, "grad_rel_err": err, "master_dtypes": masters}


def main() -> None:
    for name in WRAPPED:
        setattr(dist, name, record(name, getattr(dist, name)))
    dist.init_process_group("gloo")
    result = {"float32": run(torch.float32), "bfloat16": run(torch.bfloat16),
              "float16": run(torch.float16)}
    dist.barrier()
    if dist.get_rank() == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(result, f)
    leave_process_group()


if __name__ == "__main__":
    main()
