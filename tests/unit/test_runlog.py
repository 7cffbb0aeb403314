"""What a run reports while it runs: metrics.jsonl and its sinks, progress in a log."""

import io
import json
import subprocess
import sys
import time
import types

import pytest

from reasoner import runlog
from reasoner.errors import DependencyError


def test_metrics_file_restarts_on_a_fresh_run_and_truncates_on_resume(tmp_path):
    path = tmp_path / "metrics.jsonl"
    log = runlog.MetricsLog(path, [], {}, enabled=True)
    for step in range(1, 6):
        log.log(step, {"loss": float(step)})
    log.truncate_after(3)  # resumed from checkpoint-3: steps 4 and 5 will be logged again
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [1, 2, 3]
    log.reset()  # started again from step 0: none of the dead run's rows remain
    log.log(1, {"loss": 9.0})
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    assert [(r["step"], r["loss"]) for r in rows] == [(1, 9.0)]


def test_the_run_log_and_progress_bar_load_without_torch():
    """infer and verify show progress through runlog; it must not pull in the training stack."""
    code = "import sys, reasoner.runlog; print(sorted(m for m in ('torch', 'reasoner.training') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_every_metrics_row_says_when_it_was_logged(tmp_path):
    log = runlog.MetricsLog(tmp_path / "metrics.jsonl", [], {}, enabled=True)
    before = time.time()
    log.log(1, {"loss": 0.5})
    row = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert row["step"] == 1 and before - 1 <= row["time"] <= time.time() + 1


def test_wandb_gets_the_project_the_run_name_and_the_summary(tmp_path, monkeypatch):
    calls = {}

    class Run:
        summary = {}

        def log(self, metrics, step):
            calls.setdefault("log", []).append((step, metrics))

        def finish(self):
            calls["finished"] = True

    fake = types.ModuleType("wandb")
    fake.init = lambda **kw: calls.setdefault("init", []).append(kw) or Run()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.setattr(runlog, "check_sinks", lambda sinks: None)
    log = runlog.MetricsLog(tmp_path / "rl" / "metrics.jsonl", ["wandb"], {"a": 1}, True,
                            project="math-rl")
    runlog.MetricsLog(tmp_path / "rl" / "m.jsonl", ["wandb"], {}, True, name="round-2")
    (first, second) = calls["init"]
    assert (first["project"], first["name"], first["config"]) == ("math-rl", "rl", {"a": 1})
    assert (second["project"], second["name"]) == ("reasoner", "round-2")
    log.log(3, {"loss": 0.25})
    log.summary({"final_loss": -0.5, "objective": "pcl", "complete": True, "steps": 10})
    assert calls["log"] == [(3, {"loss": 0.25})]
    assert Run.summary == {"final_loss": -0.5, "steps": 10}  # numbers only
    log.close()
    assert calls["finished"]


def test_a_missing_sink_is_named_before_any_work():
    if __import__("importlib").util.find_spec("wandb") is not None:
        pytest.skip("wandb is installed here")
    with pytest.raises(DependencyError, match=r"wandb is not installed: pip install "
                                              r"'reasoner\[tracking\]', or drop it"):
        runlog.check_sinks(["wandb"])
    runlog.check_sinks([])


def test_in_a_log_progress_is_a_plain_line_every_interval_and_one_at_the_end():
    now = [0.0]
    stream = io.StringIO()
    with runlog.PlainProgress(every_s=30, stream=stream, clock=lambda: now[0]) as bar:
        task = bar.add_task("sft", total=100, info="")
        for _ in range(100):
            now[0] += 1.0  # one step a second
            bar.update(task, advance=1, info="loss 0.5")
    lines = stream.getvalue().splitlines()
    assert lines == [
        "[progress] sft 30/100 (30.0%) 1.00/s elapsed 0:30 ETA 1:10 loss 0.5",
        "[progress] sft 60/100 (60.0%) 1.00/s elapsed 1:00 ETA 0:40 loss 0.5",
        "[progress] sft 90/100 (90.0%) 1.00/s elapsed 1:30 ETA 0:10 loss 0.5",
        "[progress] sft 100/100 (100.0%) 1.00/s elapsed 1:40 ETA 0:00 loss 0.5"]


def test_progress_picks_plain_lines_when_stderr_is_no_terminal():
    code = ("import reasoner.runlog as r; b = r.progress_bar(True); print(type(b).__name__); "
            "print(type(r.progress_bar(False)).__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["PlainProgress", "Progress"]


def test_the_eta_counts_from_the_first_unit_done_not_from_a_slow_start():
    """Generation finishes nothing while its first batch decodes, then a steady stream: the
    rate since the start (0.91/s) said 12:46 left where 1:10 was (issue 51: infer's ETA went from 36
    minutes to done in 35 s). No ETA until 5% is done after the first unit."""
    now = [0.0]
    stream = io.StringIO()
    with runlog.PlainProgress(every_s=30, stream=stream, clock=lambda: now[0]) as bar:
        task = bar.add_task("infer", total=1000, info="")
        now[0] = 300.0  # the first completion, after the pipeline filled
        bar.update(task, advance=1)
        for _ in range(999):
            now[0] += 0.1  # then ten a second
            bar.update(task, advance=1)
    lines = stream.getvalue().splitlines()
    assert lines[0] == "[progress] infer 1/1000 (0.1%) 0.00/s elapsed 5:00 ETA after more are done"
    assert lines[1] == "[progress] infer 301/1000 (30.1%) 10.00/s elapsed 5:30 ETA 1:09"
    assert lines[-1].endswith("ETA 0:00")
