"""Shard folders: `part-00000.jsonl` ... written line by line, plus `manifest.json` (docs/design.md, "Shard folders").

A part is written by one worker and flushed after every row, so a crash loses at most the row
being written. A resumed writer truncates a torn last line and the caller skips keys already
present. Readers ignore a torn last line only while the folder is incomplete; once the manifest
says `complete: true`, every line must parse. Several workers write separate parts of one
folder; manifest updates take a file lock so they never overwrite each other.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from reasoner import __version__
from reasoner.errors import ShardError  # noqa: F401  (raised here, caught by callers)
from reasoner.records import SCHEMA_VERSION, Row

MANIFEST = "manifest.json"


def part_path(folder: Path, index: int) -> Path:
    return Path(folder) / f"part-{index:05d}.jsonl"


def part_files(folder: Path) -> list[Path]:
    return sorted(Path(folder).glob("part-*.jsonl"))


# --------------------------------------------------------------------------------------------
# Manifest


def read_manifest(folder: Path) -> dict | None:
    path = Path(folder) / MANIFEST
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ShardError(f"{path}: not valid JSON ({exc}); delete the folder and rerun the stage") from exc


def is_complete(folder: Path) -> bool:
    manifest = read_manifest(folder)
    return bool(manifest and manifest.get("complete"))


def finished(folder: Path, config: dict) -> bool:
    """The folder is complete and was written with exactly `config` (a rerun has nothing to do)."""
    manifest = read_manifest(folder)
    return bool(manifest and manifest.get("complete") and manifest.get("config") == config)


def atomic_write_text(path: Path, text: str) -> None:
    """Write via a temporary file and rename, so readers never see half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


