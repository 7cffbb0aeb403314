"""Checkpoints: ordinary HF folders plus `trainer_state.pt`, written atomically.

A checkpoint holds the model as safetensors with its config, generation_config and tokenizer
(chat template included), so any stage and vLLM load it, plus `trainer_state.pt` (optimiser,
scheduler, step, RNG and whatever the stage adds). It is written under a temporary name and
renamed when complete, so an interrupted save never becomes the newest checkpoint.

With several processes nothing is gathered whole: the weights are gathered one tensor at a
time and written by rank 0 straight into safetensors files of at most SHARD_BYTES (with an
index), and the optimiser state is written by every process for its own shards (torch
.distributed.checkpoint, `optimizer/`), which also lets a run resume on another number of
processes.
Auxiliary models a stage trains or moves (OREAL's token RM and its optimiser, a moving
reference) go the same way, with any number of processes: `aux/`, every process its own
shards, never gathered whole.
"""

from __future__ import annotations

import json
import random
import shutil
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import nn

from reasoner.device import DistInfo, barrier
from reasoner.models import lora

CKPT_PREFIX = "checkpoint-"
AUX = "aux"  # the auxiliary models' shards (torch.distributed.checkpoint)
SHARD_BYTES = 2 * 2**30  # largest safetensors file of a streamed (multi-process) save


