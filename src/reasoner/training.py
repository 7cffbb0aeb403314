"""What `sft` and `train-offline` share: optimiser, schedule, sharding, checkpoints, metrics.

Plain functions, no trainer base class. Checkpoints are ordinary HF folders (safetensors,
tokenizer with its chat template, generation_config) plus `trainer_state.pt` (optimiser,
scheduler, step, RNG). A checkpoint is written under a temporary name and renamed when
complete, so an interrupted save never becomes the newest checkpoint.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from reasoner.config import OptimConfig, RunConfig
from reasoner.device import DistInfo

CKPT_PREFIX = "checkpoint-"


# --------------------------------------------------------------------------------------------
# Optimiser and schedule


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.AdamW:
    """AdamW; matrices decay, norms and biases do not (the usual split)."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    other = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": other, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)


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


def clip_grad_norm(model: nn.Module, max_norm: float | None) -> float:
    """Global grad norm before clipping (works for plain and FSDP2-sharded parameters)."""
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm else float("inf"))
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return float(norm)


# --------------------------------------------------------------------------------------------
# Batching plan


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


def local_micro_batches(rows: list[int], run: RunConfig, dist: DistInfo) -> list[list[int]]:
    """This process's share of a global batch, cut into micro-batches."""
    mine = rows[dist.rank::dist.world_size]
    return [mine[i:i + run.micro_batch] for i in range(0, len(mine), run.micro_batch)]


def total_steps(num_rows: int, run: RunConfig) -> int:
    steps = math.ceil(run.epochs * steps_per_epoch(num_rows, run.global_batch))
    return min(steps, run.max_steps) if run.max_steps else steps


# --------------------------------------------------------------------------------------------
# Distributed wrapping


def shard_model(policy: nn.Module, dist: DistInfo) -> nn.Module:
    """FSDP2 (`fully_shard`) over each decoder layer and the root, when several processes run."""
    if dist.world_size == 1:
        return policy
    from torch.distributed.fsdp import fully_shard

    for layer in policy.model.model.layers:
        fully_shard(layer)
    fully_shard(policy)
    return policy


def set_grad_sync(policy: nn.Module, enabled: bool) -> None:
    """Skip the gradient reduce on all but the last micro-batch of an accumulation."""
    if hasattr(policy, "set_requires_gradient_sync"):
        policy.set_requires_gradient_sync(enabled)


def all_reduce_sum(values: list[float], dist: DistInfo) -> list[float]:
    if dist.world_size == 1:
        return values
    import torch.distributed as tdist

    t = torch.tensor(values, dtype=torch.float64)
    tdist.all_reduce(t)
    return t.tolist()


def barrier(dist: DistInfo) -> None:
    if dist.world_size > 1:
        import torch.distributed as tdist

        tdist.barrier()


# --------------------------------------------------------------------------------------------
# Checkpoints


def list_checkpoints(out_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first (temporary folders of interrupted saves are ignored)."""
    found = []
    for p in Path(out_dir).glob(f"{CKPT_PREFIX}*"):
        suffix = p.name[len(CKPT_PREFIX):]
        if p.is_dir() and suffix.isdigit() and (p / "trainer_state.pt").exists():
            found.append((int(suffix), p))
    return [p for _, p in sorted(found)]


def latest_checkpoint(out_dir: Path) -> Path | None:
    ckpts = list_checkpoints(out_dir)
    return ckpts[-1] if ckpts else None


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
                    state: dict, keep_last: int, dist: DistInfo) -> Path:
    """Write `checkpoint-{step}` atomically: HF folder + trainer_state.pt; keep the newest K."""
    model_sd, optim_sd = full_state(policy, optimizer)  # collective: every rank calls it
    final = Path(out_dir) / f"{CKPT_PREFIX}{step}"
    if dist.is_main:
        tmp = Path(out_dir) / f".{CKPT_PREFIX}{step}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        save_hf(tmp, hf_model, tokenizer, _untied(hf_model, model_sd))
        torch.save({"optimizer": optim_sd, "scheduler": scheduler.state_dict(), "rng": rng_state(),
                    "step": step, **state}, tmp / "trainer_state.pt")
        (tmp / "trainer_state.json").write_text(json.dumps({"step": step, **{
            k: v for k, v in state.items() if isinstance(v, int | float | str)}}, indent=2))
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        for old in list_checkpoints(out_dir)[:-keep_last]:
            shutil.rmtree(old)
    barrier(dist)
    return final


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
    set_optimizer_state_dict(policy, optimizer, optim_state_dict=state["optimizer"],
                             options=StateDictOptions(full_state_dict=True))
    scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    return state


def restore_state(module: nn.Module, optimizer: torch.optim.Optimizer, model_sd: dict,
                  optim_sd: dict) -> None:
    """Load what `full_state` returned into a (possibly sharded) module and its optimiser."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    opts = StateDictOptions(full_state_dict=True)
    set_model_state_dict(module, model_sd, options=opts)
    set_optimizer_state_dict(module, optimizer, optim_state_dict=optim_sd, options=opts)


def publish_final(out_dir: Path, ckpt: Path) -> Path:
    """Copy the last checkpoint's HF files to `out_dir/final` (atomically: tmp, then rename)."""
    final, tmp = Path(out_dir) / "final", Path(out_dir) / ".final.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(ckpt, tmp, ignore=shutil.ignore_patterns("trainer_state.*"))
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    return final


def setup(device_pref: str, dtype_pref: str, seed: int) -> tuple[torch.device, DistInfo, torch.dtype]:
    """Device, process group and compute dtype of a training run; seeds torch."""
    from reasoner import device as dev

    device = dev.pick_device(device_pref)
    dist = dev.init_distributed(device)
    torch.manual_seed(seed)
    return device, dist, dev.pick_dtype(dtype_pref, device)


# --------------------------------------------------------------------------------------------
# Metrics and progress


class MetricsLog:
    """`metrics.jsonl` (one object per logged step) plus optional tensorboard / wandb."""

    def __init__(self, path: Path, sinks: list[str], config: dict, enabled: bool):
        self.enabled = enabled
        self.path = Path(path)
        self._tb = self._wandb = None
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if "tensorboard" in sinks:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as exc:
                raise ImportError("tracking: tensorboard needs pip install 'reasoner[tracking]'"
                                  ) from exc
            self._tb = SummaryWriter(str(self.path.parent / "tensorboard"))
        if "wandb" in sinks:
            try:
                import wandb
            except ImportError as exc:
                raise ImportError("tracking: wandb needs pip install 'reasoner[tracking]'") from exc
            self._wandb = wandb.init(config=config, dir=str(self.path.parent))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if not self.enabled:
            return
        with open(self.path, "a") as fh:
            fh.write(json.dumps({"step": step, **metrics}) + "\n")
        if self._tb:
            for k, v in metrics.items():
                self._tb.add_scalar(k, v, step)
        if self._wandb:
            self._wandb.log(metrics, step=step)

    def truncate_after(self, step: int) -> None:
        """On resume, forget rows logged after the checkpoint we restart from."""
        if not (self.enabled and self.path.exists()):
            return
        keep = [line for line in self.path.read_text().splitlines()
                if line.strip() and json.loads(line)["step"] <= step]
        self.path.write_text("".join(line + "\n" for line in keep))

    def close(self) -> None:
        if self._tb:
            self._tb.close()
        if self._wandb:
            self._wandb.finish()


def progress_bar(enabled: bool):
    """A rich progress bar with ETA (disabled off the main process or when asked)."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                    disable=not enabled, transient=False)


class Timer:
    def __init__(self) -> None:
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start
