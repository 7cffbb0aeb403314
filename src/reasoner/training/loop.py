"""The training loop `sft` and `train-offline` share, as plain functions over one `TrainState`.

`start` builds the state of a run (optimiser, schedule, resume from the newest checkpoint,
metrics log) around a model loaded by `policy.load_policy`; `accumulate` runs one global
batch's micro-batches (the same count on every process; FSDP2 reduce-scatters each one's
gradient, so gradients stay sharded between them) and reduces their metrics; `optimizer_step`
guards against a non-finite loss, clips and steps; `end_step` logs (peak memory included),
advances the progress bar and checkpoints; `finish` saves the final model. Each stage's `run()`
is a flat loop over these, like a torchtune recipe. Losses scale each micro-batch to its share
of the global batch (see train_offline/losses.py), so a step's gradient does not depend on how
the batch was cut.
"""

from __future__ import annotations

import json
import math
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from reasoner import device as dev
from reasoner import shards
from reasoner.config import OptimConfig, RunConfig, TrainerConfig, dump
from reasoner.device import DistInfo, Env
from reasoner.errors import Stopped, TrainingError
from reasoner.runlog import MetricsLog, Timer, progress_bar
from reasoner.training import checkpoints, schedule
from reasoner.training.final import publish_final
from reasoner.training.policy import Loaded
from reasoner.training.precision import MIN_LOSS_SCALE, loss_scale, make_scaler
from reasoner.training.precision import clip_grad_norm_on_device as clip

Value = float | torch.Tensor  # a number, or a 0-dim tensor on the device (detached)


@dataclass
class MicroOut:
    """What one micro-batch's forward + backward reports, by how it is reduced over the step's
    micro-batches and processes. A value may stay on the device as a 0-dim tensor: `accumulate`
    reads all of a step's at once, after its last micro-batch."""

    sums: dict[str, Value]  # added up (loss shares, counts)
    means: dict[str, Value] = field(default_factory=dict)  # averaged by `weight`; NaN skipped
    weight: float = 0.0  # this micro-batch's weight in `means` (its share of the batch)
    maxima: dict[str, Value] = field(default_factory=dict)  # the largest value; NaN skipped
    minima: dict[str, Value] = field(default_factory=dict)  # the smallest value; NaN skipped


@dataclass
class TrainState:
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
    total_steps: int  # optimiser steps in the whole run
    first_step: int  # first step of this invocation (> 0 when resumed)
    saved: dict  # trainer state of the checkpoint resumed from ({} when fresh)
    metrics: MetricsLog
    scaler: Any = None  # dynamic loss scaler (fp16 only; see precision.make_scaler)
    timer: Timer = field(default_factory=lambda: Timer())
    tokens: float = 0.0  # real tokens trained on by this invocation
    skipped_in_a_row: int = 0  # steps skipped for a non-finite gradient norm, consecutively
    skipped: int = 0  # ... and in all, this invocation
    bar: Any = None
    aux: Callable[[], dict] | None = None  # auxiliary models' shards to checkpoint (aux_state)
    identity: str = ""  # what the run is made from (outputs.Identity.digest): every checkpoint
    last_save_s: float = 0.0  # how long the last checkpoint took (a stop signal's grace)


def start(cfg: TrainerConfig, env: Env, tokenizer: Any, loaded: Loaded, total_steps: int,
          ckpt: Path | None, identity: str) -> TrainState:
    """Build optimiser and schedule for the model of `policy.load_policy`, restore `ckpt` when
    resuming; `identity`: the run's (outputs.Identity.digest), saved in every checkpoint."""
    device, dist, dtype = env.device, env.dist, env.dtype
    model, policy = loaded.model, loaded.policy
    if cfg.run.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    policy.train()
    scaler = make_scaler(cfg.optim, device, dtype, dist)
    optimizer = schedule.build_optimizer(policy, cfg.optim, device.type == "cuda" and not scaler)
    scheduler = schedule.build_scheduler(optimizer, total_steps, cfg.optim)
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
    return TrainState(cfg.optim, cfg.run, Path(cfg.output_dir), device, dist, dtype, tokenizer,
                      model, policy, optimizer, scheduler, total_steps, saved.get("step", 0),
                      saved, log, scaler, identity=identity)


@contextmanager
def progress(state: TrainState, description: str) -> Iterator[None]:
    """The run's progress bar (main process only), open for the loop's duration, and the stop
    signals listened for meanwhile (`listen_for_stop`)."""
    with progress_bar(state.settings.progress and state.dist.is_main) as bar, listen_for_stop():
        state.bar = (bar, bar.add_task(description, total=state.total_steps,
                                       completed=state.first_step, info=""))
        yield


