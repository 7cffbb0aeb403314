"""Benchmark sources: AIME 2024 / 2025 from the hub or local files, and any problem file.

The hub datasets name their fields differently; each source maps them to Problem rows
(`id`, `problem`, `answer`). Local files are mapped by what they contain: `problem`,
`prompt` (AIME files as the tests read them) or `question` (GSM8K, AMC), or by `--field ours=theirs`;
GSM8K's worked `answer` is cut to the number after `####`, Minerva's `solution` to its last
`\\boxed{}`.
"""

from __future__ import annotations

import json
from pathlib import Path

from reasoner import hub, shards
from reasoner.config import DataConfig
from reasoner.data import sources
from reasoner.errors import InputError
from reasoner.records import Problem

AIME = {
    "2024": [DataConfig(path="HuggingFaceH4/aime_2024", split="train")],
    "2025": [DataConfig(path="opencompass/AIME2025", subset="AIME2025-I", split="test",
                        fields={"problem": "question"}),
             DataConfig(path="opencompass/AIME2025", subset="AIME2025-II", split="test",
                        fields={"problem": "question"})],
}
AIME_NAMES = {"2024": "aime24", "2025": "aime25"}


def guess_fields(path: Path) -> dict[str, str]:
    """Field mapping for a local JSONL problem file (or shard folder), from its first row."""
    if path.is_dir():
        parts = shards.part_files(path)
        if not parts:
            return {}
        path = parts[0]
    if path.suffix != ".jsonl":
        return {}
    with open(path) as fh:
        first = json.loads(fh.readline() or "{}")
    if "problem" in first:
        return {}
    for name in ("prompt", "question"):
        if name in first:
            return {"problem": name}
    return {}


def local(path: str | Path, fields: dict[str, str] | None = None) -> DataConfig:
    """A benchmark given with --data: a file, a shard folder or an HF dataset id, its fields
    mapped by `fields` (--field) over the ones guessed from a JSONL file's first row; a path
    that is not there is one clear line."""
    why = hub.missing(str(path), "--data", "file or folder")
    if why:
        raise InputError(why)
    guessed = guess_fields(Path(path)) if Path(path).exists() else {}
    return DataConfig(path=str(path), fields={**guessed, **(fields or {})})


def field_mapping(given: list[str]) -> dict[str, str]:
    """`--field answer=gold` (repeatable) as a field mapping: our name -> the data's column."""
    mapping = {}
    for item in given:
        ours, sep, theirs = item.partition("=")
        if not sep or not ours.strip() or not theirs.strip():
            raise InputError(f"--field {item!r}: write it as OURS=THEIRS, e.g. --field "
                             "answer=gold (our field name, then the column of your data)")
        mapping[ours.strip()] = theirs.strip()
    return mapping


def load_problems(data: list[DataConfig]) -> list[dict]:
    """Problem rows from every source: the problem under its usual names (problem, prompt,
    question), GSM8K / Minerva answers reduced to final values, ids unique across sources."""
    rows = []
    for cfg in data:
        rows += sources.read_rows(cfg, Problem)
    return rows
