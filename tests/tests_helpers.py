"""Helpers importable from tests (conftest holds fixtures)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest

# The environment of the real `reasoner` processes tests start: one torch thread each, as the
# pytest-xdist workers themselves have (conftest), also when a module runs without xdist.
SUBPROCESS_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}

SHARED_EVAL = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "eval"


def shared_eval_rows(name: str) -> list[dict]:
    """Rows of a benchmark file of SHARED_EVAL (a `shared/data/eval/` folder beside the
    checkout), or skip the test saying why."""
    path = SHARED_EVAL / name
    if not path.exists():
        pytest.skip(f"{path} is absent: the benchmark files live in shared/data/eval/ beside the checkout")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def torchrun_two_processes(*target: str, processes: int = 2) -> list[str]:
    """The command line of torchrun with two processes (gloo on a CPU) running `target` (a
    script and its arguments, or `-m module ...`), on a free port: under pytest-xdist two such
    tests can run at once, and a fixed port would be taken by the first."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={processes}",
            f"--master_port={port}", *map(str, target)]


def why(done: subprocess.CompletedProcess) -> str:
    """What a failed torchrun printed that says why: the first rank's own error (a Python
    traceback, or faulthandler's stack of a crash: SUBPROCESS_ENV turns it on) and the end of
    stderr. torchrun's own summary alone fills the last 3,000 characters and names no line."""
    err = done.stderr or ""
    starts = [i for i in (err.find("Fatal Python error"), err.find("Traceback")) if i >= 0]
    first = err[min(starts):min(starts) + 4000] if starts else ""
    return f"{first}\n[...]\n{err[-2000:]}\n[stdout]\n{(done.stdout or '')[-1500:]}"


def reasoner_on_two_processes(*args: str) -> list[str]:
    """The command line of `reasoner *args` on two torchrun processes."""
    return torchrun_two_processes("-m", "reasoner", *args)


def reasoner(*args, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`reasoner *args` run inside this test's process (typer's CliRunner), as the command line
    would run it: same parsing, same stage code, exit code and stderr captured. A new interpreter
    would first import torch and transformers, which costs up to a minute on a slow 2-core CI
    machine; the tests that need a real process (SIGKILL, torchrun, a traceback on stderr, the
    `python -m reasoner` entry point) start one themselves. A bug raises here, with its traceback."""
    from typer.testing import CliRunner

    from reasoner.cli import app

    with contextlib.chdir(cwd or Path.cwd()):
        result = CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)
    return subprocess.CompletedProcess(list(args), result.exit_code, result.stdout, result.stderr)


def reasoner_jobs_on_two_processes(jobs: list[list], folder: Path, processes: int = 2
                                   ) -> list[str]:
    """The command line that runs every `reasoner` job of `jobs` in turn on one torchrun of two
    processes (tests/two_process_jobs.py); the job list is written into `folder`. A job
    `["--cut", FOLDER, COPY, STEP]` copies a finished training folder as a run killed after
    checkpoint STEP would have left it (rank 0; the others wait)."""
    spec = folder / f"jobs-{len(list(folder.glob('jobs-*.json')))}.json"
    spec.write_text(json.dumps([[str(a) for a in job] for job in jobs]))
    return torchrun_two_processes(Path(__file__).with_name("two_process_jobs.py"), spec,
                                  processes=processes)


CRASHES = ("Signal 11 (SIGSEGV)", "Signal 7 (SIGBUS)", "Signal 6 (SIGABRT)")


def run_jobs_on_two_processes(jobs_in: Callable[[Path], list[list]], new_folder: Callable[[], Path],
                              processes: int = 2, timeout: int = 1200) -> Path:
    """Run the jobs `jobs_in(folder)` gives on one torchrun (reasoner_jobs_on_two_processes) in
    a new folder; returns that folder, or fails with why(). A run whose process died of a
    signal (a crash in native code: CI once saw rank 0 of the LoRA module's run die of SIGSEGV,
    which 11 reruns here did not reproduce, quiet, loaded and under three ISA caps) is run once
    more in a fresh folder, with the crash's own stack (faulthandler) raised as a warning that
    the test report shows; a second crash fails."""
    for attempt in (1, 2):
        folder = new_folder()
        done = subprocess.run(reasoner_jobs_on_two_processes(jobs_in(folder), folder, processes),
                              capture_output=True, text=True, timeout=timeout, env=SUBPROCESS_ENV)
        if done.returncode == 0:
            return folder
        crashed = any(c in done.stderr for c in CRASHES)
        if attempt == 2 or not crashed:
            raise AssertionError(why(done))
        warnings.warn(f"a torchrun process crashed; running again in a new folder:\n{why(done)}",
                      stacklevel=2)
    raise AssertionError("unreachable")


def cut_after(folder: Path, copy: Path, step: int) -> None:
    """`copy`: `folder` (a finished training run) as if killed right after checkpoint-`step`:
    later checkpoints and final/ gone, the manifest not complete."""
    import shutil

    shutil.copytree(folder, copy)
    for ckpt in copy.glob("checkpoint-*"):
        if int(ckpt.name.split("-")[1]) > step:
            shutil.rmtree(ckpt)
    shutil.rmtree(copy / "final")
    manifest = json.loads((copy / "manifest.json").read_text())
    (copy / "manifest.json").write_text(json.dumps({**manifest, "complete": False}))


def leave_process_group() -> None:
    """End a torchrun check script: the process group torn down, then the process gone at once.

    The check has written its result by now. Interpreter shutdown after gloo work can still
    abort now and then (SIGABRT, "terminate called without an active exception": gloo's
    threads release tensors while Python is finalizing; seen once in CI on 2 busy cores), and
    the check is about what it wrote, not about shutdown, so it exits before finalization."""
    import torch.distributed as dist

    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def quiet(cfg):
    """A stage config with its progress bars off (the stages that generate or verify)."""
    return cfg.model_copy(update={"progress": False})


def step_logits(model, step, rows: int = 4, steps: int = 3):
    """The logits (steps, rows, V) of `step` (an infer.decode_step.DecodeStep of `model`) over
    `steps` greedy decode steps from `rows` prompts of 6 tokens, prefilled by `model` itself."""
    import torch

    from reasoner.infer.decode_step import greedy_logits

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (rows, 6), generator=g)
    return greedy_logits(model, step, ids, steps)


def strict_autograd() -> None:
    """From here on, backpropagating through an op with no autograd kernel raises instead of
    passing a zero gradient on (autograd's fallback warns; its warning made an error: torch 2.13
    has no "error" mode yet, `NYI: mode='error'`)."""
    import warnings

    import torch

    torch._C._set_autograd_fallback_mode("warn")
    warnings.filterwarnings("error", message=".*autograd kernel was not registered")
