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


def test_the_plotted_curves_are_trailing_means():
    assert script().smoothed([1.0, 3.0, 5.0, 7.0], window=2) == [1.0, 2.0, 4.0, 6.0]
    assert script().smoothed([2.0, 4.0, 9.0], window=5) == [2.0, 3.0, 5.0]


def test_the_plot_draws_every_arm_of_every_seed(tmp_path):
    import json

    rows = [{"step": s, "lag_steps": s, "offpolicy_kl_k3": 0.01 * s, "offpolicy_chi2": 0.0,
             "offpolicy_ratio_outside": 0.0, "offpolicy_seq_ratio_std": 0.0} for s in range(1, 9)]
    arms = {}
    for name, seed, steps in (("pcl", 0, 2), ("pcl", 1, 4), ("dapo-tis", 0, 2)):
        folder = tmp_path / f"{name}-{seed}"
        folder.mkdir()
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        arms[name, seed] = (folder, steps)
    fig = script().plot(arms, [1, 4], tmp_path / "staleness.png", window=1)
    assert (tmp_path / "staleness.png").exists()
    lines = {line.get_label(): line for line in fig.axes[0].lines if not line.get_label()
             .startswith("_")}
    assert sorted(lines) == ["dapo-tis (seed 0)", "pcl (seed 0)", "pcl (seed 1)"]
    # the lag in multiples of each seed's N: 8 steps are 4 N at N = 2 and 2 N at N = 4
    assert list(lines["pcl (seed 0)"].get_xdata()) == [s / 2 for s in range(1, 9)]
    assert list(lines["pcl (seed 1)"].get_xdata()) == [s / 4 for s in range(1, 9)]
    assert lines["pcl (seed 0)"].get_linestyle() != lines["pcl (seed 1)"].get_linestyle()
    assert lines["pcl (seed 0)"].get_color() != lines["dapo-tis (seed 0)"].get_color()