def list_checkpoints(out_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first (temporary folders of interrupted saves are ignored)."""
    found = []
    for p in Path(out_dir).glob(f"{CKPT_PREFIX}*"):
        suffix = p.name[len(CKPT_PREFIX):]
        if p.is_dir() and suffix.isdigit() and (p / "trainer_state.pt").exists():
            found.append((int(suffix), p))
    return [p for _, p in sorted(found)]


def latest_checkpoint(out_dir: Path, identity: str | None = None) -> Path | None:
    """The newest checkpoint (made under `identity`, when given: a checkpoint of another config
    or other inputs is never resumed from)."""
    ckpts = list_checkpoints(out_dir)
    if identity is not None:
        ckpts = [c for c in ckpts if _identity_of(c) == identity]
    return ckpts[-1] if ckpts else None


def _identity_of(ckpt: Path) -> str | None:
    try:
        return json.loads((ckpt / "trainer_state.json").read_text()).get("identity")
    except (OSError, json.JSONDecodeError):
        return None


def full_state(policy: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """Whole (unsharded, CPU) model and optimiser state dicts; a collective under FSDP."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_sd = get_model_state_dict(policy, options=opts)
    optim_sd = get_optimizer_state_dict(policy, optimizer, options=opts)
    return model_sd, optim_sd


def rng_state() -> dict:
    return {"python": random.getstate(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(out_dir: Path, step: int, policy: nn.Module, hf_model: nn.Module,
                    tokenizer: Any, optimizer: torch.optim.Optimizer, scheduler: Any,
                    state: dict, keep_last: int, dist: DistInfo, aux: dict | None = None) -> Path:
    """Write `checkpoint-{step}` atomically: HF folder + trainer_state.pt (+ `aux`: sharded
    state dicts of auxiliary models, see `aux_state`); keep the newest K."""
    if dist.world_size > 1:
        return _save_sharded(Path(out_dir), step, policy, hf_model, tokenizer, optimizer,
                             scheduler, state, keep_last, dist, aux)
    model_sd, optim_sd = full_state(policy, optimizer)  # collective: every rank calls it
    final = Path(out_dir) / f"{CKPT_PREFIX}{step}"
    if dist.is_main:
        tmp = Path(out_dir) / f".{CKPT_PREFIX}{step}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        weights = _untied(hf_model, model_sd)
        config = lora.config_of(hf_model)
        if config is not None:  # the merged model, and the adapters apart
            lora.save_sets(tmp, {n: t for n, t in weights.items() if lora.is_adapter(n)}, config)
        scale = config.lora_alpha / config.r if config is not None else 1.0
        save_hf(tmp, hf_model, tokenizer, {
            key: lora.combine([weights[n] for n in sources], scale)
            for key, sources in lora.weight_sources(list(weights))})
        if aux:
            _save_aux(tmp, aux)
        _finish_checkpoint(tmp, final, Path(out_dir), optim_sd, scheduler, step, state, keep_last)
    barrier(dist)
    return final


def _save_sharded(out_dir: Path, step: int, policy: nn.Module, hf_model: nn.Module,
                  tokenizer: Any, optimizer: torch.optim.Optimizer, scheduler: Any, state: dict,
                  keep_last: int, dist: DistInfo, aux: dict | None) -> Path:
    """The multi-process save: streamed weights, per-process optimiser shards (see top)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    final = out_dir / f"{CKPT_PREFIX}{step}"
    tmp = out_dir / f".{CKPT_PREFIX}{step}.tmp"
    if dist.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier(dist)
    stream_weights(tmp, policy, dist, config=lora.config_of(hf_model))
    dcp.save({"optimizer": get_optimizer_state_dict(policy, optimizer)},
             checkpoint_id=str(tmp / "optimizer"))
    if aux:
        _save_aux(tmp, aux)
    if dist.is_main:
        hf_model.config.save_pretrained(tmp)
        hf_model.generation_config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        _finish_checkpoint(tmp, final, out_dir, "optimizer/", scheduler, step, state, keep_last)
    barrier(dist)
    return final


def aux_state(models: dict[str, nn.Module], optimizers: dict[str, tuple]) -> dict:
    """The state dicts of auxiliary models (name: module) and their optimisers (name: (module,
    optimiser)) as each process holds them: FSDP2 shards stay shards (DTensors), so saving
    and loading them (`_save_aux`, `load_aux`) never gathers a model whole."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    state = {name: get_model_state_dict(m) for name, m in models.items()}
    state.update({name: get_optimizer_state_dict(m, opt) for name, (m, opt) in optimizers.items()})
    return state


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


@contextmanager
def _one_process_ok() -> Iterator[None]:
    """Silence DCP's warning that it assumes one process (it is one, here)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _save_aux(folder: Path, aux: dict) -> None:
    import torch.distributed.checkpoint as dcp

    with _one_process_ok():
        dcp.save(aux, checkpoint_id=str(folder / AUX), no_dist=not _distributed())


def load_aux(ckpt: Path, models: dict[str, nn.Module], optimizers: dict[str, tuple]) -> bool:
    """Restore what `aux_state` saved into `ckpt` (each process reads its own shards); False
    when the checkpoint has none."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    if not (Path(ckpt) / AUX).is_dir():
        return False
    state = aux_state(models, optimizers)  # the templates: this process's shards
    with _one_process_ok():
        dcp.load(state, checkpoint_id=str(Path(ckpt) / AUX), no_dist=not _distributed())
    for name, m in models.items():
        set_model_state_dict(m, state[name])
    for name, (m, opt) in optimizers.items():
        set_optimizer_state_dict(m, opt, optim_state_dict=state[name])
    return True


def _finish_checkpoint(tmp: Path, final: Path, out_dir: Path, optimizer_state: Any,
                       scheduler: Any, step: int, state: dict, keep_last: int) -> None:
    """Rank 0: trainer_state.pt / .json into `tmp`, rename it to `final`, keep the newest K.
    `optimizer_state` is the whole state dict, or the folder it was saved to shard by shard."""
    # through a Python file: a full disk is then an OSError (torch's own writer says it as a
    # RuntimeError, "unexpected pos ...")
    with open(tmp / "trainer_state.pt", "wb") as fh:
        torch.save({"optimizer": optimizer_state, "scheduler": scheduler.state_dict(),
                    "rng": rng_state(), "step": step, **state}, fh)
    (tmp / "trainer_state.json").write_text(json.dumps({"step": step, **{
        k: v for k, v in state.items() if isinstance(v, int | float | str)}}, indent=2))
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for old in list_checkpoints(out_dir)[:-keep_last]:
        shutil.rmtree(old)


@torch.no_grad()
def stream_weights(folder: Path, policy: nn.Module, dist: DistInfo,
                   shard_bytes: int | None = None, config: Any = None) -> None:
    """Write the HF weights of a sharded `policy` as safetensors, gathering one parameter at a
    time (a collective: every process calls it). The files (at most `shard_bytes` each, with
    an index) are laid out from the parameters' shapes first, so rank 0 writes each tensor
    into its place as soon as it is gathered and never holds more than one: holding a file's
    worth before writing it cost rank 0 a whole 2 GiB file (all of a 0.5B model) on top of its
    shards. Each tied weight once. `config`: a LoRA model's (models.lora.config_of): its
    layers written merged in fp32, the adapters in their own folders."""
    limit = shard_bytes or SHARD_BYTES
    params = dict(policy.named_parameters())
    scale = config.lora_alpha / config.r if config is not None else 1.0
    files: list[list[tuple[str, torch.Tensor, list[str]]]] = [[]]
    size = total = 0
    for name, sources in lora.weight_sources(list(params)):
        p = params[sources[0]]
        like = p if len(sources) == 1 else torch.empty(p.shape, dtype=torch.float32,
                                                        device="meta")
        nbytes = like.numel() * like.element_size()  # a DTensor's numel is the whole tensor's
        if files[-1] and size + nbytes > limit:
            files.append([])
            size = 0
        files[-1].append((name.removeprefix("model."), like, sources))
        size, total = size + nbytes, total + nbytes
    names = ["model.safetensors"] if len(files) == 1 else [
        f"model-{i + 1:05d}-of-{len(files):05d}.safetensors" for i in range(len(files))]
    for file, group in zip(names, files, strict=True):
        entries = [(key, like) for key, like, _ in group]
        with _SafetensorsWriter(folder / file, entries) if dist.is_main else nullcontext() as out:
            for _, _, sources in group:
                full = lora.combine([_whole(params[n]) for n in sources], scale)
                if out is not None:
                    out.write(full.detach())
    if dist.is_main and len(files) > 1:
        weight_map = {key: file for file, group in zip(names, files, strict=True)
                      for key, _, _ in group}
        (folder / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    if config is not None:
        adapters = {n: _whole(p) for n, p in params.items() if lora.is_adapter(n)}
        if dist.is_main:
            lora.save_sets(folder, adapters, config)


def _whole(p: torch.Tensor) -> torch.Tensor:
    """A parameter's whole tensor (gathered from its shards: a collective under FSDP2)."""
    return p.full_tensor() if hasattr(p, "full_tensor") else p


_SAFETENSORS_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16",
                       torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32",
                       torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
                       torch.bool: "BOOL"}


class _SafetensorsWriter:
    """A safetensors file written tensor by tensor, in the order of `params` (name, tensor
    whose shape and dtype are known up front): the header first (8-byte little-endian length,
    JSON padded to 8 bytes), then each tensor's bytes as it arrives. `safetensors` itself can
    only serialize tensors it holds all at once."""

    def __init__(self, path: Path, params: list[tuple[str, torch.Tensor]]):
        header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
        offset = 0
        self._expected = []
        for key, p in params:
            nbytes = p.numel() * p.element_size()
            header[key] = {"dtype": _SAFETENSORS_DTYPES[p.dtype], "shape": list(p.shape),
                           "data_offsets": [offset, offset + nbytes]}
            self._expected.append((key, tuple(p.shape), p.dtype))
            offset += nbytes
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)
        self._fh = open(path, "wb")  # noqa: SIM115  (closed on leaving the `with`)
        self._fh.write(len(text).to_bytes(8, "little") + text)
        self._next = 0

    def __enter__(self) -> _SafetensorsWriter:
        return self

    def write(self, t: torch.Tensor) -> None:
        key, shape, dtype = self._expected[self._next]
        if tuple(t.shape) != shape or t.dtype != dtype:
            raise ValueError(f"{key}: got {tuple(t.shape)} {t.dtype}, the header says "
                             f"{shape} {dtype}")
        flat = t.to("cpu").contiguous().reshape(-1)
        self._fh.write(flat.view(torch.uint8).numpy().data)  # no copy of the tensor's bytes
        self._next += 1

    def __exit__(self, exc_type, *exc) -> None:
        self._fh.close()
        if exc_type is None and self._next != len(self._expected):
            raise ValueError(f"{len(self._expected) - self._next} tensors were never written")


def _untied(hf_model: nn.Module, wrapped_sd: dict) -> dict:
    """The HF model's state dict from the wrapper's, each tied weight once (under its first name).

    A gathered (FSDP) state dict holds tied weights as separate copies, which save_pretrained
    would write twice; a plain one shares storage and is deduplicated. Both end up alike here.
    """
    sd = {k.removeprefix("model."): v for k, v in wrapped_sd.items()}
    unique = {name for name, _ in hf_model.named_parameters()}
    aliases = {name for name, _ in hf_model.named_parameters(remove_duplicate=False)} - unique
    return {k: v for k, v in sd.items() if k not in aliases}


def save_hf(folder: Path, hf_model: nn.Module, tokenizer: Any, state_dict: dict | None = None
            ) -> None:
    """An ordinary HF folder (safetensors, config, generation_config, tokenizer, chat template)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    hf_model.save_pretrained(folder, state_dict=state_dict)
    tokenizer.save_pretrained(folder)


def load_checkpoint_state(ckpt: Path, policy: nn.Module, optimizer: torch.optim.Optimizer,
                          scheduler: Any) -> dict:
    """Restore optimiser, scheduler and RNG from `ckpt`; return the saved trainer state."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    state = torch.load(Path(ckpt) / "trainer_state.pt", map_location="cpu", weights_only=False)
    if isinstance(state["optimizer"], str):  # written shard by shard (several processes)
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        sharded = {"optimizer": get_optimizer_state_dict(policy, optimizer)}
        dcp.load(sharded, checkpoint_id=str(Path(ckpt) / state["optimizer"]))
        set_optimizer_state_dict(policy, optimizer, optim_state_dict=sharded["optimizer"])
    else:
        set_optimizer_state_dict(policy, optimizer, optim_state_dict=state["optimizer"],
                                 options=StateDictOptions(full_state_dict=True))
    scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    return state
