"""What each optimiser step sees and at which learning rate: AdamW with its decay split, warmup
then cosine, and the deterministic epoch-by-epoch order of rows into global batches.

The row order depends only on (seed, epoch, step), never on the number of processes or on where a
run was resumed: every process computes the same global batch and takes its own slice of it.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from reasoner.config import OptimConfig, RunConfig


def build_optimizer(model: nn.Module, cfg: OptimConfig, fused: bool = False
                    ) -> torch.optim.AdamW:
    """AdamW; matrices decay, norms and biases do not (the usual split).

    `fused`: torch's one in-place kernel, no parameter-sized temporaries (the default foreach
    update on a GPU holds a second copy of every shard during the step). The trainers ask for it
    on CUDA without a loss scaler: fused AdamW subtracts the sharded scaler's found-inf flag,
    shape (1,), from its 0-d step counts and fails. CPU keeps the per-tensor loop: the fused
    kernel rounds differently, and the quickstart's published models were trained with the
    per-tensor one (docs/quickstart.md, "What is stable across machines")."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    other = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": other, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps,
                             fused=fused or None)


def lr_at(step: int, total_steps: int, cfg: OptimConfig) -> float:
    """Linear warmup over warmup_ratio of the steps, then cosine from lr down to min_lr."""
    warmup = math.ceil(cfg.warmup_ratio * total_steps)
    if step < warmup:
        return cfg.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, total_steps - warmup - 1)
    return cfg.min_lr + (cfg.lr - cfg.min_lr) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def build_scheduler(optimizer: torch.optim.Optimizer, total_steps: int, cfg: OptimConfig
                    ) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_at(step, total_steps, cfg) / cfg.lr)


def steps_per_epoch(num_rows: int, global_batch: int) -> int:
    return math.ceil(num_rows / global_batch)


def epoch_order(num_rows: int, seed: int, epoch: int) -> list[int]:
    """Deterministic shuffle of row indices for one epoch."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(num_rows, generator=g).tolist()


def global_batch_rows(num_rows: int, global_batch: int, seed: int, step: int) -> list[int]:
    """Rows of global step `step` (epoch by epoch, last batch of an epoch may be short)."""
    per_epoch = steps_per_epoch(num_rows, global_batch)
    epoch, k = divmod(step, per_epoch)
    order = epoch_order(num_rows, seed, epoch)
    return order[k * global_batch:(k + 1) * global_batch]


def total_steps(num_rows: int, run: RunConfig) -> int:
    steps = math.ceil(run.epochs * steps_per_epoch(num_rows, run.global_batch))
    return min(steps, run.max_steps) if run.max_steps else steps
