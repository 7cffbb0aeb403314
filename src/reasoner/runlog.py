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


def check_sinks(sinks: list[str]) -> None:
    """Every tracking sink asked for is installed: checked when a stage starts, before it
    writes a cache or loads a model, not when its first metric is logged."""
    import importlib.util

    missing = [s for s, module in (("tensorboard", "tensorboard"), ("wandb", "wandb"))
               if s in sinks and importlib.util.find_spec(module) is None]
    if missing:
        raise DependencyError(f"tracking: {' and '.join(missing)} "
                              f"{'is' if len(missing) == 1 else 'are'} not installed: pip "
                              "install 'reasoner[tracking]', or drop it from run.tracking")


class MetricsLog:
    """`metrics.jsonl` (one object per logged step, with its wall-clock time) plus optional
    tensorboard (`<folder>/tensorboard/`) and wandb (project and run name from the config)."""

    def __init__(self, path: Path, sinks: list[str], config: dict, enabled: bool,
                 project: str = "reasoner", name: str | None = None):
        self.enabled = enabled
        self.path = Path(path)
        self._tb = self._wandb = None
        if not enabled:
            return
        check_sinks(sinks)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if "tensorboard" in sinks:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.path.parent / "tensorboard"))
        if "wandb" in sinks:
            import wandb

            self._wandb = wandb.init(project=project, name=name or self.path.parent.name,
                                     config=config, dir=str(self.path.parent))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if not self.enabled:
            return
        with open(self.path, "a") as fh:
            fh.write(json.dumps({"step": step, "time": round(time.time(), 3), **metrics}) + "\n")
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

    def summary(self, values: dict) -> None:
        """A run's end numbers (counts, final loss, eval scores): wandb's run summary, and
        scalars under `summary/` in tensorboard; the numbers only."""
        numbers = {k: v for k, v in values.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if self._tb:
            for k, v in numbers.items():
                self._tb.add_scalar(f"summary/{k}", v, 0)
        if self._wandb:
            self._wandb.summary.update(numbers)

    def close(self) -> None:
        if self._tb:
            self._tb.close()
        if self._wandb:
            self._wandb.finish()


PLAIN_EVERY_S = 15.0  # a plain progress line at least this often (batch logs: SLURM, nohup, CI)


def progress_bar(enabled: bool, every_s: float = PLAIN_EVERY_S):
    """Progress of a long stage on stderr: a rich bar with ETA on a terminal, plain lines with
    rate and ETA every `every_s` seconds (and one at the end) in a log, where a bar would print
    once, when it is done. Nothing when not `enabled` (off the main process, or asked)."""
    import sys

    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    if enabled and not sys.stderr.isatty():
        return PlainProgress(every_s)
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                    disable=not enabled, transient=False, console=Console(stderr=True))


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class PlainProgress:
    """The progress bar's interface (`add_task`, `update`, a context manager) as plain lines:
    `[progress] sft 120/1130 (10.6%) 2.10/s elapsed 0:57 ETA 8:01 loss 0.41`."""

    def __init__(self, every_s: float = PLAIN_EVERY_S, stream=None, clock=time.monotonic):
        self.every_s, self.clock = every_s, clock
        self.stream = stream
        self.tasks: dict[int, dict] = {}

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc) -> None:
        for task in self.tasks.values():
            if task["printed_at"] != task["completed"]:
                self._print(task)

    def add_task(self, description: str, total: float | None = None, completed: float = 0,
                 info: str = "", **_) -> int:
        now = self.clock()
        self.tasks[len(self.tasks)] = {"description": description, "total": total,
                                       "completed": completed, "start_done": completed,
                                       "info": info, "started": now, "last": now,
                                       "printed_at": None, "first": None}
        return len(self.tasks) - 1

    def update(self, task: int, advance: float = 0, info: str | None = None, **_) -> None:
        t = self.tasks[task]
        t["completed"] += advance
        if advance and t["first"] is None:  # the first unit done: the pipeline is full from here
            t["first"] = (self.clock(), t["completed"])
        if info is not None:
            t["info"] = info
        if self.clock() - t["last"] >= self.every_s:
            self._print(t)

    def _print(self, t: dict) -> None:
        import sys

        now = self.clock()
        t["last"], t["printed_at"] = now, t["completed"]
        elapsed = now - t["started"]
        done = t["completed"] - t["start_done"]
        rate = done / elapsed if elapsed > 0 else 0.0
        if t["first"] is not None and now > t["first"][0]:  # the rate since the first unit
            rate = (t["completed"] - t["first"][1]) / (now - t["first"][0])
        line = f"[progress] {t['description']} {t['completed']:g}"
        if t["total"]:
            line += f"/{t['total']:g} ({100 * t['completed'] / t['total']:.1f}%)"
        line += f" {rate:.2f}/s elapsed {_clock(elapsed)}"
        left = settled_eta(t, now)
        if left is not None:
            line += f" ETA {_clock(left)}"
        elif t["total"] and t["completed"] < t["total"]:
            line += " ETA after more are done"
        if t["info"]:
            line += f" {t['info']}"
        print(line, file=self.stream or sys.stderr, flush=True)


SETTLED = 0.05  # the share of a task done since its first unit before an ETA is given


def settled_eta(t: dict, now: float) -> float | None:
    """Seconds left at the rate since the task's first unit was done, once `SETTLED` of it has
    been done since then; None before. Not from the start: a batch of generations or a stage's
    warm-up finishes nothing for a while and then many at once, and the rate since the start
    said 36 minutes to a run done in 35 s (issue 51)."""
    if not t["total"] or t["first"] is None:
        return None
    at, count = t["first"]
    done = t["completed"] - count
    if done < max(1.0, SETTLED * t["total"]) or now <= at:
        return None
    return max(t["total"] - t["completed"], 0) / (done / (now - at))


class Timer:
    def __init__(self) -> None:
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start
