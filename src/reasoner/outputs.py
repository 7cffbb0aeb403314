"""A stage's output folder: what it was made from (its identity), who is writing it (a lock), and
what may be written there.

A stage's identity is its config less the settings that do not change its result (each stage
names them: progress bars, engine and kernel settings, device, sequence parallelism, time-outs),
and the identity of each input it reads: a shard folder's manifest (its own identity, counts,
completeness), a model folder's files (names, sizes, times), a data file's size and time, a hub
id as written. It is recorded in the manifest (and in every checkpoint of the trainers). A rerun
with the same identity finds the folder complete and does nothing, saying so; a rerun with
another identity is refused, naming what differs; `overwrite=true` redoes the work either way; a
folder another stage wrote is never taken over; an output folder is never one of its inputs, nor
inside one.

A folder is a stage's when it holds the stage's manifest, written before anything else; what the
stage writes there is named by `WRITES`. Anything else is the user's and is never deleted:
`overwrite=true` removes only the stage's own entries and names what it kept, and a folder that
holds the user's entries but no manifest is refused, `overwrite=true` or not.

One process writes a folder (or one part of it, for infer's shards) at a time: `claim` takes an
exclusive lock for the whole stage, and a second writer stops at once, naming the first.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from reasoner import shards
from reasoner.errors import ConfigError, InputError, ShardError

MODEL_FILES = ("*.json", "*.safetensors", "*.model", "*.txt", "*.jinja")

# What a stage writes at the top of its output folder (glob patterns on names). Every stage also
# writes EVERY_STAGE: its manifest, locks (never removed while the folder exists), temporary
# files of atomic writes (`.final.tmp`, `.checkpoint-4.tmp`, `.manifest.json.<pid>.tmp`) and the
# marks of the shared-folder check. tests/integration/test_output_folders.py runs every stage
# and finds nothing it does not name.
LOCKS = (".lock", ".writer.lock", ".writer-*.lock")
EVERY_STAGE = ("manifest.json", *LOCKS, ".*.tmp", ".same-folder-check-*")
TRAINER = ("checkpoint-[0-9]*", "final", "metrics.jsonl", "tensorboard", "wandb")
WRITES = {
    "sft": (*TRAINER, "token_cache"),
    "train-offline": (*TRAINER, "rollouts", "ref_logprobs", "anchor_logprobs"),
    "infer": ("part-*.jsonl",),
    "verify": ("part-*.jsonl", "verdicts", "stats.json", "disagreements.jsonl"),
    "eval": ("problems", "samples", "verified", "report.json", "report.md",
             "accuracy_by_length.png", "length_hist.png", "pass_at_k.png", "metrics.jsonl",
             "tensorboard", "wandb"),
    "data synth": ("train_problems", "test_problems", "sft"),
}


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


def decide(folder: Path, identity: Identity, overwrite: bool = False) -> str:
    """What a run does in `folder`, read from it (every process of a run reads the same):
    "complete" (nothing to do), "resume", "new", "replace" (another identity: remove what the
    stage wrote first) or "redo" (overwrite=true with the same identity: the same). Refuses a
    file, a folder holding the user's entries but no manifest, one another stage wrote, and one
    written with another identity unless `overwrite`; a folder whose failed run left nothing
    behind is taken over quietly."""
    folder = Path(folder)
    check_is_folder(folder)
    manifest = shards.read_manifest(folder) if folder.is_dir() else None
    if manifest is None:
        refuse_users_entries(folder, identity.stage)  # a folder is reasoner's by its manifest
        return "new"
    if manifest.get("stage") not in (None, identity.stage):
        raise ShardError(f"{folder} was written by `reasoner {manifest.get('stage')}`, not by "
                         f"`reasoner {identity.stage}`: a stage never takes over another's "
                         "folder. Choose another output_dir")
    same = manifest.get("identity", _legacy(manifest, identity)) == identity.digest
    if overwrite:
        return "redo" if same else "replace"
    if same:
        return "complete" if manifest.get("complete") else "resume"
    if not (manifest.get("complete") or has_work(folder)):
        return "replace"  # a run that failed before it made anything: nothing to keep
    what = _differences(manifest, identity) or ["(the settings that decide the result)"]
    raise ShardError(
        f"{folder} was made with another {identity.stage} config or from other inputs:\n  "
        + "\n  ".join(what[:8]) + ("\n  ..." if len(what) > 8 else "")
        + "\nPass overwrite=true to replace it, or choose another output_dir (the folder is "
        "kept as it is)")


def check_is_folder(folder: Path) -> None:
    """An output folder that is a file is refused before any work (mkdir would fail with
    FileExistsError half-way into a run)."""
    if Path(folder).exists() and not Path(folder).is_dir():
        raise InputError(f"output_dir={folder} is a file, not a folder: a stage writes a folder "
                         "of its own there. Choose another output_dir (a new or empty folder)")


def users_entries(folder: Path, own: tuple[str, ...]) -> list[str]:
    """The names of `folder`'s entries that none of the patterns `own` names: the user's."""
    if not Path(folder).is_dir():
        return []
    return sorted(e.name for e in Path(folder).iterdir()
                  if not any(fnmatchcase(e.name, pattern) for pattern in own))


def refuse_users_entries(folder: Path, stage: str, own: tuple[str, ...] = EVERY_STAGE) -> None:
    """Refuse, before any work, a folder holding entries `stage` did not write (by `own`; by
    default a folder without a manifest, where only locks and temporary files are reasoner's)."""
    found = users_entries(folder, own)
    if found:
        raise ShardError(
            f"{folder} holds {_count(found)} that `reasoner {stage}` did not write "
            f"({_few(found)}): reasoner writes only into a new or empty folder, or one it made, "
            "and never deletes what it did not write (overwrite=true neither). Choose another "
            "output_dir, or move those out of it")


def check_model_folder(folder: Path, command: str) -> None:
    """`model tiny` / `model import` replace their folder whole: refuse one holding anything
    but a model's files (a folder without config.json holds none)."""
    is_model = (Path(folder) / "config.json").exists()
    refuse_users_entries(folder, command, MODEL_FILES if is_model else ())


def _count(names: list[str]) -> str:
    return f"{len(names)} {'entry' if len(names) == 1 else 'entries'}"


def _few(names: list[str], shown: int = 4) -> str:
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more"
                                       if len(names) > shown else "")


