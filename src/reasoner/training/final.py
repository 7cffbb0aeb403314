"""`final/`: a finished training run's model as inference reads it, published from its last
checkpoint (`publish_final`): HF files without what only a resume reads, the weights in the
run's save dtype, the files that need no change hard-linked."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from reasoner.device import DistInfo, barrier
from reasoner.models.lora import REFERENCE_DIR
from reasoner.training.checkpoints import AUX

RESUME_ONLY = ("trainer_state.pt", "trainer_state.json", "optimizer", AUX, REFERENCE_DIR)


def publish_final(out_dir: Path, ckpt: Path, dtype: torch.dtype, dist: DistInfo) -> Path:
    """`out_dir/final`: the last checkpoint's HF files as inference reads them; every process
    calls it.

    Left out: what only a resume reads (trainer state, optimiser shards, the auxiliary models'
    `aux/`, a LoRA run's reference adapters). A LoRA run's trained adapters stay, in
    `adapter/`, beside the merged weights. The weights are written in `dtype` (the checkpoint keeps fp32 masters for an exact
    resume), each process converting its share of the safetensors files; files that need no
    change (tokenizer, generation config, the weights when `dtype` is float32) are hard links
    into the checkpoint where the file system allows, copies where not. Atomic: built under a
    temporary name, renamed when whole.
    """
    out_dir, ckpt = Path(out_dir), Path(ckpt)
    final, tmp = out_dir / "final", out_dir / ".final.tmp"
    weights = sorted(ckpt.glob("*.safetensors"))
    convert = dtype != torch.float32
    if dist.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for src in sorted(ckpt.iterdir()):
            if src.name in RESUME_ONLY or (convert and src in weights):
                continue
            if convert and src.name == "config.json":
                cfg = json.loads(src.read_text())
                cfg["dtype"] = str(dtype).removeprefix("torch.")
                (tmp / src.name).write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
            elif convert and src.name.endswith(".safetensors.index.json"):
                _write_index(src, tmp / src.name, dtype)
            else:
                _link_or_copy(src, tmp / src.name)
    barrier(dist)
    if convert:
        for src in weights[dist.rank::dist.world_size]:
            _convert_weights(src, tmp / src.name, dtype)
    barrier(dist)
    if dist.is_main:
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
    barrier(dist)
    return final


def _link_or_copy(src: Path, dst: Path) -> None:
    """A hard link (no bytes written), or a copy across file systems or where links are refused;
    folders (none in a checkpoint's HF files today) are copied."""
    if src.is_dir():
        shutil.copytree(src, dst)
        return
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _convert_weights(src: Path, dst: Path, dtype: torch.dtype) -> None:
    """One safetensors file with its floating-point tensors in `dtype` (integer ones as they are)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(src), framework="pt") as f:
        metadata = f.metadata()
        tensors = {name: _cast(f.get_tensor(name), dtype) for name in f.keys()}
    tmp = dst.with_name(dst.name + ".tmp")
    save_file(tensors, str(tmp), metadata=metadata)
    os.replace(tmp, dst)


def _cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t.to(dtype) if t.is_floating_point() else t


def _write_index(src: Path, dst: Path, dtype: torch.dtype) -> None:
    """A sharded model's index with the total size its converted weights will have."""
    index = json.loads(src.read_text())
    meta = index.setdefault("metadata", {})
    if "total_size" in meta:
        scale = torch.empty((), dtype=dtype).element_size() / 4
        meta["total_size"] = int(meta["total_size"] * scale)
    dst.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