def accumulate(state: TrainState, mine: int, step_fn: Callable[[int, float], MicroOut],
               busiest: int | None = None) -> dict[str, float]:
    """Forward + backward of this process's `mine` micro-batches of one global batch; reduced
    metrics. `step_fn(j, scale)` runs pass j: this process's micro-batch j, or past its own a
    dummy pass (the collectives of one, weighing nothing); it scales its loss by `scale` (fp16
    loss scale, else 1; 0 for a dummy pass) and reports unscaled values.

    Every process runs as many passes as the busiest one (a collective inside FSDP would hang
    otherwise): `busiest`, when the caller knows every process's micro-batches on the host;
    else agreed by an all-reduce (a host sync). Gradient sync stays on, so each
    pass reduce-scatters into the sharded gradient (off, FSDP2 would keep whole fp32 gradients
    on every device until the last pass: ~124 GB at 32B).

    Under sequence parallelism every member of a group computes its micro-batch's whole loss
    (models.sequence_parallel): each backpropagates 1/size of it, and the group's sums count
    once.

    The values the passes leave on the device are read in one transfer after the last one
    (`read`): the step's one host sync here, where each value used to be one (issue 52).
    """
    count = mine if busiest is None else busiest
    share = 1.0 / state.dist.sp_size
    if state.dist.world_size > 1 and busiest is None:
        count = int(dev.all_reduce([count], state.dist, state.device, "max")[0])
    scale = loss_scale(state.scaler)  # fp16: the scaler's, read once (it moves only in a step)
    outs = [step_fn(j, float(j < mine) * scale * share) for j in range(count)]
    return _reduce(state, read(outs, state.device), mine, share)


def read(outs: list[MicroOut], device: torch.device) -> list[MicroOut]:
    """`outs`, each value left on the device replaced (in place) by the number it holds: all
    read in one transfer, each exactly as `float()` reads it alone (widened first to fp64, or
    to fp32 on an NPU: the widest dtype a value of a step there has)."""
    places = [(part, k) for out in outs for part in (out.sums, out.means, out.maxima, out.minima)
              for k, v in part.items() if isinstance(v, torch.Tensor)]
    if not places:
        return outs
    wide = dev.reduce_dtype(device)
    values = torch.stack([part[k].detach().reshape(()).to(device, wide) for part, k in places])
    for (part, k), v in zip(places, values.tolist(), strict=True):
        part[k] = v
    return outs


def _reduce(state: TrainState, outs: list[MicroOut], real_count: int, share: float
            ) -> dict[str, float]:
    """The step's metrics from its passes' (the first `real_count` real, the rest dummies):
    sums, weighted means and extremes, over the passes and then the processes."""
    sums: dict[str, float] = {}
    num: dict[str, float] = {}
    den: dict[str, float] = {}
    top: dict[str, float] = {}  # maxima, and minima negated: both reduced with max
    sign_of: dict[str, float] = {}
    for j, out in enumerate(outs):
        real = j < real_count
        for k, v in out.sums.items():
            sums[k] = sums.get(k, 0.0) + (v * share if real else 0.0)
        for k, v in out.means.items():
            ok = real and math.isfinite(v)
            num[k] = num.get(k, 0.0) + (v * out.weight if ok else 0.0)
            den[k] = den.get(k, 0.0) + (out.weight if ok else 0.0)
        for sign, values in ((1.0, out.maxima), (-1.0, out.minima)):
            for k, v in values.items():
                seen = sign * v if real and math.isfinite(v) else -math.inf
                top[k], sign_of[k] = max(top.get(k, -math.inf), seen), sign
    if state.dist.world_size > 1:  # a process may have run dummy passes only: same names all round
        s, m, x, sign_of = _agreed_names(state, sums, num, top, sign_of)
        for k in s:
            sums.setdefault(k, 0.0)
        for k in m:
            num.setdefault(k, 0.0)
            den.setdefault(k, 0.0)
        for k in x:
            top.setdefault(k, -math.inf)
    s, m, x = sorted(sums), sorted(num), sorted(top)
    flat = dev.all_reduce([sums[k] for k in s] + [num[k] for k in m] + [den[k] for k in m],
                          state.dist, state.device)
    tops = dev.all_reduce([top[k] for k in x], state.dist, state.device, "max")
    result = dict(zip(s, flat[:len(s)], strict=True))
    for i, k in enumerate(m):
        total_weight = flat[len(s) + len(m) + i]
        result[k] = flat[len(s) + i] / total_weight if total_weight > 0 else math.nan
    for k, v in zip(x, tops, strict=True):
        result[k] = sign_of[k] * v if math.isfinite(v) else math.nan
    return result


