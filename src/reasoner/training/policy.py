"""Where a trainer runs and what it trains: the device, process group and compute dtype
(`setup`), the checkpoint it continues from (`resume_point`), and a model loaded for training
(`load_policy`, `load_wrapped`): whole in one process, FSDP2-sharded as it loads in several, so
that no process ever holds a whole model.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from reasoner import device as dev
from reasoner import outputs
from reasoner.config import ModelConfig, RunConfig, TrainedModelConfig, TrainerConfig
from reasoner.device import Env
from reasoner.models import lora, sequence_parallel
from reasoner.models.load import fetch_once
from reasoner.models.sequence_parallel import SequenceGroup
from reasoner.models.vocab_layout import VocabSplit
from reasoner.training import checkpoints


@dataclass(frozen=True)
class Loaded:
    """A model loaded for training: the HF model (what checkpoints save) and the module that
    trains it (PolicyLogprobs or the token RM around it; FSDP2-sharded with several processes)."""

    model: nn.Module
    policy: nn.Module


def claim(cfg: TrainerConfig, stage: str) -> tuple[outputs.Identity, str]:
    """What this run does in its output folder (`outputs.decide`: complete, resume, new,
    replace), decided before any work: an output that is one of the inputs, a folder another
    stage or another config made, or an unfinished input shard are refused here. Every process
    reads the same; the main one says when there is nothing to do."""
    outputs.check_not_an_input(cfg.output_dir, cfg.inputs())
    for found in cfg.inputs():
        if found.kind in ("shard folder", "file or folder") and Path(found.value).is_dir():
            outputs.require_complete(Path(found.value), found.key, _finishing(found.key))
    identity = outputs.Identity.of(stage, cfg.result_config(), cfg.inputs())
    action = outputs.decide(Path(cfg.output_dir), identity, cfg.overwrite)
    if action == "complete" and dev.is_main_process():
        print(outputs.said_complete(stage, Path(cfg.output_dir)), file=sys.stderr)
    return identity, action


def _finishing(key: str) -> str:
    return {"input_dir": "rerun the `reasoner verify` that writes it",
            "data.path": "rerun the stage that writes it"}.get(key, "rerun the stage that writes it")


def setup(model: TrainedModelConfig, run: RunConfig, output_dir: Path | None = None) -> Env:
    """Device, process group and compute dtype of a training run; seeds torch. With several
    processes, every one must see the same `output_dir` (`device.check_same_folder`)."""
    sequence_parallel.check_model_heads(model.name_or_path, run.sequence_parallel)
    if model.device == "npu" or (model.device == "auto" and dev.npu_installed()):
        dev.set_hccl_timeout(run.dist_timeout_min)  # the CLI set it before torch (hccl.py)
    device = dev.pick_device(model.device)
    dist = dev.init_distributed(device, run.dist_timeout_min, run.sequence_parallel)
    if output_dir is not None:
        dev.check_same_folder(output_dir, dist, device)
    fetch_once(model.name_or_path, dist, device)  # one download, then every process offline
    lora.check_model_targets(model.name_or_path, model.lora, model.trust_remote_code)
    torch.manual_seed(run.seed)
    return Env(device, dist, dev.pick_dtype(model.dtype, device))


def resume_point(output_dir: Path, run: RunConfig, identity: str | None = None) -> Path | None:
    """The checkpoint this run continues from (run.resume=auto): the newest one made under this
    `identity` (outputs.Identity.digest), or None for a fresh start."""
    if run.resume != "auto":
        return None
    return checkpoints.latest_checkpoint(output_dir, identity)


def load_weights(model: ModelConfig, source: str | Path, device: torch.device,
                 attn: str | None = None, dtype: torch.dtype = torch.float32) -> nn.Module:
    """`source` (the configured model or a checkpoint) on `device` in `dtype`: fp32 master
    weights for a model that trains (autocast computes in the configured dtype on
    accelerators), the compute dtype for a frozen one."""
    from reasoner.models import load_model

    mcfg = model.model_copy(update={"name_or_path": str(source), "attn_implementation":
                                    attn or model.attn_implementation or "sdpa"})
    return load_model(mcfg, device, dtype)[0]


def load_wrapped(model: ModelConfig, source: str | Path, env: Env,
                 wrap: Callable[[nn.Module], nn.Module], attn: str | None = None,
                 vocab: VocabSplit | None = None, skip: tuple[str, ...] = (),
                 adapters: lora.Adapters | None = None, frozen: bool = False) -> Loaded:
    """`wrap(HF model of source)`: in one process the whole model; in several FSDP2-sharded as
    it loads (models.fsdp.load_sharded; `vocab`: how its embedding and lm-head split; `skip`:
    parameters of the wrapper that the checkpoint does not hold). `adapters`: LoRA on the
    model, its base frozen in the training dtype; a checkpoint of a LoRA run gives only the
    adapters' values, its base is the configured model. `frozen`: nothing of it trains (a
    fixed reference).

    A frozen model or LoRA base is read in the training dtype, so no whole fp32 copy of it
    ever reaches the device (Qwen2.5-7B: 30.5 GB in fp32, 15.2 GB in bf16); only what trains
    is fp32 (the adapters). Sharded, each process reads only its shards."""
    from reasoner.models.fsdp import load_sharded

    if adapters is not None and adapters.saved is not None:
        source = model.name_or_path
    if env.dist.world_size == 1:
        held = env.dtype if adapters is not None or frozen else torch.float32
        hf = load_weights(model, source, env.device, attn, held)
        if adapters is not None:
            lora.inject(hf, adapters.settings, adapters.sets, base_dtype=env.dtype)
            lora.initialise(hf, adapters)
            # its checkpoints' config says fp32 (merged layers are saved in fp32), as the
            # sharded loader's does, not the dtype the base was read in
            hf.config.dtype = torch.float32
        return Loaded(hf, wrap(hf))
    mcfg = model.model_copy(update={"attn_implementation": attn or model.attn_implementation})
    wrapped = load_sharded(mcfg, source, env.device, env.dist, wrap, skip=skip, dtype=env.dtype,
                           vocab=vocab, adapters=adapters)
    return Loaded(wrapped.model, wrapped)


def load_policy(model: ModelConfig, source: str | Path, env: Env, chunk: int,
                temperature: float = 1.0, attn: str | None = None,
                vocab: VocabSplit | None = None, adapters: lora.Adapters | None = None,
                frozen: bool = False) -> Loaded:
    """`source` as a policy: PolicyLogprobs around it, scoring `chunk` tokens at a time at
    `temperature` (each process its slice of a row under sequence parallelism); `frozen`: a
    model that only scores (a fixed reference), held in the training dtype."""
    from reasoner.models.logprobs import PolicyLogprobs

    sp = SequenceGroup.of(env.dist)
    return load_wrapped(model, source, env, lambda m: PolicyLogprobs(m, chunk, temperature, sp),
                        attn, vocab, adapters=adapters, frozen=frozen)


def warn_dropped(stage: str, dropped: int, total: int, max_tokens: int, dist: dev.DistInfo,
                 what: str = "samples") -> None:
    """Say at the start, not in the final table, when more than 5% of the data is dropped for
    its length (the summary counts them too)."""
    if total and dropped / total > 0.05 and dist.is_main:
        print(f"reasoner {stage}: warning: {dropped} of {total} {what} ({100 * dropped / total:.1f}%)"
              f" are longer than max_tokens={max_tokens} (or have no response) and are dropped; "
              "raise max_tokens to train on them", file=sys.stderr)


def exchanges_counts(state: Any) -> bool:
    """Whether the policy's vocab-parallel embedding and lm-head exchange every process's token
    counts each pass (`models.vocab_parallel`): then the trainers hand them in, found on the
    host (`packing.pass_peers`)."""
    return state.dist.world_size > 1 and \
        getattr(state.policy, "vocab_layout", "") == "vocab-parallel"
