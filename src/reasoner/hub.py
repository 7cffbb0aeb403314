"""Local path or hub id: decided before any download is tried, so a typo costs one line, not a
traceback after half a minute of retries.

A hub id is `name` or `owner/name` (letters, digits, `-_.`). Anything else that does not exist
(`runs/quickstart/sft/finall`, `./model`, `/data/x`) was meant as a local path: it is reported
at once, with the closest name that does exist beside it. With HF_HUB_OFFLINE (or
TRANSFORMERS_OFFLINE / HF_DATASETS_OFFLINE) set, a hub id is looked up in the local hub cache
only and reported at once when it is not there.
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path

_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")
_OFFLINE = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")


def is_hub_id(name: str) -> bool:
    """`Qwen/Qwen2.5-32B`, `gsm8k`: the shape of a hub id (not that it exists)."""
    return bool(_HUB_ID.fullmatch(name)) and not name.endswith((".jsonl", ".json", ".parquet",
                                                                 ".yaml", ".gguf"))


def offline() -> bool:
    return any(os.environ.get(k, "").strip().lower() in ("1", "true", "yes", "on")
               for k in _OFFLINE)


def closest(path: Path) -> Path | None:
    """The existing path that differs least from `path` (a typo in its last part)."""
    parent = path.parent
    while not parent.is_dir() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return None
    rest = path.relative_to(parent).parts if path.is_relative_to(parent) else (path.name,)
    names = [p.name for p in parent.iterdir()]
    found = difflib.get_close_matches(rest[0], names, n=1, cutoff=0.6)
    return parent / found[0] if found else None


def missing(name: str, key: str, kind: str, cached: bool = False) -> str | None:
    """Why `name` (the value of config `key`, a `kind` like "model folder") cannot be used, or
    None when it may be: it exists locally, or it is a hub id and we are online (the hub
    answers), or offline and `cached`."""
    path = Path(name).expanduser()
    if path.exists():
        return None
    if not is_hub_id(name):
        near = closest(path)
        hint = f" (did you mean {near}?)" if near is not None else ""
        return f"{key}={name}: no such {kind}{hint}"
    if offline() and not cached:
        return (f"{key}={name}: not a local {kind}, and not in the hub cache while offline "
                f"({' / '.join(k for k in _OFFLINE if os.environ.get(k))} is set); give a "
                "local path, or download it where the hub is reachable")
    return None
