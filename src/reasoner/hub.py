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


# --------------------------------------------------------------------------------------------
# Asking the hub (`reasoner run --dry-run`)

TIMEOUT_S = 5.0  # one look-up; the hub answers in well under a second when it can be reached


def repo_type(kind: str) -> str:
    """What a hub id in a config key of this `kind` names: a model, or a data set."""
    return "model" if kind == "model folder" else "dataset"


def in_cache(name: str, kind: str) -> bool:
    """The hub id is in this machine's caches (the hub cache; `datasets`' own for a data set),
    where a stage offline finds it."""
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.constants import HF_HUB_CACHE

    if repo_type(kind) == "model":
        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    snapshots = Path(HF_HUB_CACHE) / f"datasets--{name.replace('/', '--')}" / "snapshots"
    if snapshots.is_dir() and any(snapshots.iterdir()):
        return True
    import datasets

    return (Path(datasets.config.HF_DATASETS_CACHE) / name.replace("/", "___")).exists()


def lookup(name: str, kind: str, timeout_s: float = TIMEOUT_S) -> tuple[str, str] | None:
    """Ask the hub for `name`: None when it holds it (a model with its config.json), else
    (verdict, why): "absent" (no such repository, or not a model), "gated" (it needs a token
    with access) or "unreachable" (no answer within `timeout_s`, or an error status)."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        HTTPError,
        RepositoryNotFoundError,
    )

    what = repo_type(kind)
    api = HfApi()
    ask = api.model_info if what == "model" else api.dataset_info
    try:
        found = ask(name, timeout=timeout_s)
    except GatedRepoError:
        return "gated", (f"a gated {what} on the hub: log in with a token that has access "
                         "(`hf auth login`)")
    except RepositoryNotFoundError:
        return "absent", f"no such {what} on the hub (or a private one: log in first)"
    except HfHubHTTPError as exc:  # the hub answered, with an error status (5xx, 429)
        return "unreachable", f"the hub answered HTTP {exc.response.status_code}; try later"
    except (HTTPError, OSError) as exc:  # no route, no name resolution, no answer in time
        return "unreachable", (f"the hub could not be reached ({type(exc).__name__}: {exc}; "
                               f"a look-up waits {timeout_s:g} s at most)")
    files = [s.rfilename for s in found.siblings] if found.siblings is not None else None
    if what == "model" and files is not None and "config.json" not in files:
        return "absent", "on the hub, but with no config.json: not a transformers model"
    return None
