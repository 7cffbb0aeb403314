"""What `sft` and `train-offline` share: the loop's plain functions over one `Run` (loop.py), the
optimiser, learning-rate schedule and row order (schedule.py), and checkpoints (checkpoints.py).

The loop's functions are re-exported: a stage writes `training.start(...)`,
`training.accumulate(...)`, as a torchtune recipe calls its utilities.
"""

from reasoner.training.loop import (
    MIN_LOSS_SCALE,
    Env,
    MicroOut,
    Run,
    TrainerConfig,
    accumulate,
    clip_grad_norm,
    end_step,
    finish,
    load_policy,
    load_weights,
    loss_scale,
    make_scaler,
    optimizer_step,
    progress,
    resume_point,
    setup,
    shard_model,
    start,
    vocab_split,
)

__all__ = [
    "MIN_LOSS_SCALE", "Env", "MicroOut", "Run", "TrainerConfig", "accumulate", "clip_grad_norm",
    "end_step", "finish", "load_policy", "load_weights", "loss_scale", "make_scaler",
    "optimizer_step", "progress", "resume_point", "setup", "shard_model", "start",
    "vocab_split",
]
