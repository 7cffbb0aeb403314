"""What `sft` and `train-offline` share: where a run computes and what it loads (policy.py), the
loop's plain functions over one `TrainState` (loop.py), fp16 loss scaling and gradient norms
(precision.py), the optimiser, learning-rate schedule and row order (schedule.py), and
checkpoints (checkpoints.py).

The functions a stage calls are re-exported: a stage writes `training.start(...)`,
`training.accumulate(...)`, as a torchtune recipe calls its utilities.
"""

from reasoner.training.loop import (
    MicroOut,
    TrainState,
    accumulate,
    end_step,
    finish,
    optimizer_step,
    progress,
    start,
    unscale_and_clip,
)
from reasoner.training.policy import (
    Loaded,
    claim,
    exchanges_counts,
    load_policy,
    load_weights,
    load_wrapped,
    resume_point,
    setup,
    warn_dropped,
)

__all__ = [
    "Loaded", "MicroOut", "claim", "TrainState", "accumulate", "end_step", "exchanges_counts",
    "finish", "load_policy",
    "load_weights", "load_wrapped", "optimizer_step", "progress", "resume_point", "setup",
    "start", "unscale_and_clip", "warn_dropped",
]