def _agreed_names(state: TrainState, sums: dict, means: dict, tops: dict, sign_of: dict
                  ) -> tuple[list[str], list[str], list[str], dict[str, float]]:
    """The metric names every process reduces (the union of what each one saw), in one order:
    a process whose passes were all dummies saw none, and the reductions must line up."""
    import torch.distributed as tdist

    mine = (sorted(sums), sorted(means), sorted(tops), sign_of)
    everyone: list = [None] * state.dist.world_size
    tdist.all_gather_object(everyone, mine)
    union = [sorted({k for seen in everyone for k in seen[i]}) for i in range(3)]
    signs = {k: v for seen in everyone for k, v in seen[3].items()}
    return union[0], union[1], union[2], signs


def optimizer_step(state: TrainState, loss: float, step: int) -> dict[str, float]:
    """Clip and apply the accumulated gradient; a non-finite loss stops the run, unapplied."""
    if not math.isfinite(loss):
        state.optimizer.zero_grad(set_to_none=True)
        good = checkpoints.latest_checkpoint(state.out)
        raise TrainingError(
            f"non-finite loss ({loss}) at step {step + 1}; no update was applied. "
            f"Last good checkpoint: {good or 'none (nothing saved yet)'}. Lower optim.lr "
            "or check the data, then rerun to resume from it.")
    lr = state.scheduler.get_last_lr()[0]
    if state.scaler is None:
        grad_norm = float(unscale_and_clip(state))
        skip = not math.isfinite(grad_norm)  # the same on every rank: the norm is global
        if not skip:
            state.optimizer.step()
        state.scheduler.step()  # the schedule advances either way: steps stay aligned with data
        state.optimizer.zero_grad(set_to_none=True)
        _count_skip(state, skip, step, f"gradient norm {grad_norm}")
        return {"lr": lr, "grad_norm": grad_norm if not skip else math.nan,
                "skipped_step": float(skip)}
    # fp16: unscale (the overflow check is all-reduced), clip the true gradient, and step unless
    # some rank overflowed; the schedule advances either way, so steps stay aligned with data
    scale = loss_scale(state.scaler)
    grad_norm = float(unscale_and_clip(state))
    state.scaler.step(state.optimizer)
    state.scaler.update()
    state.scheduler.step()
    state.optimizer.zero_grad(set_to_none=True)
    skipped = loss_scale(state.scaler) < scale
    _count_skip(state, skipped, step, "fp16 overflow")
    if skipped and loss_scale(state.scaler) < MIN_LOSS_SCALE:
        raise TrainingError(
            f"fp16 gradients overflowed at every step down to loss scale {loss_scale(state.scaler):g} "
            f"(step {step + 1}); train in bfloat16 or float32 (model.dtype), or lower optim.lr")
    return {"lr": lr, "grad_norm": grad_norm if not skipped else math.nan, "loss_scale": scale,
            "overflow_skipped": float(skipped)}


def unscale_and_clip(state: TrainState) -> torch.Tensor:
    """What a step does to the gradients before deciding whether to apply them: unscaled (fp16;
    the overflow flag all-reduced), clipped to optim.grad_clip; the global norm stays on the
    device (0-dim). The rehearsal (pipeline/rehearsal.py) runs it as the trainer does."""
    if state.scaler is not None:
        state.scaler.unscale_(state.optimizer)
    return clip(state.policy, state.optim.grad_clip)


def _count_skip(state: TrainState, skipped: bool, step: int, why: str) -> None:
    """Count a step skipped for a non-finite gradient; too many in a row stop the run (a state
    that keeps producing inf / NaN is never trained on, nor saved as a checkpoint)."""
    state.skipped_in_a_row = state.skipped_in_a_row + 1 if skipped else 0
    state.skipped += skipped
    if state.skipped_in_a_row > state.optim.max_skipped_steps:
        good = checkpoints.latest_checkpoint(state.out)
        raise TrainingError(
            f"{state.skipped_in_a_row} steps in a row had a non-finite gradient ({why} at step "
            f"{step + 1}) and were skipped; stopping (optim.max_skipped_steps="
            f"{state.optim.max_skipped_steps}). Last good checkpoint: "
            f"{good or 'none (nothing saved yet)'}. Lower optim.lr or check the data.")


