"""Helpers importable from tests (conftest holds fixtures)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

SHARED_EVAL = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "eval"


def shared_eval_rows(name: str) -> list[dict]:
    """Rows of a ../shared/data/eval benchmark file, or skip the test saying why."""
    path = SHARED_EVAL / name
    if not path.exists():
        pytest.skip(f"{path} is absent: the benchmark files live in ../shared beside the checkout")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
