"""A stage's earlier outputs, kept beside it and brought back when the stage asks for one again.

When `reasoner run` replaces a stage's output (its config changed), the old folder is moved aside,
not deleted: to `<name>.previous`, the one before it on to `<name>.previous-2`, and so on, up to
the recipe's `keep_previous` copies and `previous_max_gib` GiB per stage (the oldest go first).
Each copy keeps its manifest, and in it the identity of what made it (outputs.Identity: the
config less the settings that do not change the result, and the identity of every input).

Before a stage runs, its identity is computed as the stage itself computes it. A complete copy
with that identity is moved back instead of recomputing, and the output it replaces is kept in
its turn (`sft.optim.lr=1e-3` tried, then dropped: the second run brings the first SFT back and
keeps the lr=1e-3 one). A current folder with that identity is kept as it is (only settings
outside the identity changed: ray.workers, progress bars, time-outs). `--from` and a stage's
`overwrite=true` always recompute; so does a stage whose own identity comes out otherwise than
computed here (an eval that takes its prompt template from the model's reasoner.json).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from reasoner import outputs, shards
from reasoner.config.stages import StageConfig
from reasoner.errors import ShardError
from reasoner.pipeline.registry import STAGES
from reasoner.pipeline.resolve import StageRun

SUFFIX = ".previous"


def identity(stage: StageRun, moved: dict[Path, Path] | None = None) -> str | None:
    """The identity digest the stage would record for its output (None: its kind records
    none). `moved`: stage output folders that will hold another folder's content by the time
    this stage runs (planned restores): their inputs are read from there."""
    if not STAGES[stage.command].identified or not isinstance(stage.config, StageConfig):
        return None
    found = {i.key: _input_identity(i.kind, i.value, moved or {}) for i in stage.config.inputs()}
    return outputs.Identity(stage.command, stage.config.result_config(), found).digest


def _input_identity(kind: str, value: str, moved: dict[Path, Path]) -> dict:
    path = Path(value)
    for out, source in moved.items():
        if path == out or out in path.parents:
            return {**outputs.input_identity(kind, str(source / path.relative_to(out))),
                    "path": value}
    return outputs.input_identity(kind, value)


def copies(out: Path) -> list[Path]:
    """The kept copies of a stage's output, newest first."""
    found = [p for p in out.parent.glob(out.name + SUFFIX + "*") if _slot_index(out, p) >= 0]
    return sorted(found, key=lambda p: _slot_index(out, p))


def _slot(out: Path, index: int) -> Path:
    """Slot 0 is `<name>.previous`, slot k `<name>.previous-<k+1>`."""
    return out.with_name(out.name + SUFFIX + (f"-{index + 1}" if index else ""))


def _slot_index(out: Path, path: Path) -> int:
    rest = path.name[len(out.name + SUFFIX):]
    if rest == "":
        return 0
    digits = rest[1:]
    return int(digits) - 1 if rest.startswith("-") and digits.isdigit() and int(digits) > 1 else -1


def matching(stage: StageRun, moved: dict[Path, Path] | None = None) -> Path | None:
    """The folder (the stage's own, or a kept copy) that already holds, complete, the output
    this stage would make; None when none does or the stage records no identity."""
    digest = identity(stage, moved)
    if digest is None or stage.config.overwrite:  # overwrite=true: redo it, as asked
        return None
    for folder in [stage.out, *copies(stage.out)]:
        manifest = shards.read_manifest(folder) if folder.is_dir() else None
        if manifest and manifest.get("complete") and manifest.get("identity") == digest:
            return folder
    return None


def mark(stages: list[StageRun], start: str | None) -> None:
    """Before anything runs: turn each run / rerun whose output is already there into "keep"
    (its own folder) or "restore" (a kept copy), saying so. A stage reading what a stage that
    really runs will write cannot be known yet: it is decided again when its turn comes."""
    if start is not None:  # --from: recompute, as asked
        return
    moved: dict[Path, Path] = {}
    changing: list[Path] = []
    for s in stages:
        if s.status not in ("run", "rerun"):
            if s.status == "resume":
                changing.append(s.out)
            continue
        reads = [Path(i.value) for i in s.config.inputs()] if isinstance(
            s.config, StageConfig) else []
        if any(p == out or out in p.parents for p in reads for out in changing):
            changing.append(s.out)
            continue
        found = matching(s, moved)
        if found is None:
            changing.append(s.out)
            continue
        label(s, found)
        if s.status == "restore":
            moved[s.out] = found


def label(stage: StageRun, found: Path) -> None:
    """Status and reason of a stage whose output is already in `found` (`matching`)."""
    if found == stage.out:
        stage.status = "keep"
        stage.reason += "; its output already has this identity (only settings outside it changed)"
    else:
        stage.status = "restore"
        stage.reason += f"; {found.name} has this identity: brought back"


def _size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def set_aside(out: Path, keep: int, max_gib: float | None, back: Path | None = None) -> str:
    """Move `out` to `<name>.previous` (the older copies one slot on), then, given `back` (a
    kept copy), move that copy into `out`. Copies past `keep`, or past `max_gib` in all
    (counted from the newest), are deleted. Returns what was done, for the log."""
    staging = out.with_name(out.name + ".restoring")
    if back is not None:
        if staging.exists():
            raise ShardError(f"{staging} is left from an interrupted restore of {out}: move it "
                             f"back to {out} (or delete it), then rerun")
        back.rename(staging)
    order = [out] if out.exists() else []
    order += [c for c in copies(out) if c != back]
    kept, total, said = [], 0, []
    for folder in order:
        size = _size(folder)
        over = max_gib is not None and (total + size) / 2**30 > max_gib
        if len(kept) >= keep or over:
            shutil.rmtree(folder)
            what = "the replaced output" if folder == out else folder.name
            said.append(f"deleted {what} ({size / 2**30:.2f} GiB: over "
                        + ("previous_max_gib" if over and len(kept) < keep else "keep_previous")
                        + ")")
            continue
        kept.append((folder, size))
        total += size
    # the order is kept: a copy moves down when copies before it went, up when `out` joined
    # the front. Down moves first, nearest slot first; then up moves, farthest first: each
    # move's slot has been left by then
    moves = [(src, i) for i, (src, _) in enumerate(kept) if src != _slot(out, i)]
    down = sorted((m for m in moves if m[0] != out and _slot_index(out, m[0]) > m[1]),
                  key=lambda m: m[1])
    up = sorted((m for m in moves if m not in down), key=lambda m: -m[1])
    for src, i in down + up:
        src.rename(_slot(out, i))
    if back is not None:
        staging.rename(out)
    if kept and kept[0][0] == out:
        said.insert(0, f"the replaced output is kept in {_slot(out, 0)} "
                       f"({kept[0][1] / 2**30:.2f} GiB)")
    said.append(f"{len(kept)} earlier output(s) of {out.name} kept, {total / 2**30:.2f} GiB "
                "(recipe keys keep_previous, previous_max_gib)")
    return "; ".join(said)
