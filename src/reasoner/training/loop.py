"""The training core `sft` and `train-offline` share, as plain functions over one `Run`.

`start` builds the run (model wrapped for log-probs and sharded with FSDP2 when several
processes run, optimiser, schedule, resume from the newest checkpoint, metrics log);
`accumulate` runs one global batch's micro-batches (the same count on every process; FSDP2
reduce-scatters each one's gradient, so gradients stay sharded between them) and reduces their
metrics; `optimizer_step` guards against a
non-finite loss, clips and steps; `end_step` logs (peak memory included), advances the progress
bar and checkpoints; `finish` saves the final model. Each stage's `run()` is a flat loop over
these, like a torchtune recipe. Losses scale each micro-batch to its share of the global batch
(see rl/losses.py), so a step's gradient does not depend on how the batch was cut.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from reasoner import device as dev
from reasoner import shards
from reasoner.config import ModelConfig, OptimConfig, RunConfig, dump
from reasoner.device import DistInfo
from reasoner.errors import TrainingError
from reasoner.models.fsdp import VocabSplit
from reasoner.runlog import MetricsLog, Timer, progress_bar
from reasoner.training import checkpoints, schedule


class TrainerConfig(Protocol):
    """What the training core reads of a stage config (SFTConfig and OfflineConfig have it)."""

    model: ModelConfig
    optim: OptimConfig
    run: RunConfig
    output_dir: Path
    packing: bool
    seq_len: int
    max_tokens: int


def vocab_split(cfg: TrainerConfig, env: Env, extra: int = 0) -> VocabSplit:
    """How the embedding and lm-head split over the processes: run.vocab_layout, or for `auto`
    what `reasoner plan` picks for this model on these devices (`memory.choose_vocab_layout`;
    `extra`: bytes per parameter of models beside the policy), rank 0's choice for every rank."""
    from reasoner.pipeline import memory

    device, dist, dtype = env
    asked = layout = cfg.run.vocab_layout
    layouts = ("auto", "vocab-parallel", "fsdp")
    if layout == "auto" and dist.world_size > 1 and dist.is_main:
        try:  # without a config.json to read here, the traffic alone decides (`auto`)
            shape = memory.shape_of(str(cfg.model.name_or_path))
            found = dev.local_devices() if device.type != "cpu" else None
            layout = memory.choose_vocab_layout(cfg, shape, dist.world_size,
                                                found[2] if found else None,
                                                torch.tensor([], dtype=dtype).element_size(),
                                                extra)
        except Exception:  # noqa: BLE001  (rank 0 must reach the vote below, whatever failed)
            layout = "auto"
    if dist.world_size > 1:
        mine = [float(layouts.index(layout)) if dist.is_main else 0.0]
        layout = layouts[int(dev.all_reduce(mine, dist, device)[0])]
    width = cfg.seq_len if cfg.packing else cfg.max_tokens
    return VocabSplit(layout, cfg.run.micro_batch * width, chosen=asked == "auto")


Env = tuple[torch.device, DistInfo, torch.dtype]  # device, process group, compute dtype

# --------------------------------------------------------------------------------------------
# Gradients


def clip_grad_norm(model: nn.Module, max_norm: float | None) -> float:
    """Global grad norm before clipping (works for plain and FSDP2-sharded parameters)."""
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm else float("inf"))
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return float(norm)


# --------------------------------------------------------------------------------------------
# Distributed wrapping


def shard_model(policy: nn.Module, dist: DistInfo, dtype: torch.dtype = torch.float32
                ) -> nn.Module:
    """FSDP2 (`fully_shard`) over each decoder layer and the root, when several processes run
    (for a module built whole; `load_policy` shards before any weight is read)."""
    if dist.world_size == 1:
        return policy
    from reasoner.models.fsdp import shard_modules

    shard_modules(policy, policy.model, dtype)
    return policy


# --------------------------------------------------------------------------------------------
# The run


@dataclass
class MicroOut:
    """What one micro-batch's forward + backward reports."""

    sums: dict[str, float]  # added up over micro-batches and processes (loss shares, counts)
    means: dict[str, float] = field(default_factory=dict)  # averaged by `weight`; NaN skipped;
    weight: float = 0.0  # keys ending _max / _min take the maximum / minimum instead


