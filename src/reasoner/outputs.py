"""A stage's output folder: what it was made from (its identity), who is writing it (a lock), and
what may be written there.

A stage's identity is its config less the settings that do not change its result (each stage
names them: progress bars, engine and kernel settings, device, sequence parallelism, time-outs),
and the identity of each input it reads: a shard folder's manifest (its own identity, counts,
completeness), a model folder's files (names, sizes, times), a data file's size and time, a hub
id as written. It is recorded in the manifest (and in every checkpoint of the trainers). A rerun
with the same identity finds the folder complete and does nothing, saying so; a rerun with
another identity is refused, naming what differs, unless `overwrite=true`; a folder another stage
wrote is never taken over; an output folder is never one of its inputs, nor inside one.

One process writes a folder (or one part of it, for infer's shards) at a time: `claim` takes an
exclusive lock for the whole stage, and a second writer stops at once, naming the first.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import shutil
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reasoner import shards
from reasoner.errors import ConfigError, ShardError

MODEL_FILES = ("*.json", "*.safetensors", "*.model", "*.txt", "*.jinja")


def _file_sig(path: Path) -> str:
    st = path.stat()
    return f"{path.name}:{st.st_size}:{st.st_mtime_ns}"


def input_identity(kind: str, value: str) -> dict[str, Any]:
    """What an input was when a stage read it (see the module docstring)."""
    path = Path(value).expanduser()
    if not path.exists():
        return {"path": value, "kind": kind, "digest": value}  # a hub id, as written
    if path.is_dir() and shards.read_manifest(path) is not None:
        manifest = shards.read_manifest(path) or {}
        seen = {"identity": manifest.get("identity"), "config": manifest.get("config"),
                "counts": manifest.get("counts"), "complete": manifest.get("complete")}
        return {"path": value, "kind": kind, "complete": bool(manifest.get("complete")),
                "counts": manifest.get("counts") or {},
                "digest": _digest(json.dumps(seen, sort_keys=True, default=str))}
    if path.is_dir():
        files = sorted(f for pattern in MODEL_FILES for f in path.glob(pattern))
        return {"path": value, "kind": kind, "digest": _digest("|".join(map(_file_sig, files)))}
    return {"path": value, "kind": kind, "digest": _digest(_file_sig(path))}


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Identity:
    """What decides a stage's output: its result-deciding config and its inputs."""

    stage: str
    config: dict
    inputs: dict[str, dict]  # config key -> input_identity

    @classmethod
    def of(cls, stage: str, config: dict, inputs: list) -> Identity:
        """`inputs`: the stage config's `inputs()` (config key, value, kind)."""
        return cls(stage, config, {i.key: input_identity(i.kind, i.value) for i in inputs})

    @property
    def digest(self) -> str:
        return _digest(json.dumps({"stage": self.stage, "config": self.config,
                                   "inputs": {k: v["digest"] for k, v in self.inputs.items()}},
                                  sort_keys=True, default=str))

    def record(self) -> dict:
        """What goes into the manifest."""
        return {"stage": self.stage, "config": self.config, "identity": self.digest,
                "input_identity": self.inputs}


def without(config: dict, paths: tuple[str, ...]) -> dict:
    """`config` (a dumped stage config) less the dotted `paths` (settings that do not change a
    stage's result)."""
    out = json.loads(json.dumps(config, default=str))
    for dotted in paths:
        node, *rest = dotted.split(".")
        holder = out
        while rest and isinstance(holder.get(node), dict):
            holder, node, rest = holder[node], rest[0], rest[1:]
        if not rest and isinstance(holder, dict):
            holder.pop(node, None)
    return out


