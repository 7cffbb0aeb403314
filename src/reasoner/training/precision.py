"""fp16 dynamic loss scaling and the global gradient norm: what an optimiser step checks
before it applies a gradient (`loop.optimizer_step`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from reasoner.config import OptimConfig
from reasoner.device import DistInfo

MIN_LOSS_SCALE = 2.0 ** -8  # below this every step has overflowed for a long time: stop


def clip_grad_norm(model: nn.Module, max_norm: float | None) -> float:
    """Global grad norm before clipping (works for plain and FSDP2-sharded parameters)."""
    return float(clip_grad_norm_on_device(model, max_norm))


def clip_grad_norm_on_device(model: nn.Module, max_norm: float | None) -> torch.Tensor:
    """`clip_grad_norm`, its norm left on the device (0-dim): nothing read back."""
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm else float("inf"))
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return norm


def make_scaler(optim: OptimConfig, device: torch.device, dtype: torch.dtype, dist: DistInfo
                ) -> Any:
    """fp16 dynamic loss scaling, or None (bf16 and fp32 need none).

    One process: torch.amp.GradScaler. Several: ShardedGradScaler, which all-reduces the
    overflow flag, so every rank skips the same steps (FSDP2 shards hold different gradients:
    one rank's overflow is everyone's). The scale is created on `device` at once, because
    the trainers scale their losses by the current value rather than through `scaler.scale`.
    """
    if dtype != torch.float16:
        return None
    kwargs = {"init_scale": optim.loss_scale, "growth_interval": optim.loss_scale_window}
    if dist.world_size > 1:
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        scaler = ShardedGradScaler(device.type, **kwargs)
    else:
        scaler = torch.amp.GradScaler(device.type, **kwargs)
    scaler.scale(torch.zeros((), device=device))  # creates the scale tensor on `device`
    return scaler


def loss_scale(scaler: Any) -> float:
    """The scaler's current scale (1 without one)."""
    return float(scaler.get_scale()) if scaler is not None else 1.0
