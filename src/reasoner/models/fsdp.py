"""Sharded loading: under torchrun no process ever holds the whole model.

`load_sharded` builds the model with its parameters on the meta device, wraps it, shards it
with FSDP2 (`fully_shard` per decoder layer, then the root), gives storage to this process's
shards only and copies each shard's rows from the (memory-mapped) safetensors files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from reasoner.config import ModelConfig
from reasoner.errors import InputError
from reasoner.models import lora, vocab_parallel
from reasoner.models.vocab_layout import VocabSplit, vocab_layout


class SafetensorsSlices:
    """Read parts of the tensors of a safetensors checkpoint (one file or an index of several)
    without loading the rest: the files are memory-mapped, a slice reads only its rows."""

    def __init__(self, folder: Path):
        from safetensors import safe_open

        folder = Path(folder)
        index = folder / "model.safetensors.index.json"
        if index.exists():
            weight_map = json.loads(index.read_text())["weight_map"]
        elif (folder / "model.safetensors").exists():
            weight_map = None
        else:
            raise InputError(f"{folder}: sharded loading reads safetensors (model.safetensors or "
                             "an index); convert the model with `reasoner model import`")
        files = sorted(set(weight_map.values())) if weight_map else ["model.safetensors"]
        self._handles = {f: safe_open(str(folder / f), "pt") for f in files}
        self._where = weight_map or {k: "model.safetensors"
                                     for k in self._handles["model.safetensors"].keys()}

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Rows [start, stop) of dim 0 (the whole tensor for a scalar)."""
        sl = self._handles[self._where[name]].get_slice(name)
        return sl[start:stop] if len(sl.get_shape()) else sl[:]


class _WithAdapters:
    """A checkpoint's tensors plus whole adapter tensors held in memory, read alike."""

    def __init__(self, reader: SafetensorsSlices, tensors: dict[str, torch.Tensor]):
        self.reader, self.tensors = reader, tensors

    def __contains__(self, name: str) -> bool:
        return name in self.tensors or name in self.reader

    def rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        if name in self.tensors:
            return self.tensors[name][start:stop]
        return self.reader.rows(name, start, stop)


def model_folder(name_or_path: str) -> Path:
    """A local folder of the model: the path itself, or the hub cache (downloaded once)."""
    path = Path(name_or_path)
    if path.is_dir():
        return path
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(name_or_path, allow_patterns=["*.json", "*.safetensors"]))


def load_sharded(cfg: ModelConfig, source: str | Path, device: torch.device, dist: Any,
                 wrap: Any, skip: tuple[str, ...] = (), dtype: torch.dtype = torch.float32,
                 vocab: VocabSplit | None = None, adapters: lora.Adapters | None = None) -> Any:
    """`wrap(model)` FSDP2-sharded over the processes, each holding only its own shard.

    The model is built with its parameters on the meta device (buffers, such as the rotary
    frequencies, are computed for real), wrapped, sharded (`fully_shard` per decoder layer and
    the root), given storage for this process's shards only, and each shard is read from the
    safetensors files by rows, as fp32 master weights (`dtype`, the compute dtype, sets the
    mixed-precision policy: see `shard_modules`; `vocab`: how the embedding and lm-head are
    split). Parameter names starting with one of `skip` are not in the checkpoint (a head
    the caller initialises). `adapters`: LoRA layers injected on the meta device before
    sharding, the frozen base held in `dtype`, each adapter shard copied from its whole
    starting value (`lora.Adapters.values`) like a weight from the file.
    """
    from transformers import AutoConfig

    folder = model_folder(str(source))
    config = AutoConfig.from_pretrained(folder, trust_remote_code=cfg.trust_remote_code)
    wrapped, model = build_sharded(config, cfg, wrap, dtype, vocab, adapters)
    materialise(wrapped, device)
    reader: Any = SafetensorsSlices(folder)
    if adapters is not None:
        reader = _WithAdapters(reader, adapters.values(
            {n: p.shape for n, p in lora.adapter_names(model)}))
    with torch.no_grad():
        fill_shards(wrapped, reader, dist, skip)
    model.generation_config = _generation_config_of(folder, model)
    return wrapped


def build_sharded(config: Any, cfg: ModelConfig, wrap: Any, dtype: torch.dtype = torch.float32,
                  vocab: VocabSplit | None = None, adapters: lora.Adapters | None = None
                  ) -> tuple[Any, Any]:
    """(`wrap(model)`, the HF model) of `config` built with its parameters on the meta device
    (buffers, such as the rotary frequencies, computed for real), LoRA injected, sharded
    (`shard_modules`). `materialise` then gives this process's shards storage; `load_sharded`
    fills them from a checkpoint, the rehearsal (pipeline/rehearsal.py) leaves them fake."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(
            config, dtype=torch.float32, trust_remote_code=cfg.trust_remote_code,
            attn_implementation=cfg.attn_implementation or "sdpa")
    model.tie_weights()  # lm_head shares the embedding's parameter when the config ties them
    if adapters is not None:
        lora.inject(model, adapters.settings, adapters.sets, meta=True, base_dtype=dtype)
    wrapped = wrap(model)
    wrapped.vocab_layout = shard_modules(wrapped, model, dtype, vocab)  # reported at the end
    return wrapped, model


def materialise(wrapped: torch.nn.Module, device: torch.device) -> None:
    """Storage on `device` for this process's shards (left unfilled), the buffers kept."""
    buffers = {n: b.detach().clone() for n, b in wrapped.named_buffers()}
    wrapped.to_empty(device=device)
    with torch.no_grad():
        for n, b in wrapped.named_buffers():
            b.copy_(buffers[n])


