"""`scripts/staleness.py --report`: only finished arms reach the table (an arm runs most of an
hour, one invocation at a time; one stopped half-way must not be read as its checkpoints)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).parents[3] / "scripts" / "staleness.py"


def script():
    spec = importlib.util.spec_from_file_location("staleness", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def arm(out: Path, name: str, final: bool, evals: list[int]) -> None:
    (out / f"rl-{name}" / "checkpoint-100").mkdir(parents=True)
    if final:
        (out / f"rl-{name}" / "final").mkdir()
    for m in evals:
        (out / f"eval-{name}-{m}x").mkdir()
        (out / f"eval-{name}-{m}x" / "report.json").write_text("{}")


def test_an_arm_is_reported_only_with_its_run_finished_and_every_eval_written(tmp_path):
    arm(tmp_path, "pcl", final=True, evals=[1, 4, 16])
    arm(tmp_path, "oapl", final=False, evals=[])  # stopped at step 64
    arm(tmp_path, "dapo", final=True, evals=[1, 4])  # its 16x eval not written yet
    results, evals, skipped = script().finished(tmp_path, [1, 4, 16])
    assert results == {"pcl": tmp_path / "rl-pcl"}
    assert evals == {("pcl", m): tmp_path / f"eval-pcl-{m}x" for m in (1, 4, 16)}
    assert skipped == ["dapo", "oapl"]