@dataclass
class Run:
    """One training run's live state: what a step, a log line and a checkpoint need."""

    optim: OptimConfig  # gradient clipping
    settings: RunConfig  # logging, checkpoints, progress
    out: Path  # the stage's output folder
    device: torch.device
    dist: DistInfo
    dtype: torch.dtype
    tokenizer: Any
    model: nn.Module  # the HF model: what checkpoints save
    policy: nn.Module  # PolicyLogprobs around it, FSDP2-sharded with several processes
    optimizer: torch.optim.Optimizer
    scheduler: Any
    total: int  # optimiser steps in the whole run
    start: int  # first step of this invocation (> 0 when resumed)
    saved: dict  # trainer state of the checkpoint resumed from ({} when fresh)
    metrics: MetricsLog
    scaler: Any = None  # dynamic loss scaler (fp16 only; see make_scaler)
    timer: Timer = field(default_factory=lambda: Timer())
    tokens: float = 0.0  # real tokens trained on by this invocation
    skipped_in_a_row: int = 0  # steps skipped for a non-finite gradient norm, consecutively
    skipped: int = 0  # ... and in all, this invocation
    bar: Any = None
    aux: Callable[[], dict] | None = None  # auxiliary models' shards to checkpoint (aux_state)


def setup(model: ModelConfig, seed: int, dist_timeout_min: float = 60.0,
          output_dir: Path | None = None) -> Env:
    """Device, process group and compute dtype of a training run; seeds torch. With several
    processes, every one must see the same `output_dir` (`device.check_same_folder`)."""
    device = dev.pick_device(model.device)
    dist = dev.init_distributed(device, dist_timeout_min)
    if output_dir is not None:
        dev.check_same_folder(output_dir, dist, device)
    torch.manual_seed(seed)
    return device, dist, dev.pick_dtype(model.dtype, device)


def resume_point(output_dir: Path, run: RunConfig) -> Path | None:
    """The checkpoint this run continues from (run.resume=auto), or None for a fresh start."""
    return checkpoints.latest_checkpoint(output_dir) if run.resume == "auto" else None


def load_weights(model: ModelConfig, source: str | Path, device: torch.device,
                 attn: str | None = None) -> nn.Module:
    """fp32 master weights of `source` (the configured model or a checkpoint); autocast computes
    in the configured dtype on accelerators."""
    from reasoner.models import load_model

    mcfg = model.model_copy(update={"name_or_path": str(source), "dtype": "float32",
                                    "attn_implementation": attn or model.attn_implementation
                                    or "sdpa"})
    return load_model(mcfg, device)[0]


MIN_LOSS_SCALE = 2.0 ** -8  # below this every step has overflowed for a long time: stop


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


def loss_scale(run: Run) -> float:
    return float(run.scaler.get_scale()) if run.scaler is not None else 1.0


def load_policy(model: ModelConfig, source: str | Path, env: Env, chunk: int,
                temperature: float = 1.0, attn: str | None = None,
                vocab: VocabSplit | None = None) -> tuple[nn.Module, nn.Module]:
    """(HF model, PolicyLogprobs around it) of `source`, scoring `chunk` tokens at a time. One
    process: the whole model. Several: FSDP2-sharded as it loads, so no process ever holds the
    whole model (models.fsdp.load_sharded; `vocab`: how its embedding and lm-head split)."""
    from reasoner.models.fsdp import load_sharded
    from reasoner.models.logprobs import PolicyLogprobs

    device, dist, dtype = env
    if dist.world_size == 1:
        hf = load_weights(model, source, device, attn)
        return hf, PolicyLogprobs(hf, chunk, temperature)
    mcfg = model.model_copy(update={"attn_implementation": attn or model.attn_implementation})
    policy = load_sharded(mcfg, source, device, dist,
                          lambda m: PolicyLogprobs(m, chunk, temperature), dtype=dtype,
                          vocab=vocab)
    return policy.model, policy