def shard_modules(wrapped: torch.nn.Module, model: Any, dtype: torch.dtype = torch.float32,
                  vocab: VocabSplit | None = None) -> str:
    """`fully_shard` every decoder layer, then the root; the input embedding and lm-head are
    split as `vocab_layout` says (returned):

    - vocab-parallel (`vocab_parallel`): each process keeps its rows and never gathers them;
      activations travel instead, every process's to every other.
    - fsdp: each is an FSDP2 unit of its own, gathered only while it computes (the lm-head
      as a `LogprobHead`, so that the log-prob computation runs inside its forward).

    Left in the root unit, the lm-head (and a tied input embedding) would stay gathered from
    the start of forward to the end of backward with its gradient whole until then: 8 bytes x
    vocab x hidden on every process however many there are (1.1 GiB for Qwen2.5-0.5B).

    Precision (`mixed_precision`): bf16 / fp16 gather and compute in the half type, reduce in
    fp32 and keep fp32 master shards. Gradients are summed over the processes, never averaged (`sum_only`).
    """
    from torch.distributed.fsdp import fully_shard

    from reasoner.models.logprobs import LogprobHead

    policy = mixed_precision(dtype)
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=policy)
    mesh = next(model.model.layers[0].parameters()).device_mesh
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    tied = head is not None and head.weight is embed.weight
    layout = vocab_layout(vocab, mesh.size(), embed.weight.shape[1], embed.weight.shape[0],
                          tied, 2 if dtype == torch.bfloat16 else 4)
    ignored: set = set()
    if layout == "fsdp":
        fully_shard(embed, mesh=mesh, mp_policy=policy)
        if head is not None:
            head.__class__ = LogprobHead  # an nn.Linear subclass: same weights, same names
            fully_shard(head, mesh=mesh, mp_policy=policy)
    else:
        ignored = set(vocab_parallel.shard_vocab(model, mesh))
    fully_shard(wrapped, mesh=mesh, ignored_params=ignored, mp_policy=policy)
    sum_only(wrapped)
    return layout


def mixed_precision(dtype: torch.dtype) -> Any:
    """FSDP2's policy for a run computing in `dtype`.

    bf16 and fp16: parameters are all-gathered and used in the half type (half the traffic
    and gathered memory of fp32, and a half-precision residual stream: the hidden states each
    layer keeps for recomputation), gradients reduce-scattered in fp32 onto fp32 master shards.
    fp16 runs under dynamic loss scaling (`training.precision.make_scaler`); at the trainers'
    token-normalised loss a norm's weight gradient stays finite in fp16 at PCL's initial scale
    of 4096, even over a 51,200-token row
    (`tests/unit/models/test_fsdp.py::test_fp16_parameters_keep_norm_gradients_finite_at_the_trainers_loss`).
    fp32 (and the fp64 of tests): gathers and reductions in the parameters' dtype.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if dtype in (torch.bfloat16, torch.float16):
        return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()  # the parameters' own dtype throughout


def sum_only(wrapped: torch.nn.Module) -> None:
    """Make every FSDP2 unit under `wrapped` reduce its gradients with plain sums.

    Each process's loss is already its share of the global batch's (train_offline/losses.py), so
    the gradient wanted is the sum over processes: no divide at all. FSDP2 would otherwise reduce
    with `ReduceOp.AVG` (which torch_npu's HCCL refuses, and which would need undoing) or, with
    a divide factor, `PREMUL_SUM` (which gloo and HCCL lack).
    """
    from torch.distributed.fsdp import FSDPModule

    for m in wrapped.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)


def fill_shards(wrapped: torch.nn.Module, reader: SafetensorsSlices, dist: Any,
                skip: tuple[str, ...]) -> None:
    """Copy each parameter's local shard (FSDP2 shards dim 0 like torch.chunk) from `reader`.

    The names are the wrapped module's; the checkpoint's are found by dropping leading
    wrapper prefixes (`model.` of PolicyLogprobs) until one is in the file, a LoRA layer's
    `base_layer` read under the plain layer's name."""
    missing = []
    for name, p in wrapped.named_parameters():
        if name.startswith(skip):
            continue
        key = name if lora.is_adapter(name) else lora.base_name(name)
        while key not in reader and "." in key:
            key = key.split(".", 1)[1]
        if key not in reader:
            missing.append(name)
            continue
        local = p.to_local() if hasattr(p, "to_local") else p
        rows = local.shape[0] if local.dim() else 0
        start = 0
        if hasattr(p, "to_local") and local.dim():
            start, _ = vocab_parallel.row_range(p.shape[0], dist.rank, dist.world_size)
        if local.dim() and rows == 0:
            continue
        local.copy_(reader.rows(key, start, start + rows).to(local.dtype))
    if missing:
        raise InputError(f"the checkpoint lacks {len(missing)} parameters of the model "
                         f"({', '.join(missing[:4])}...); re-save it with `reasoner model import`")


def _generation_config_of(folder: Path, model: Any) -> Any:
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(folder)
    except OSError:
        return model.generation_config
