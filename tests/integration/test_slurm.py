"""`reasoner run RECIPE --launcher slurm` end to end on this machine: the batch script it writes
is run by stand-in `sbatch` / `srun` / `scontrol` commands (tests/slurm_standins.py) as a
one-node allocation of two processes, and must reach what `reasoner run` reaches: the same stage
statuses and counts, the same weights (the trainers on two torchrun processes, within 1e-5).
Submitted in two parts (the first `--until samples`), then once more: the second continues the
first, the third finds everything finished and runs nothing."""

import json
from pathlib import Path

import pytest
import torch
from conftest import QUICKSTART_CI_SCALE
from safetensors.torch import load_file
from slurm_standins import calls, install
from tests_helpers import reasoner

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "configs/quickstart/recipe.yaml"


def submit(monkeypatch, bin_dir: Path, run_dir: Path, *extra: str):
    for key, value in install(bin_dir).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    return reasoner("run", RECIPE, f"run_dir={run_dir}", *QUICKSTART_CI_SCALE, "--launcher",
                    "slurm", "--nodes", "1", "--devices-per-node", "2", "--kind", "cpu", *extra,
                    cwd=REPO)


def job_log(run_dir: Path, out) -> str:
    job = out.stderr.split("submitted job ")[1].split()[0]
    log = (run_dir / f"slurm-{job}.out").read_text()
    rc = (run_dir / f"slurm-{job}.out.rc").read_text()
    assert rc == "0", log[-4000:]
    return log


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


@pytest.mark.slow
def test_the_slurm_script_reaches_what_reasoner_run_reaches(tmp_path, monkeypatch):
    plain, launched, bin_dir = tmp_path / "plain", tmp_path / "slurm", tmp_path / "bin"
    out = reasoner("run", RECIPE, f"run_dir={plain}", *QUICKSTART_CI_SCALE, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]

    first = submit(monkeypatch, bin_dir, launched, "--until", "samples")
    assert first.returncode == 0, first.stderr[-3000:]
    job_log(launched, first)
    second = submit(monkeypatch, bin_dir, launched)
    assert second.returncode == 0, second.stderr[-3000:]
    log = job_log(launched, second)
    for name in ("data", "tiny-init", "sft", "eval-sft", "samples"):  # the first job's
        assert f"[skip] {name}: finished with this config" in log

    states = [json.loads((d / "pipeline.json").read_text())["stages"] for d in (plain, launched)]
    assert list(states[0]) == list(states[1])
    for name, want in states[0].items():
        got = states[1][name]
        assert got["status"] == want["status"] == "done", name
        (got_n, got_rest), (want_n, want_rest) = counts(got), counts(want)
        assert got_n == pytest.approx(want_n, rel=1e-4) and got_rest == want_rest, name
    for model in ("sft/final", "rl/final"):
        a, b = weights(plain / model), weights(launched / model)
        assert a.keys() == b.keys()
        for key in a:
            torch.testing.assert_close(b[key], a[key], rtol=0, atol=1e-5, msg=f"{model} {key}")

    # how the stages ran: trainers under torchrun (2 processes), infer as node shards
    launches = [c for c in calls(bin_dir) if c["cmd"] == "srun"]
    trainers = [c["args"] for c in launches if "torch.distributed.run" in c["args"]]
    assert any("--nproc-per-node=1" in a and "check-folder" in a for a in trainers)
    for stage in ("sft", "train-offline"):
        assert any("--nproc-per-node=2" in a and stage in a for a in trainers), stage
    assert any(a[0] == "bash" and "--shard" in a[2] and "infer" in a for a in
               (c["args"] for c in launches))

    # submitted again: every stage is skipped and nothing is written
    before = {p: p.stat().st_mtime_ns for p in launched.rglob("*") if "/configs/" not in str(p)
              and p.suffix not in (".out", ".rc") and p.name != "pipeline.json"}
    third = submit(monkeypatch, bin_dir, launched)
    log = job_log(launched, third)
    assert all(f"[skip] {name}: finished with this config" in log for name in states[0])
    assert "[run]" not in log and "[resume]" not in log
    assert {p: p.stat().st_mtime_ns for p in before} == before


def counts(record: dict) -> tuple[dict, dict]:
    """A stage's numbers in pipeline.json (its headline's: samples, problems, verdicts, steps,
    loss, pass@1), less the times and the process count, which differ by design: (the floats,
    to compare to rounding; everything else, to compare exactly)."""
    kept = {k: v for k, v in (record["metrics"] or {}).items() if not isinstance(v, str)
            and "second" not in k and "per_s" not in k and k != "processes"}
    floats = {k: v for k, v in kept.items() if isinstance(v, float)}
    return floats, {k: v for k, v in kept.items() if k not in floats}
