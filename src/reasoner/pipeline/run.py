"""`reasoner run RECIPE.yaml`: the stages of one recipe in order, skipping finished ones.

A recipe names its stages (command + config file + values set on top); each stage writes into
RUN_DIR/<name>/ (resolve.py: references, rounds, seeds, digests). `rounds: N` repeats the
`repeat: true` block (infer -> verify -> train-offline -> eval) from the newest checkpoint, so
each round's optimiser and reference start fresh from that checkpoint.

What has run is recorded in RUN_DIR/pipeline.json: for each stage a chain digest of its resolved
config and those of every stage before it. A stage whose digest is unchanged and that finished is
skipped; a changed stage reruns, and so does everything after it (their inputs changed); a stage
that was interrupted with an unchanged digest resumes. A stage about to run whose output for this
config is already there, in its folder or in a kept copy of it, is kept or brought back instead
(previous.py: decided by identity). Each resolved config is also written to
RUN_DIR/configs/<name>.yaml, so any stage can be rerun by hand with the printed command.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import yaml

from reasoner import shards
from reasoner.config import ConfigError, dump
from reasoner.errors import ReasonerError, ShardError
from reasoner.pipeline import inputs, previous
from reasoner.pipeline.recipe import RecipeConfig
from reasoner.pipeline.registry import STAGES
from reasoner.pipeline.resolve import StageRun, resolve

__all__ = ["StageFailed", "StageRun", "command_line", "decide", "resolve", "run", "time_left",
           "uses_vllm"]

STATE = "pipeline.json"


class StageFailed(ReasonerError):
    """A stage run as a subprocess (`launcher:`) failed; it printed its own error above."""


def _read_state(run_dir: Path) -> dict:
    path = run_dir / STATE
    if not path.exists():
        return {"stages": {}}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ShardError(f"{path} is not valid JSON ({exc}); delete it to rerun every stage") from exc


def decide(stages: list[StageRun], state: dict, start: str | None, until: str | None) -> list[StageRun]:
    """Mark each stage skip / run / rerun / resume; return the stages this invocation covers."""
    names = [s.name for s in stages]
    for flag, value in (("--from", start), ("--until", until)):
        if value is not None and value not in names:
            raise ConfigError(f"{flag} {value}: no such stage; stages: {', '.join(names)}")
    first = names.index(start) if start else 0
    last = names.index(until) if until else len(stages) - 1
    if first > last:
        raise ConfigError(f"--from {start} comes after --until {until}")
    upstream_ran = False
    for i, s in enumerate(stages[: last + 1]):
        record = state["stages"].get(s.name, {})
        same = record.get("chain") == s.chain
        if i < first:
            s.status, s.reason = "skip", "before --from"
            if not (same and record.get("status") == "done"):
                s.reason = "before --from (not finished with this config!)"
        elif i == first and start is not None:
            s.status, s.reason = "rerun", "--from"
        elif same and record.get("status") == "running":
            s.status, s.reason = "resume", "interrupted last time"
        elif same and record.get("status") == "done" and s.out.exists() and not upstream_ran:
            s.status, s.reason = "skip", "finished with this config"
        elif record:
            s.status = "rerun"
            own_changed = record.get("digest") != s.digest
            s.reason = ("config changed" if own_changed else
                        "an earlier stage reran" if upstream_ran or not same else "output missing")
        else:
            s.status, s.reason = "run", "new"
        if s.status == "skip":
            s.seconds = record.get("seconds", 0.0)
            s.headline, s.metrics = record.get("headline", ""), record.get("metrics", {})
        else:
            upstream_ran = True
    return stages[: last + 1]


# --------------------------------------------------------------------------------------------
# Running


def command_line(stage: StageRun, config_path: Path | None = None,
                 launch: list[str] | None = None) -> list[str]:
    """The shell command that runs this stage by hand (what --dry-run prints); `launch`: a
    prefix that replaces the stage's own `launcher:` (the Slurm script's, run.py --launch)."""
    launcher = launch if launch is not None else (
        shlex.split(stage.spec.launcher) if stage.spec.launcher else [])
    if stage.command == "compare":
        return [*launcher, "reasoner", "eval", "compare", *stage.config["reports"],
                "--out", str(stage.out)]
    cmd = "eval bench" if stage.command == "eval" else stage.command
    if config_path is None:  # the recipe's own file and values, before anything is written
        return [*launcher, "reasoner", *cmd.split(), str(stage.source), *stage.overrides]
    return [*launcher, "reasoner", *cmd.split(), str(config_path)]


def _write_config(stage: StageRun, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    head = f"# {shlex.join(command_line(stage, path))}\n# written by reasoner run (stage {stage.name})\n"
    body = stage.config if isinstance(stage.config, dict) else dump(stage.config)
    shards.atomic_write_text(path, head + yaml.safe_dump(body, sort_keys=False))


def uses_vllm(stage: StageRun) -> bool:
    """The stage builds a vLLM engine (infer, eval, or a judge on the vllm backend)."""
    from reasoner.infer.engines import pick_backend

    cfg = stage.config
    if stage.command in ("infer", "eval"):
        return pick_backend(cfg.backend) == "vllm"
    if stage.command == "verify" and cfg.mode != "rule" and cfg.judge.model is not None:
        return pick_backend(cfg.judge.backend) == "vllm"
    return False


MODEL_STAGES = ("sft", "train-offline", "infer", "eval")


def uses_accelerator(stage: StageRun) -> bool:
    """The stage loads a model onto a GPU / NPU: a trainer or a generator whose device is cuda
    or npu, or `auto` on a machine that has one (a judge too)."""
    from reasoner import device as dev

    cfg = stage.config
    if stage.command == "verify" and cfg.mode != "rule" and cfg.judge.model is not None:
        if cfg.judge.backend == "openai":  # the judge is a server's
            return False
        wanted = cfg.judge.model.device
    elif stage.command in MODEL_STAGES:
        if stage.command in ("infer", "eval") and cfg.backend == "openai":
            return False
        wanted = cfg.model.device
    else:
        return False
    return wanted in ("cuda", "npu") or (wanted == "auto" and dev.local_devices() is not None)


def own_process(stage: StageRun) -> bool:
    """Whether a stage runs in a process of its own: with a launcher (torchrun), when it builds
    a vLLM engine (vLLM does not free device memory when an engine is deleted), and whenever it
    puts a model on a GPU / NPU (the caching allocator keeps what a finished stage held, and the
    next stage's vLLM start-up check then finds too little free: a one-GPU recipe died at its
    first eval after training; and a trainer on an NPU must set HCCL_EXEC_TIMEOUT before its
    torch loads torch_npu, which this process's did long ago: hccl.py). On a CPU the stages stay
    in this process, where starting one would cost an import of torch and transformers each."""
    return bool(stage.spec.launcher) or uses_vllm(stage) or uses_accelerator(stage)


def _execute(stage: StageRun, config_path: Path, launch: list[str] | None = None) -> None:
    """Run a stage: in this process, or in its own (`own_process`), or under `launch`, which is
    given the stage's command line (`reasoner <command> CONFIG`) to run."""
    if launch:
        result = subprocess.run(command_line(stage, config_path, launch), check=False)
        if result.returncode != 0:
            raise StageFailed(f"stage {stage.name} failed (exit {result.returncode}) under "
                              f"{shlex.join(launch)}; resubmit to resume it")
        return
    if own_process(stage):
        cmd = command_line(stage, config_path)
        if not stage.spec.launcher:  # this interpreter, whatever `reasoner` on PATH is
            cmd = [sys.executable, "-m", "reasoner", *cmd[1:]]
        result = subprocess.run(cmd, check=False)
        if result.returncode != 0:
            raise StageFailed(f"stage {stage.name} failed (exit {result.returncode}); "
                              f"rerun `reasoner run` to resume it")
        return
    STAGES[stage.command].run(stage.config)


def _save_state(run_dir: Path, state: dict) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    shards.atomic_write_text(run_dir / STATE, json.dumps(state, indent=2, sort_keys=True) + "\n")


def time_left(stages: list[StageRun], done: StageRun, min_seconds: float = 10.0) -> str | None:
    """After `done` ran: the time the stages still to run should take here, their reference
    times (expect_seconds) scaled by how much slower or faster this machine ran the stages so
    far (those expected to take >= min_seconds: a 1-second stage says nothing about speed)."""
    timed = [s for s in stages[:stages.index(done) + 1] if s.works
             and s.spec.expect_seconds is not None and s.spec.expect_seconds >= min_seconds]
    if not timed:
        return None
    factor = sum(s.seconds for s in timed) / sum(s.spec.expect_seconds for s in timed)
    rest = [s for s in stages[stages.index(done) + 1:] if s.works]
    if not rest:
        return None
    left = factor * sum(s.spec.expect_seconds or 0.0 for s in rest)
    return (f"[time] about {left / 60:.0f} min left for {len(rest)} stages "
            f"(this machine: {factor:.2f}x the reference's stage times)")


def only_stage(stages: list[StageRun], name: str) -> list[StageRun]:
    """`--only NAME`: that one stage, decided as the whole recipe would decide it; every stage
    before it must be finished with this recipe (the Slurm script runs the stages one by one)."""
    unfinished = [s.name for s in stages[:-1] if s.status != "skip"]
    if unfinished:
        raise ConfigError(f"--only {name}: the stages before it are not finished with this "
                          f"recipe ({', '.join(unfinished)}); run them first")
    return stages[-1:]


def run(recipe: RecipeConfig, base: Path, start: str | None = None, until: str | None = None,
        dry_run: bool = False, echo=print, only: str | None = None,
        launch: list[str] | None = None, check_hub: bool = False) -> list[StageRun]:
    """Run (or, with dry_run, only resolve and print) the recipe; return its stages with status
    and numbers. `only`: just that stage (the others before it finished); `launch`: the prefix
    the stages that run are started under (the Slurm script's srun + torchrun); `check_hub`:
    look up on the hub the hub ids the stages to run read (`--dry-run`)."""
    if only is not None and (start is not None or until is not None):
        raise ConfigError("--only runs one stage: drop --from / --until")
    run_dir = Path(recipe.run_dir)
    stages = decide(resolve(recipe, base), _read_state(run_dir), start, only or until)
    previous.mark(stages, start)  # outputs already made with this identity: kept or brought back
    inputs.check(stages, run_dir, ask_hub=check_hub, echo=echo)  # a missing input stops any stage
    if only is not None:
        stages = only_stage(stages, only)
    if dry_run:
        for s in stages:
            echo(f"{s.status:>7}  {s.name:<16} {s.reason:<28} {shlex.join(command_line(s))}")
        return stages
    missing = [s.name for s in stages if s.reason.endswith("!)")]
    if missing:
        raise ConfigError(f"--from {start}: the stages before it are not finished with this recipe "
                         f"({', '.join(missing)}); run without --from first")
    state = _read_state(run_dir)
    state["recipe"] = dump(recipe)
    for s in stages:
        if s.status == "skip":
            echo(f"[skip] {s.name}: {s.reason}")
            continue
        if start is None and _reuse(s, recipe, echo):
            s.seconds = 0.0
        else:
            _compute(s, recipe, state, echo, launch)
            line = time_left(stages, s)
            if line:
                echo(line)
        s.headline, s.metrics = STAGES[s.command].headline(s.out)
        state["stages"][s.name] = {"chain": s.chain, "digest": s.digest, "status": "done",
                                   "command": s.command,
                                   "seconds": round(s.seconds, 2), "headline": s.headline,
                                   "metrics": s.metrics, "output": str(s.out)}
        _save_state(run_dir, state)
    return stages


def _reuse(s: StageRun, recipe: RecipeConfig, echo) -> bool:
    """Keep the stage's folder, or bring a kept copy back, when it already holds the output
    this stage would make (previous.py), decided now that the stages before it are done;
    False when the stage has to be computed."""
    if s.status == "resume":
        return False
    found = previous.matching(s)
    if found is None:
        if not s.works:  # planned, then the stage before it came out otherwise
            s.status, s.reason = "rerun", "its inputs came out otherwise"
        return False
    s.reason = s.reason.split("; ")[0]  # as decided, before the planned keep / restore
    previous.label(s, found)
    if s.status == "keep":
        echo(f"[keep] {s.name}: {s.reason}")
        return True
    said = previous.set_aside(s.out, recipe.keep_previous, recipe.previous_max_gib, back=found)
    echo(f"[restore] {s.name}: {s.reason}; {said}")
    return True


def _compute(s: StageRun, recipe: RecipeConfig, state: dict, echo,
             launch: list[str] | None) -> None:
    """Run one stage: its old output set aside (previous.py), its config written, its state
    `running` until it returns."""
    run_dir = Path(recipe.run_dir)
    path = run_dir / "configs" / f"{s.name}.yaml"
    if s.status in ("run", "rerun") and s.out.exists():
        said = previous.set_aside(s.out, recipe.keep_previous, recipe.previous_max_gib)
        echo(f"[{s.status}] {s.name}: {s.reason}; {said}")
    else:
        echo(f"[{s.status}] {s.name}: {s.reason}")
    _write_config(s, path)
    state["stages"][s.name] = {"chain": s.chain, "digest": s.digest, "status": "running",
                               "command": s.command}
    _save_state(run_dir, state)
    started = time.perf_counter()
    _execute(s, path, launch)
    s.seconds = time.perf_counter() - started