def end_step(state: TrainState, step: int, metrics: dict[str, float], info: str,
             extra_state: Callable[[], dict] = dict) -> dict[str, float]:
    """Log (every run.log_every steps and the last), advance the bar, checkpoint when due; on a
    stop signal end the run here (`stop_here`)."""
    done, rc = step + 1, state.settings
    metrics = {**metrics, "tokens_per_s": state.tokens / max(state.timer.elapsed(), 1e-9),
               **dev.memory_stats(state.device)}
    if done % rc.log_every == 0 or done == state.total_steps:
        state.metrics.log(done, metrics)
    if state.bar is not None:
        state.bar[0].update(state.bar[1], advance=1, info=info)
    saved = False
    if rc.save_every and done % rc.save_every == 0 and done < state.total_steps:
        _save(state, done, extra_state)
        saved = True
    if done < state.total_steps:
        stop_here(state, done, saved, extra_state)
    return metrics


# Signals a scheduler or a terminal sends to end a job; the run stops at the end of a step.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
_stop: dict[str, int] = {}


@contextmanager
def listen_for_stop() -> Iterator[None]:
    """For the block, SIGTERM / SIGHUP end the run at the end of the current step instead of
    killing it (main thread only: elsewhere a handler cannot be set); the handlers before are
    put back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _stop.clear()
    before = {sig: signal.signal(sig, lambda number, frame: _stop.setdefault("signal", number))
              for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def stop_here(state: TrainState, done: int, saved: bool,
              extra_state: Callable[[], dict]) -> None:
    """End the run after step `done` when a stop signal came (on any process: every process
    stops at the same step). A checkpoint is saved first when run.save_every would save within
    the next 3 steps and the last save took less than run.term_grace_s."""
    # one decision for every process: the signal any of them got, and the slowest last save
    # (each timed its own; deciding apart, one would save, a collective, and the other not)
    number, last_save_s = _stop.get("signal", 0), state.last_save_s
    if state.dist.world_size > 1:
        number, last_save_s = dev.all_reduce([number, last_save_s], state.dist, state.device,
                                             "max")
        number = int(number)
    if not number:
        return
    rc = state.settings
    due = rc.save_every and rc.save_every - done % rc.save_every <= 3
    if due and not saved and last_save_s <= rc.term_grace_s:
        _save(state, done, extra_state)
    state.metrics.close()
    last = checkpoints.latest_checkpoint(state.out, state.identity)
    name = signal.Signals(number).name
    raise Stopped(f"stopped by {name} after step {done} of {state.total_steps}; last "
                  f"checkpoint: {last or 'none (the rerun starts from the beginning)'}", number)


def _save(state: TrainState, step: int, extra_state: Callable[[], dict]) -> Path:
    """Checkpoint `step`: weights, optimiser, schedule, the stage's own state and the fp16 loss
    scale, and the auxiliary models' shards."""
    saved = {**extra_state(), "identity": state.identity}
    if state.scaler is not None:
        saved["loss_scaler"] = state.scaler.state_dict()
    began = time.perf_counter()
    path = checkpoints.save_checkpoint(state.out, step, state.policy, state.model,
                                       state.tokenizer, state.optimizer, state.scheduler, saved,
                                       state.settings.keep_last, state.dist,
                                       state.aux() if state.aux else None)
    state.last_save_s = time.perf_counter() - began
    return path


def final_dtype(state: TrainState) -> torch.dtype:
    """The dtype `final/`'s weights are written in: run.save_dtype, or the training dtype."""
    wanted = state.settings.save_dtype
    return state.dtype if wanted == "auto" else getattr(torch, wanted)


def finish(state: TrainState, counts: dict, extra_state: Callable[[], dict] = dict,
           trained_with: dict | None = None) -> Path:
    """Save the last checkpoint, publish it as `output_dir/final`, mark the folder complete.
    `trained_with` (the prompt template) is recorded in `final/reasoner.json`: eval reads it."""
    ckpt = _save(state, state.total_steps, extra_state)
    state.metrics.summary(counts)
    state.metrics.close()
    dtype = final_dtype(state)
    final = publish_final(state.out, ckpt, dtype, state.dist)
    if state.dist.is_main:
        if trained_with:
            shards.atomic_write_text(final / "reasoner.json", json.dumps(
                {"trained_by": "reasoner", **trained_with}, indent=2, sort_keys=True) + "\n")
        shards.update_manifest(state.out, complete=True, counts={
            "steps": state.total_steps, "resumed_from": state.first_step,
            "skipped_steps": state.skipped, "processes": state.dist.world_size,
            "sequence_parallel": state.dist.sp_size,
            "vocab_layout": state.policy.vocab_layout, **counts,
            "seconds": round(state.timer.elapsed(), 2), "final_model": str(final),
            "final_dtype": str(dtype).removeprefix("torch.")})
    dev.barrier(state.dist)
    return state.out / "final"
