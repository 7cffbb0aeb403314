"""`reasoner run RECIPE --launcher slurm` end to end on this machine: the batch script it writes
is run by stand-in `sbatch` / `srun` / `scontrol` commands (tests/slurm_standins.py) as a
one-node allocation of two processes, and must reach what `reasoner run` reaches: the same stage
statuses and counts, the same weights within 1e-5. The plain run trains on two torchrun
processes too (the recipe's `launcher:`): one process and two differ by rounding, which the
quickstart's 100 SFT steps at lr 2e-3 grow to 1.5e-5 in sft/final and 8.5e-5 in rl/final
(measured; the 1-vs-2-process equality itself is held over a few steps by the trainers' tests).
Submitted in two parts (the first `--until samples`), then once more: the second continues the
first, the third resumes the one stage left interrupted and skips the others. Last, the sampling
stage again on Ray actors: a Ray cluster started on the allocation for it, every Ray process
with the job's token, writes the same samples."""

import json
import os
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import QUICKSTART_CI_SCALE
from safetensors.torch import load_file
from slurm_standins import calls, install
from tests_helpers import reasoner, why

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "configs/quickstart/recipe.yaml"
TWO_PROCESSES = "torchrun --standalone --nproc-per-node 2 --no-python"


def two_process_recipe(folder: Path) -> Path:
    """The quickstart recipe with its trainers on two torchrun processes (`launcher:`), which
    `reasoner run` uses and the Slurm script replaces by its own srun + torchrun."""
    raw = yaml.safe_load(QUICKSTART.read_text())
    for stage in raw["stages"]:
        if stage.get("config"):
            stage["config"] = str(QUICKSTART.parent / stage["config"])
        if stage["command"] in ("sft", "train-offline"):
            stage["launcher"] = TWO_PROCESSES
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def submit(monkeypatch, bin_dir: Path, recipe: Path, run_dir: Path, *extra: str):
    for key, value in install(bin_dir).items():
        monkeypatch.setenv(key, value)
    return reasoner("run", recipe, f"run_dir={run_dir}", *QUICKSTART_CI_SCALE, "--launcher",
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
    recipe = two_process_recipe(tmp_path)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # one torch thread a process, as under xdist
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    first = submit(monkeypatch, bin_dir, recipe, launched, "--until", "samples")
    assert first.returncode == 0, first.stderr[-3000:]
    job_log(launched, first)
    out = reasoner("run", recipe, f"run_dir={plain}", *QUICKSTART_CI_SCALE, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    second = submit(monkeypatch, bin_dir, recipe, launched)
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
    # one task per node with every CPU of the node (a step's task gets one CPU otherwise)
    assert all(c["opts"]["--ntasks-per-node"] == "1" and c["opts"]["--cpus-per-task"] == "2"
               for c in launches)
    trainers = [c["args"] for c in launches if "torch.distributed.run" in c["args"]]
    assert any("--nproc-per-node=1" in a and "check-folder" in a for a in trainers)
    for stage in ("sft", "train-offline"):
        assert any("--nproc-per-node=2" in a and stage in a for a in trainers), stage
    assert any(a[0] == "bash" and "--shard" in a[2] and "infer" in a for a in
               (c["args"] for c in launches))

    # submitted again after the job ended inside its last stage: that stage resumes, every
    # other one is skipped and nothing of theirs is written
    state = json.loads((launched / "pipeline.json").read_text())
    state["stages"]["compare"]["status"] = "running"
    (launched / "pipeline.json").write_text(json.dumps(state))
    mine = ("pipeline.json", "compare.yaml", "compare")  # what the resumed stage writes
    before = {p: p.stat().st_mtime_ns for p in launched.rglob("*") if p.is_file()
              and p.suffix not in (".out", ".rc", ".sbatch") and not set(mine) & {p.name, *p.parts}}
    script = (launched / "recipe.sbatch").read_text()
    third = submit(monkeypatch, bin_dir, recipe, launched)
    assert (launched / "recipe.sbatch").read_text() == script  # written again, the same
    log = job_log(launched, third)
    assert all(f"[skip] {name}: finished with this config" in log
               for name in states[0] if name != "compare")
    assert "[resume] compare: interrupted last time" in log
    assert "[run]" not in log and "[rerun]" not in log
    assert {p: p.stat().st_mtime_ns for p in before} == before
    assert json.loads((launched / "pipeline.json").read_text())["stages"]["compare"][
        "status"] == "done"

    # sampling on Ray actors (`ray.workers`): a Ray cluster started on the allocation for the
    # stage, joined through RAY_ADDRESS, taken down after it; the same samples as one process.
    # ray.workers is no part of the samples' identity: with the folder there, `reasoner run`
    # would keep it as it is ([keep]); removed, the stage samples again
    import shutil

    shutil.rmtree(launched / "samples")
    ray = submit(monkeypatch, bin_dir, recipe, launched, "samples.ray.workers=2", "--only",
                 "samples")
    log = job_log(launched, ray)
    assert "[rerun] samples: config changed" in log and "Connecting to existing Ray cluster" in log
    assert list(launched.glob("ray-head-*.log"))
    # with the job's token, made by the one job with a Ray stage (without it the head took the
    # one a local ray.init() had left in ~/.ray/auth_token, the rest none: InvalidAuthToken)
    token, = launched.glob("ray-token-*")
    assert token.stat().st_mode & 0o777 == 0o600
    want, got = rows(plain / "samples"), rows(launched / "samples")
    assert got.keys() == want.keys() and len(got) == states[0]["samples"]["metrics"]["samples"]
    for key, row in want.items():
        same = {"logprobs": None, "model": None}  # the model: each run folder's sft/final
        assert {**got[key], **same} == {**row, **same}
        assert got[key]["logprobs"] == pytest.approx(row["logprobs"], abs=1e-5)


def rows(folder: Path) -> dict:
    from reasoner import shards

    return {(r["id"], r["sample_idx"]): r for r in shards.iter_rows(folder)}


def counts(record: dict) -> tuple[dict, dict]:
    """A stage's numbers in pipeline.json (its headline's: samples, problems, verdicts, steps,
    loss, pass@1), less the times and the process count, which differ by design: (the floats,
    to compare to rounding; everything else, to compare exactly)."""
    kept = {k: v for k, v in (record["metrics"] or {}).items() if not isinstance(v, str)
            and "second" not in k and "per_s" not in k and k != "processes"}
    floats = {k: v for k, v in kept.items() if isinstance(v, float)}
    return floats, {k: v for k, v in kept.items() if k not in floats}


def test_an_allocation_too_small_is_refused_before_submission(tmp_path, monkeypatch):
    """The devices per node and their kind read from sinfo's GRES (h100: 79.65 GiB, as
    nvidia-smi reports it), the plan's numbers in the refusal, and sbatch never called; 8 nodes
    pass and are submitted."""
    bin_dir = tmp_path / "bin"
    for key, value in install(bin_dir).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("SINFO_GRES", "gpu:h100:8(S:0-1)")
    pcl = REPO / "configs/pcl_reasoner_v1_5/recipe.yaml"
    out = reasoner("run", pcl, f"run_dir={tmp_path / 'run'}", "--launcher", "slurm", "--nodes",
                   "1", "--partition", "gpu", cwd=REPO)
    assert out.returncode == 2
    said = " ".join(out.stderr.split())
    assert "the allocation (1 node(s) x 8 h100 x 79.65 GiB) cannot run this recipe" in said
    assert "stage sft: needs 108.5 GiB per device on 8 devices, has 79.6" in said
    assert "stage train-offline: needs 100.4 GiB per device on 8 devices, has 79.6" in said
    assert calls(bin_dir) == [{"cmd": "sinfo", "args": ["--noheader", "--Node", "--format=%G",
                                                        "--partition", "gpu"]}]  # no sbatch
    assert not (tmp_path / "run" / "recipe.sbatch").exists()
    out = reasoner("run", pcl, f"run_dir={tmp_path / 'run'}", "--launcher", "slurm", "--nodes",
                   "8", "--partition", "gpu", "--print-only", cwd=REPO)
    assert out.returncode == 0, out.stderr
    script = (tmp_path / "run" / "recipe.sbatch").read_text()
    assert "#SBATCH --partition=gpu" in script and "#SBATCH --gpus-per-node=8" in script
    assert not any(c["cmd"] == "sbatch" for c in calls(bin_dir))  # --print-only


@pytest.mark.slow
def test_every_node_checks_the_run_folder(tmp_path):
    """The script's first step, `reasoner check-folder` under torchrun: two processes that see
    the folder say so; the check itself (folders that differ) is tests/unit/test_device.py's."""
    import subprocess

    from tests_helpers import SUBPROCESS_ENV, reasoner_on_two_processes

    done = subprocess.run(reasoner_on_two_processes("check-folder", tmp_path / "run"),
                          capture_output=True, text=True, env=SUBPROCESS_ENV, timeout=300)
    assert done.returncode == 0, why(done)
    assert f"all 2 processes see {tmp_path / 'run'}" in " ".join(done.stdout.split())


@pytest.mark.parametrize("args, message", [
    (["--launch", "bash x"], "--launch runs one stage under a prefix: give --only STAGE with it"),
    (["--launcher", "slurm", "--from", "sft"], "--launcher slurm takes --until / --only"),
    (["--launcher", "slurm", "--nodes", "1", "--kind", "gpu", "--devices-per-node", "8"],
     "the memory of one gpu device is not known here: give --device-mem-gib"),
    (["--launcher", "slurm", "--only", "sft", "--kind", "cpu", "--devices-per-node", "2"],
     "--only sft: the stages before it are not finished with this recipe (data, tiny-init)"),
])
def test_launch_options_that_cannot_work_are_one_paragraph(tmp_path, args, message):
    out = reasoner("run", QUICKSTART, f"run_dir={tmp_path / 'run'}", *args, cwd=REPO)
    assert out.returncode == 2 and message in " ".join(out.stderr.split()), out.stderr
    assert not (tmp_path / "run" / "recipe.sbatch").exists()


def test_generation_judge_and_eval_stages_spread_over_the_allocation(tmp_path, monkeypatch):
    """Issue 51, finding 14: the PCL script ran the 32B judge and both AIME evals on the first
    of 8 nodes (7 idle) unless `ray.workers` was overridden, and said nothing. Now each engine
    that sets no ray.workers gets the actors the allocation holds, in the script's overrides,
    and the summary says where each stage runs; cluster.spread=false keeps the configs' way,
    with a warning for each stage that leaves devices idle."""
    bin_dir = tmp_path / "bin"
    for key, value in install(bin_dir).items():
        monkeypatch.setenv(key, value)
    pcl = REPO / "configs/pcl_reasoner_v1_5/recipe.yaml"
    run_dir = tmp_path / "run"
    gpus = ["--launcher", "slurm", "--nodes", "8", "--devices-per-node", "8", "--kind", "h100",
            "--print-only"]
    out = reasoner("run", pcl, f"run_dir={run_dir}", *gpus, cwd=REPO)
    assert out.returncode == 0, out.stderr
    script = (run_dir / "recipe.sbatch").read_text()
    by = {line.split()[1]: line for line in script.splitlines() if line.startswith("stage ")}
    for name in ("verify", "aime24", "aime25"):
        assert '--launch "bash $SCRIPT ray_stage' in by[name], by[name]
    assert '--launch "bash $SCRIPT shard"' in by["samples"]  # one TP-8 engine per node already
    assert (f"ARGS=(run_dir={run_dir} verify.judge.ray.workers=8 aime24.ray.workers=8 "
            "aime25.ray.workers=8)") in script
    said = out.stderr
    assert ("[slurm] verify (verify): its engines on a Ray cluster of every node: 8 judge "
            "actor(s) of 8 device(s)") in said
    assert "[slurm] samples (infer): one shard per node, 8 in all" in said
    assert "[slurm] sft (sft): torchrun, 8 processes on each of 8 node(s)" in said
    assert "warning" not in said
    # as the configs say: a warning per stage that leaves devices idle, none of them spread
    out = reasoner("run", pcl, f"run_dir={run_dir}", "cluster.spread=false", *gpus, cwd=REPO)
    said = " ".join(out.stderr.split())
    assert out.returncode == 0 and "ray_stage" not in lines_of_stages(run_dir)
    assert ("[slurm] warning: aime24 (eval): on the first node only: the other 7 node(s) wait "
            "while it runs (set aime24.ray.workers, or cluster.spread=true, to spread it)") in said
    assert "[slurm] warning: verify (verify): on the first node only" in said
    # 4 Atlas A3 nodes of 16: a node holds two TP-8 engines, so sampling goes on Ray too
    out = reasoner("run", pcl, f"run_dir={run_dir}", "--launcher", "slurm", "--nodes", "4",
                   "--devices-per-node", "16", "--kind", "910b", "--print-only", cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert ("generation spread over the 4 nodes (cluster.spread): samples.ray.workers=8 "
            "verify.judge.ray.workers=8 aime24.ray.workers=8 aime25.ray.workers=8") in out.stderr


def lines_of_stages(run_dir: Path) -> str:
    """The `stage ...` lines of the script written last."""
    return "\n".join(line for line in (run_dir / "recipe.sbatch").read_text().splitlines()
                     if line.startswith("stage "))