def start(cfg: TrainerConfig, stage: str, env: Env, tokenizer: Any,
          loaded: tuple[nn.Module, nn.Module], total: int, ckpt: Path | None, inputs: dict) -> Run:
    """Build optimiser and schedule for the (model, policy) of `load_policy`, restore `ckpt`
    when resuming."""
    device, dist, dtype = env
    model, policy = loaded
    if cfg.run.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    policy.train()
    scaler = make_scaler(cfg.optim, device, dtype, dist)
    optimizer = schedule.build_optimizer(policy, cfg.optim, device.type == "cuda" and not scaler)
    scheduler = schedule.build_scheduler(optimizer, total, cfg.optim)
    config = dump(cfg)
    log = MetricsLog(Path(cfg.output_dir) / "metrics.jsonl", cfg.run.tracking, config, dist.is_main,
                     cfg.run.project, cfg.run.run_name)
    saved: dict = {}
    if ckpt is not None:
        saved = checkpoints.load_checkpoint_state(ckpt, policy, optimizer, scheduler)
        if scaler is not None and saved.get("loss_scaler"):
            scaler.load_state_dict(saved["loss_scaler"])
        log.truncate_after(saved["step"])
    else:
        log.reset()  # a fresh start: rows of an earlier, dead run would corrupt the curves
    if dist.is_main:
        shards.update_manifest(cfg.output_dir, stage=stage, config=config, complete=False,
                               inputs=inputs)
    return Run(cfg.optim, cfg.run, Path(cfg.output_dir), device, dist, dtype, tokenizer, model,
               policy, optimizer, scheduler, total, saved.get("step", 0), saved, log, scaler)


@contextmanager
def progress(run: Run, description: str) -> Iterator[None]:
    """The run's progress bar (main process only), open for the loop's duration."""
    with progress_bar(run.settings.progress and run.dist.is_main) as bar:
        run.bar = (bar, bar.add_task(description, total=run.total, completed=run.start, info=""))
        yield


def accumulate(run: Run, micro_batches: list, step_fn: Callable[[Any, float], MicroOut],
               dummy: Any) -> dict[str, float]:
    """Forward + backward of this process's micro-batches of one global batch; reduced metrics.

    Every process runs as many passes as the busiest one (a collective inside FSDP would hang
    otherwise): the extra passes run `dummy` with weight 0. Gradient sync stays on, so each
    pass reduce-scatters into the sharded gradient (off, FSDP2 would keep whole fp32 gradients
    on every device until the last pass: ~124 GB at 32B). `step_fn(micro_batch, scale)` scales
    its loss by `scale` (fp16 loss scale, else 1; 0 for a dummy pass), reports unscaled values.
    """
    count = len(micro_batches)
    if run.dist.world_size > 1:
        count = int(dev.all_reduce([count], run.dist, run.device, "max")[0])
    sums: dict[str, float] = {}
    num: dict[str, float] = {}
    den: dict[str, float] = {}
    ext: dict[str, float] = {}
    for j in range(count):
        real = j < len(micro_batches)
        out = step_fn(micro_batches[j] if real else dummy, float(real) * loss_scale(run))
        for k, v in out.sums.items():
            sums[k] = sums.get(k, 0.0) + (v if real else 0.0)
        for k, v in out.means.items():
            if k.endswith(("_max", "_min")):  # kept as maxima (minima negated)
                sign = -1.0 if k.endswith("_min") else 1.0
                ext[k] = max(ext.get(k, -math.inf), sign * v if real and math.isfinite(v) else -math.inf)
                continue
            ok = real and math.isfinite(v)
            num[k] = num.get(k, 0.0) + (v * out.weight if ok else 0.0)
            den[k] = den.get(k, 0.0) + (out.weight if ok else 0.0)
    s, m, x = sorted(sums), sorted(num), sorted(ext)
    flat = dev.all_reduce([sums[k] for k in s] + [num[k] for k in m] + [den[k] for k in m],
                          run.dist, run.device)
    top = dev.all_reduce([ext[k] for k in x], run.dist, run.device, "max")
    result = dict(zip(s, flat[:len(s)], strict=True))
    for i, k in enumerate(m):
        total_weight = flat[len(s) + len(m) + i]
        result[k] = flat[len(s) + i] / total_weight if total_weight > 0 else math.nan
    for k, v in zip(x, top, strict=True):
        result[k] = (-v if k.endswith("_min") else v) if math.isfinite(v) else math.nan
    return result