def _differences(old: dict, new: Identity) -> list[str]:
    """What differs between a folder's manifest and `new`, one phrase each."""
    found = []
    old_config = old.get("config") or {}
    flat_old, flat_new = _flatten(old_config), _flatten(new.config)
    for key in sorted(set(flat_old) | set(flat_new)):
        if flat_old.get(key, "(absent)") != flat_new.get(key, "(absent)"):
            found.append(f"{key}: {flat_old.get(key, '(absent)')!r} then, "
                         f"{flat_new.get(key, '(absent)')!r} now")
    old_inputs = old.get("input_identity") or {}
    for key, now in new.inputs.items():
        then = old_inputs.get(key)
        if then is not None and then.get("digest") != now["digest"] and \
                then.get("path") == now["path"]:
            found.append(f"input {key}={now['path']} has changed since (regenerated, or "
                         "completed later)")
    return found


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flatten(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def check_not_an_input(folder: Path, inputs: list, key: str = "output_dir") -> None:
    """An output folder is never one of the stage's inputs, nor inside one, nor around one."""
    out = Path(folder).resolve()
    for i in inputs:
        path = Path(i.value).expanduser()
        if not path.exists():
            continue
        path = path.resolve()
        if out == path or path in out.parents or out in path.parents:
            raise ConfigError(
                f"{key}={folder} is {'' if out == path else 'inside ' if path in out.parents else 'around '}"
                f"the stage's input {i.key}={i.value}: writing there would replace what it "
                "reads. Choose another output_dir")


def has_work(folder: Path) -> bool:
    """The folder holds something a run made: parts, checkpoints, a final model, a report."""
    folder = Path(folder)
    return any(folder.glob("part-*.jsonl")) or any(folder.glob("checkpoint-*")) or any(
        (folder / name).exists() for name in ("final", "report.json", "samples", "verified"))


def decide(folder: Path, identity: Identity, overwrite: bool = False) -> str:
    """What a run does in `folder`, read from it (every process of a run reads the same):
    "complete" (nothing to do), "resume", "new", or "replace" (overwrite=true: empty it first).
    Refuses a folder another stage wrote, and one written with another identity unless
    `overwrite`; a folder whose failed run left nothing behind is taken over quietly."""
    folder = Path(folder)
    manifest = shards.read_manifest(folder) if folder.is_dir() else None
    if manifest is None:
        if folder.is_dir() and has_work(folder):
            if overwrite:
                return "replace"
            raise ShardError(f"{folder} holds output but no manifest: it was not written by "
                             "reasoner, or by an older version; delete it or choose another "
                             "output_dir (overwrite=true empties it)")
        return "new"
    if manifest.get("stage") not in (None, identity.stage):
        raise ShardError(f"{folder} was written by `reasoner {manifest.get('stage')}`, not by "
                         f"`reasoner {identity.stage}`: a stage never takes over another's "
                         "folder. Choose another output_dir")
    if manifest.get("identity", _legacy(manifest, identity)) == identity.digest:
        return "complete" if manifest.get("complete") else "resume"
    if not (manifest.get("complete") or has_work(folder)):
        return "replace"  # a run that failed before it made anything: nothing to keep
    if overwrite:
        return "replace"
    what = _differences(manifest, identity) or ["(the settings that decide the result)"]
    raise ShardError(
        f"{folder} was made with another {identity.stage} config or from other inputs:\n  "
        + "\n  ".join(what[:8]) + ("\n  ..." if len(what) > 8 else "")
        + "\nPass overwrite=true to replace it, or choose another output_dir (the folder is "
        "kept as it is)")


def begin(folder: Path, identity: Identity, action: str, keep: tuple[str, ...] = ()) -> None:
    """Make `folder` ready for the run `decide` chose: emptied for "replace" (but for `keep`:
    work the stage checks itself, as verify's verdicts), an incomplete manifest with this
    identity for "new" and "replace" (one process does this)."""
    folder = Path(folder)
    if action == "replace":
        _empty(folder, keep)
    if action in ("new", "replace"):
        shards.update_manifest(folder, **identity.record(), counts={}, complete=False,
                               inputs={k: v["path"] for k, v in identity.inputs.items()})


def said_complete(stage: str, folder: Path) -> str:
    """The line a rerun with nothing to do prints."""
    return (f"reasoner {stage}: {folder} is already complete with this config and these "
            "inputs; nothing to do (overwrite=true redoes it)")


def _legacy(manifest: dict, identity: Identity) -> str | None:
    """A manifest from before identities: the same config text counts as the same identity."""
    return identity.digest if manifest.get("config") == identity.config else None


def _empty(folder: Path, keep: tuple[str, ...] = ()) -> None:
    """Delete what a run made in `folder` (overwrite=true), keeping the folder and its locks."""
    if not folder.is_dir():
        return
    for entry in folder.iterdir():
        if entry.name.startswith(".writer") or entry.name == ".lock" or entry.name in keep:
            continue
        shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()


def require_complete(folder: Path, key: str, command: str) -> None:
    """An input shard folder must say complete: true (a reader of an unfinished one would train
    or verify on what happened to be written)."""
    if shards.read_manifest(folder) is not None and not shards.is_complete(folder):
        raise ShardError(f"{key}={folder} is not complete (its manifest says complete: false): "
                         f"finish it first ({command}), then rerun this stage")


@contextmanager
def writer_lock(folder: Path, name: str = "writer") -> Iterator[None]:
    """Hold `folder`'s writer lock (`name`: one per writer: infer's shards each have their
    own) for the block; a second writer stops at once, naming the process that holds it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f".{name}.lock"
    fh = open(path, "a+")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EAGAIN, errno.EACCES):
            raise
        fh.seek(0)
        holder = fh.read().strip() or "another process"
        fh.close()
        raise ShardError(f"another reasoner process, {holder}, is writing {folder}: wait for "
                         "it to end (or stop it), or choose another output_dir") from None
    fh.seek(0)
    fh.truncate()
    fh.write(f"pid {os.getpid()} on {socket.gethostname()}")
    fh.flush()
    try:
        yield
    finally:
        fh.seek(0)
        fh.truncate()
        fcntl.flock(fh, fcntl.LOCK_UN)
        fh.close()


@contextmanager
def writing(folder: Path, identity: Identity, action: str, dist: Any = None,
            lock: str = "writer", keep: tuple[str, ...] = ()) -> Iterator[None]:
    """For the block: this job's writer lock on `folder` (held by rank 0 of a training job, by
    the process itself otherwise) and the folder made ready for `action` (`begin`)."""
    main = dist is None or dist.is_main
    holder = writer_lock(folder, lock) if main else _nothing()
    with holder:
        if main:
            begin(folder, identity, action, keep)
        if dist is not None and dist.world_size > 1:
            from reasoner import device as dev

            dev.barrier(dist)
        yield


@contextmanager
def _nothing() -> Iterator[None]:
    yield
