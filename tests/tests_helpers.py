"""Helpers importable from tests (conftest holds fixtures)."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest

SHARED_EVAL = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "eval"


def shared_eval_rows(name: str) -> list[dict]:
    """Rows of a ../shared/data/eval benchmark file, or skip the test saying why."""
    path = SHARED_EVAL / name
    if not path.exists():
        pytest.skip(f"{path} is absent: the benchmark files live in ../shared beside the checkout")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def reasoner_on_two_processes(*args: str) -> list[str]:
    """The command line of `reasoner *args` on two torchrun processes (gloo on a CPU), on a free
    port: under pytest-xdist two such tests can run at once, and a fixed port would be taken by
    the first."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
            f"--master_port={port}", "-m", "reasoner", *map(str, args)]
