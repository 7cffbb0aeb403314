"""What a training run reports while it runs: the metrics log and the progress bar.

`MetricsLog` writes `metrics.jsonl` (one object per logged step; restarted on a fresh run,
truncated to the checkpoint on resume) and, when asked, tensorboard or wandb. `progress_bar` is
the rich bar every long stage shows (training, infer, verify). Neither needs torch, so infer and
verify can show progress without importing the training core.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from reasoner.errors import DependencyError


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
                raise DependencyError("tracking: tensorboard needs pip install 'reasoner[tracking]'"
                                  ) from exc
            self._tb = SummaryWriter(str(self.path.parent / "tensorboard"))
        if "wandb" in sinks:
            try:
                import wandb
            except ImportError as exc:
                raise DependencyError("tracking: wandb needs pip install 'reasoner[tracking]'") from exc
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

    def reset(self) -> None:
        """Start the file afresh (a run from step 0)."""
        if self.enabled and self.path.exists():
            self.path.unlink()

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