def optimizer_step(run: Run, loss: float, step: int) -> dict[str, float]:
    """Clip and apply the accumulated gradient; a non-finite loss stops the run, unapplied."""
    if not math.isfinite(loss):
        run.optimizer.zero_grad(set_to_none=True)
        good = checkpoints.latest_checkpoint(run.out)
        raise TrainingError(
            f"non-finite loss ({loss}) at step {step + 1}; no update was applied. "
            f"Last good checkpoint: {good or 'none (nothing saved yet)'}. Lower optim.lr "
            "or check the data, then rerun to resume from it.")
    lr = run.scheduler.get_last_lr()[0]
    if run.scaler is None:
        grad_norm = clip_grad_norm(run.policy, run.optim.grad_clip)
        skip = not math.isfinite(grad_norm)  # the same on every rank: the norm is global
        if not skip:
            run.optimizer.step()
        run.scheduler.step()  # the schedule advances either way: steps stay aligned with data
        run.optimizer.zero_grad(set_to_none=True)
        _count_skip(run, skip, step, f"gradient norm {grad_norm}")
        return {"lr": lr, "grad_norm": grad_norm if not skip else math.nan,
                "skipped_step": float(skip)}
    # fp16: unscale (the overflow check is all-reduced), clip the true gradient, and step unless
    # some rank overflowed; the schedule advances either way, so steps stay aligned with data
    scale = loss_scale(run)
    run.scaler.unscale_(run.optimizer)
    grad_norm = clip_grad_norm(run.policy, run.optim.grad_clip)
    run.scaler.step(run.optimizer)
    run.scaler.update()
    run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    skipped = loss_scale(run) < scale
    _count_skip(run, skipped, step, "fp16 overflow")
    if skipped and loss_scale(run) < MIN_LOSS_SCALE:
        raise TrainingError(
            f"fp16 gradients overflowed at every step down to loss scale {loss_scale(run):g} "
            f"(step {step + 1}); train in bfloat16 or float32 (model.dtype), or lower optim.lr")
    return {"lr": lr, "grad_norm": grad_norm if not skipped else math.nan, "loss_scale": scale,
            "overflow_skipped": float(skipped)}


def _count_skip(run: Run, skipped: bool, step: int, why: str) -> None:
    """Count a step skipped for a non-finite gradient; too many in a row stop the run (a state
    that keeps producing inf / NaN is never trained on, nor saved as a checkpoint)."""
    run.skipped_in_a_row = run.skipped_in_a_row + 1 if skipped else 0
    run.skipped += skipped
    if run.skipped_in_a_row > run.optim.max_skipped_steps:
        good = checkpoints.latest_checkpoint(run.out)
        raise TrainingError(
            f"{run.skipped_in_a_row} steps in a row had a non-finite gradient ({why} at step "
            f"{step + 1}) and were skipped; stopping (optim.max_skipped_steps="
            f"{run.optim.max_skipped_steps}). Last good checkpoint: "
            f"{good or 'none (nothing saved yet)'}. Lower optim.lr or check the data.")


def end_step(run: Run, step: int, metrics: dict[str, float], info: str,
             extra_state: Callable[[], dict] = dict) -> dict[str, float]:
    """Log (every run.log_every steps and the last), advance the bar, checkpoint when due."""
    done, rc = step + 1, run.settings
    metrics = {**metrics, "tokens_per_s": run.tokens / max(run.timer.elapsed(), 1e-9),
               **dev.memory_stats(run.device)}
    if done % rc.log_every == 0 or done == run.total:
        run.metrics.log(done, metrics)
    if run.bar is not None:
        run.bar[0].update(run.bar[1], advance=1, info=info)
    if rc.save_every and done % rc.save_every == 0 and done < run.total:
        checkpoints.save_checkpoint(run.out, done, run.policy, run.model, run.tokenizer,
                                    run.optimizer, run.scheduler, _state(run, extra_state),
                                    rc.keep_last, run.dist, run.aux() if run.aux else None)
    return metrics


def _state(run: Run, extra_state: Callable[[], dict]) -> dict:
    """Trainer state beyond weights and optimiser: the stage's own, plus the fp16 loss scale."""
    state = extra_state()
    if run.scaler is not None:
        state["loss_scaler"] = run.scaler.state_dict()
    return state


def finish(run: Run, counts: dict, extra_state: Callable[[], dict] = dict) -> Path:
    """Save the last checkpoint, publish it as `output_dir/final`, mark the folder complete."""
    ckpt = checkpoints.save_checkpoint(run.out, run.total, run.policy, run.model, run.tokenizer,
                                       run.optimizer, run.scheduler, _state(run, extra_state),
                                       run.settings.keep_last, run.dist,
                                       run.aux() if run.aux else None)
    run.metrics.summary(counts)
    run.metrics.close()
    if run.dist.is_main:
        final = checkpoints.publish_final(run.out, ckpt)
        shards.update_manifest(run.out, complete=True, counts={
            "steps": run.total, "resumed_from": run.start, "skipped_steps": run.skipped,
            "processes": run.dist.world_size, "vocab_layout": run.policy.vocab_layout,
            **counts,
            "seconds": round(run.timer.elapsed(), 2), "final_model": str(final)})
    dev.barrier(run.dist)
    return run.out / "final"