@contextmanager
def _locked(folder: Path):
    with open(Path(folder) / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def update_manifest(folder: Path, **fields: Any) -> dict:
    """Merge `fields` into the manifest under a lock (several workers may finish at once)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with _locked(folder):
        manifest = read_manifest(folder) or {}
        manifest.update(fields)
        manifest.setdefault("schema_version", SCHEMA_VERSION)
        manifest["reasoner_version"] = __version__
        atomic_write_text(folder / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def begin(folder: Path, stage: str, config: dict, inputs: dict[str, str] | None = None,
          overwrite: bool = False) -> dict:
    """Prepare `folder` as the output of `stage`: new, or resumed when the config is unchanged.

    A finished folder with a different config, or an unfinished one written with another
    config, is refused unless `overwrite` (then its parts are deleted).
    """
    folder = Path(folder)
    manifest = read_manifest(folder)
    if manifest is not None and manifest.get("config") != config:
        if not overwrite:
            raise ShardError(
                f"{folder} was written by '{manifest.get('stage')}' with another config; "
                "pass overwrite=true or choose another output folder"
            )
    if overwrite and manifest is not None and manifest.get("config") != config:
        for part in part_files(folder):
            part.unlink()
        (folder / MANIFEST).unlink()
    elif manifest is None and part_files(folder) and not overwrite:
        raise ShardError(f"{folder} holds parts but no manifest; delete it or pass overwrite=true")
    elif manifest is None and overwrite:
        for part in part_files(folder):
            part.unlink()
    folder.mkdir(parents=True, exist_ok=True)
    if manifest is not None and manifest.get("config") == config:
        return manifest
    return update_manifest(folder, stage=stage, config=config, inputs=inputs or {}, counts={},
                           complete=False)


def reset(folder: Path, stage: str, config: dict, inputs: dict[str, str] | None = None) -> dict:
    """Start `folder` afresh (parts deleted, manifest incomplete): for stages that regenerate."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for part in part_files(folder):
        part.unlink()
    with _locked(folder):
        (folder / MANIFEST).unlink(missing_ok=True)
    return update_manifest(folder, stage=stage, config=config, inputs=inputs or {}, counts={},
                           complete=False)


def reset_parts(folder: Path) -> None:
    """Delete the parts (not the manifest): for stages that rewrite their output whole."""
    for part in part_files(folder):
        part.unlink()


def finish(folder: Path, counts: dict[str, Any], **extra: Any) -> dict:
    """Mark the folder complete; only now do readers treat it as a finished stage output."""
    return update_manifest(folder, counts=counts, complete=True, **extra)


# --------------------------------------------------------------------------------------------
# Writing


def repair_part(path: Path) -> int:
    """Truncate a torn last line (bytes after the last newline); return the bytes dropped.

    Rows are written as one `line + newline`, so only a crash mid-write leaves bytes without a
    newline after them. A complete line that does not parse is corruption, reported by readers.
    """
    path = Path(path)
    if not path.exists():
        return 0
    size = path.stat().st_size
    with open(path, "r+b") as fh:
        data = fh.read()
        keep = data.rfind(b"\n") + 1
        if keep != size:
            fh.truncate(keep)
    return size - keep


class PartWriter:
    """Appends rows to one part of a shard folder, one JSON line each, flushed as it goes."""

    def __init__(self, folder: Path, part: int = 0, fsync: bool = False):
        self.path = part_path(folder, part)
        Path(folder).mkdir(parents=True, exist_ok=True)
        self.dropped_bytes = repair_part(self.path)
        self._fh = open(self.path, "a", encoding="utf-8")
        self._fsync = fsync
        self.written = 0

    def write(self, row: Row | dict) -> None:
        data = row.model_dump(mode="json", exclude_none=True) if isinstance(row, Row) else row
        data.setdefault("schema_version", SCHEMA_VERSION)
        self._fh.write(json.dumps(data, ensure_ascii=False) + "\n")
        self._fh.flush()
        if self._fsync:
            os.fsync(self._fh.fileno())
        self.written += 1

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> PartWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_rows(folder: Path, rows: Iterable[Row | dict], part: int = 0) -> int:
    with PartWriter(folder, part) as writer:
        for row in rows:
            writer.write(row)
        return writer.written


# --------------------------------------------------------------------------------------------
# Reading


def describe_validation(exc: ValidationError) -> str:
    """A pydantic error as the short phrase a user reads after `path:line:`."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        if err["type"] == "missing":
            parts.append(f'missing field "{loc}"')
        elif loc:
            parts.append(f'field "{loc}": {err["msg"]}')
        else:
            parts.append(err["msg"].removeprefix("Value error, "))
    return "; ".join(parts)


def raw_rows(path: Path, allow_torn: bool = False) -> Iterator[tuple[int, dict]]:
    """(line number, JSON object) of each non-empty line; a torn last line is skipped if allowed."""
    path = Path(path)
    with open(path, "rb") as fh:
        lines = fh.read().split(b"\n")
    last = len(lines) - 1
    for lineno, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            if lineno - 1 == last and allow_torn:  # the final piece had no newline after it
                return
            raise ShardError(f"{path}:{lineno}: not a JSON object ({exc})") from None
        if not isinstance(row, dict):
            raise ShardError(f"{path}:{lineno}: not a JSON object")
        yield lineno, row


def validate_row(row: dict, row_type: type[Row] | None, where: str) -> dict:
    """Check the schema version and (when given) the row type; errors start with `where`."""
    version = row.setdefault("schema_version", SCHEMA_VERSION)
    if version != SCHEMA_VERSION:
        raise ShardError(
            f"{where}: schema_version {version!r} is not supported by reasoner "
            f"{__version__} (it reads version {SCHEMA_VERSION}); regenerate the shard with "
            "this version or install the reasoner that wrote it"
        )
    if row_type is None:
        return row
    try:
        return row_type.model_validate(row).model_dump(mode="json", exclude_none=True)
    except ValidationError as exc:
        raise ShardError(f"{where}: {describe_validation(exc)}") from None


def iter_file(path: Path, row_type: type[Row] | None = None, allow_torn: bool = False
              ) -> Iterator[dict]:
    """Rows of one JSONL file as dicts, validated against `row_type` when given."""
    for lineno, row in raw_rows(path, allow_torn):
        yield validate_row(row, row_type, f"{path}:{lineno}")


def iter_rows(folder: Path, row_type: type[Row] | None = None) -> Iterator[dict]:
    """Every row of a shard folder, parts in order; tolerant of torn last lines while incomplete."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ShardError(f"{folder}: no such shard folder")
    allow_torn = not is_complete(folder)
    for part in part_files(folder):
        yield from iter_file(part, row_type, allow_torn=allow_torn)


def present_keys(folder: Path, row_type: type[Row]) -> set:
    """Keys already written in a (possibly unfinished) folder; raises on a duplicate key."""
    keys: set = set()
    if not Path(folder).is_dir():
        return keys
    for row in iter_rows(folder):
        key = row_type.key_of(row)
        key = tuple(key) if isinstance(key, list) else key
        if key in keys:
            raise ShardError(f"{folder}: key {key!r} appears twice")
        keys.add(key)
    return keys
