"""The bytes per element of the hidden states entering the decoder layers, as the trainers run
them: in one process (this script alone) or two (under torchrun), for fp32, bf16 and fp16.

    python tests/activation_bytes_check.py MODEL OUT.json
    python -m torch.distributed.run --nproc_per_node=2 tests/activation_bytes_check.py MODEL OUT.json

The model is loaded by `training.load_policy` (FSDP2-sharded with the project's mixed precision
when two processes run); forward pre-hooks record the element size of the first decoder layer's
input (after FSDP2 has cast it, as the layer computes with it) and of the second's as the first
hands it over (before any cast: what activation checkpointing keeps). Rank 0 writes them.
"""

import json
import sys

import torch
from tests_helpers import leave_process_group

from reasoner import device as dev
from reasoner import training
from reasoner.config import ModelConfig, RunConfig


def sizes(model_dir: str, dtype: torch.dtype, dist: dev.DistInfo) -> dict:
    env = dev.Env(torch.device("cpu"), dist, dtype)
    loaded = training.load_policy(ModelConfig(name_or_path=model_dir), model_dir, env, 64)
    layers = loaded.model.model.layers
    seen = {}

    def hook(name):
        def record(module, args, kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            seen.setdefault(name, hidden.element_size())
        return record

    layers[0].register_forward_pre_hook(hook("first"), with_kwargs=True)
    layers[1].register_forward_pre_hook(hook("second"), with_kwargs=True, prepend=True)
    ids = torch.arange(1, 17)[None]
    labels = ids.clone()
    with dev.autocast(env.device, dtype):
        loaded.policy(ids, torch.arange(16)[None], None, labels)
    return seen


def main(model_dir: str, out: str) -> None:
    dist = dev.init_distributed(torch.device("cpu"), RunConfig().dist_timeout_min)
    result = {str(d).removeprefix("torch."): sizes(model_dir, d, dist)
              for d in (torch.float32, torch.bfloat16, torch.float16)}
    if dist.is_main:
        with open(out, "w") as fh:
            json.dump({"processes": dist.world_size, **result}, fh)
    if dist.world_size > 1:
        leave_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