def has_work(folder: Path) -> bool:
    """The folder holds something a run made: parts, checkpoints, a final model, a report."""
    folder = Path(folder)
    return any(folder.glob("part-*.jsonl")) or any(folder.glob("checkpoint-*")) or any(
        (folder / name).exists() for name in ("final", "report.json", "samples", "verified"))


def begin(folder: Path, identity: Identity, action: str, keep: tuple[str, ...] = (),
          mine: tuple[str, ...] | None = None) -> None:
    """Make `folder` ready for the run `decide` chose: for "replace" and "redo", what the stage
    wrote removed (but `keep`: work the stage checks itself, as verify's verdicts; a "redo" only
    of `mine` when given: each of infer's shard workers redoes its own part) and the user's
    entries kept, named on stderr; then an incomplete manifest with this identity (one process
    does this)."""
    folder = Path(folder)
    if action in ("replace", "redo"):
        kept = _empty(folder, identity.stage, keep, mine if action == "redo" else None)
        if kept:
            print(said_kept(identity.stage, folder, kept), file=sys.stderr)
    if action in ("new", "replace", "redo"):
        shards.update_manifest(folder, **identity.record(), counts={}, complete=False,
                               inputs={k: v["path"] for k, v in identity.inputs.items()})


def said_complete(stage: str, folder: Path) -> str:
    """The line a rerun with nothing to do prints."""
    return (f"reasoner {stage}: {folder} is already complete with this config and these "
            "inputs; nothing to do (overwrite=true redoes it)")


def said_kept(stage: str, folder: Path, names: list[str]) -> str:
    """The line overwrite=true prints for the user's entries it left in `folder`."""
    return (f"reasoner {stage}: kept {_few(names)} in {folder}: not written by `reasoner "
            f"{stage}` (overwrite=true removes only what it wrote)")


def _legacy(manifest: dict, identity: Identity) -> str | None:
    """A manifest from before identities: the same config text counts as the same identity."""
    return identity.digest if manifest.get("config") == identity.config else None


def _empty(folder: Path, stage: str, keep: tuple[str, ...] = (),
           only: tuple[str, ...] | None = None) -> list[str]:
    """Delete what `stage` wrote in `folder` (overwrite=true; `only`: just these entries),
    keeping its locks and `keep`; return the user's entries, which are never touched."""
    if not folder.is_dir():
        return []
    own = (*EVERY_STAGE, *WRITES.get(stage, ()))
    for entry in folder.iterdir():
        if entry.name in keep or any(fnmatchcase(entry.name, p) for p in LOCKS) or not any(
                fnmatchcase(entry.name, p) for p in own) or (only and entry.name not in only):
            continue
        shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    return users_entries(folder, own)


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
            lock: str = "writer", keep: tuple[str, ...] = (),
            mine: tuple[str, ...] | None = None) -> Iterator[None]:
    """For the block: this job's writer lock on `folder` (held by rank 0 of a training job, by
    the process itself otherwise) and the folder made ready for `action` (`begin`). A failure
    of the file system in the block leaves as the OSError it is (`disk_error`): the CLI says it
    in one paragraph, and a rerun resumes."""
    main = dist is None or dist.is_main
    holder = writer_lock(folder, lock) if main else _nothing()
    with holder:
        if main:
            begin(folder, identity, action, keep, mine)
        if dist is not None and dist.world_size > 1:
            from reasoner import device as dev

            dev.barrier(dist)
        try:
            yield
        except Exception as exc:
            said = disk_error(exc, Path(folder))
            if said is None:
                raise
            raise said from exc


def disk_error(exc: Exception, folder: Path) -> OSError | None:
    """`exc` as an OSError naming a path, when the file system failed while writing `folder`:
    safetensors reports a full disk as its own SafetensorError ("... No space left on device
    (os error 28) at path ..."), and a write to an open file raises an OSError naming no file.
    None for anything else, which keeps its traceback."""
    if isinstance(exc, OSError):
        if exc.filename is None and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return OSError(exc.errno, exc.strerror or os.strerror(exc.errno), str(folder))
        return None
    from safetensors import SafetensorError

    found = re.search(r"os error (\d+)|code: (\d+)", str(exc))
    if not isinstance(exc, SafetensorError) or found is None:
        return None
    number = int(found.group(1) or found.group(2))
    return OSError(number, os.strerror(number), str(folder))


@contextmanager
def _nothing() -> Iterator[None]:
    yield
