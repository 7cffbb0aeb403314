"""What a recipe needs from outside itself, checked before its first stage runs.

Each stage reads inputs: a model, problems, an SFT set, a verified shard, a judge, a corpus.
Those another stage of the recipe writes (inside RUN_DIR/<stage>/) are the recipe's own; every
other one must exist now (a local path) or be a well-formed hub id, else `reasoner run` (and
`--dry-run`) stops before any work with the name of what is missing and how to make it.
"""

from __future__ import annotations

from pathlib import Path

from reasoner import hub
from reasoner.errors import ConfigError


def _made_here(value: str, outputs: list[Path]) -> bool:
    path = Path(value)
    return any(path == out or out in path.parents for out in outputs)


def missing_inputs(stages: list, run_dir: Path) -> list[str]:
    """One line per input that no stage makes and that cannot be had: `stage.key=value: why`.
    Each stage's config names its inputs (`inputs()`); compare's reports are its own stages'."""
    outputs = [s.out for s in stages] + [Path(run_dir) / "configs"]
    lines, seen = [], set()
    for stage in stages:
        if stage.command == "compare":
            continue
        for key, value, kind in ((i.key, i.value, i.kind) for i in stage.config.inputs()):
            if _made_here(value, outputs) or (key, value) in seen:
                continue  # made by a stage, or already reported for an earlier one
            seen.add((key, value))
            why = hub.missing(value, f"{stage.name}: {key}", kind)
            if why is None and kind == "file" and not Path(value).exists():
                why = f"{stage.name}: {key}={value}: no such file"
            if why:
                lines.append(why)
    return lines


def check(stages: list, run_dir: Path) -> None:
    """Stop before the first stage when an outside input is missing (see the module doc)."""
    lines = missing_inputs(stages, run_dir)
    if lines:
        raise ConfigError(
            "the recipe needs inputs that no stage of it makes and that are not there:\n  "
            + "\n  ".join(lines) + "\nmake them first (a model: `reasoner model import` or a "
            "hub id; problems: a .jsonl of id / problem / answer, or a hub dataset with "
            "data.fields and data.answer_from), or point the key at them: "
            "reasoner run RECIPE STAGE.key=value")
