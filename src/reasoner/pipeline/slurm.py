"""`reasoner run RECIPE --launcher slurm`: one batch script for the whole recipe, submitted with
sbatch (docs/run.md, "On a Slurm cluster").

The script calls `reasoner run RECIPE --only STAGE` once per stage, so what runs is what
`reasoner run` decides from RUN_DIR/pipeline.json: a finished stage is skipped, an interrupted one
resumes, a changed one reruns; submitting the same script again continues the recipe. Each call
gets the launcher of its stage's placement (cluster.placement) as `--launch`: the script itself
in one of its modes (`bash SCRIPT train K ...`), which runs the stage's command line
(`reasoner <command> CONFIG`, given after it) on the allocation:

  train      srun, one torchrun per node (every device of the node), rendezvous at the first node
  ray_stage  a Ray cluster on every node (head on the first), the stage on it, then torn down;
             every Ray process of the job authenticates with the job's token (RUN_DIR)
  shard      infer without Ray: one process per node, node R writing `--shard R --num-shards N`

Other stages run on the first node, in or beside the `reasoner run` process as it decides.
Before any stage, every node checks that it sees the run folder the first node writes in.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

from reasoner import __version__
from reasoner.errors import InputError
from reasoner.pipeline import cluster
from reasoner.pipeline.cluster import Allocation
from reasoner.pipeline.plan import NPU_KINDS
from reasoner.pipeline.recipe import RecipeConfig
from reasoner.pipeline.resolve import StageRun

MODES = {"train": "train", "ray": "ray_stage", "shard": "shard"}  # placement -> script mode

HELPERS = r"""
on_every_node() {  # CMD...: CMD once on each node of the allocation, with all its CPUs
    srun --nodes="$NNODES" --ntasks-per-node=1 --cpus-per-task="$SLURM_CPUS_ON_NODE" \
        --kill-on-bad-exit=1 "$@"
}

torchrun_on_every_node() {  # PORT PROCS ARGS...: one torchrun per node, PROCS processes each
    local port=$1 procs=$2
    shift 2
    on_every_node "$PY" -m torch.distributed.run --nnodes="$NNODES" --nproc-per-node="$procs" \
        --rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:$port" --rdzv-id="$SLURM_JOB_ID-$port" \
        "$@"
}

train() {  # K reasoner STAGE CONFIG: the trainer on every device of every node
    local port=$((MASTER_PORT + $1))
    shift
    torchrun_on_every_node "$port" "$PER_NODE" -m "$@"
}

shard() {  # reasoner infer CONFIG: one process per node, node R writing shard R of N
    # shellcheck disable=SC2016  # SLURM_NODEID and SLURM_NNODES are each node's, expanded there
    on_every_node bash -c '"$0" -m "$@" --shard "$SLURM_NODEID" --num-shards "$SLURM_NNODES"' \
        "$PY" "$@"
}

ray_head_ip() {  # this node's address for the Ray head: one the other nodes can reach
    # Not `hostname --ip-address`: that is what /etc/hosts maps the name to, 127.0.1.1 on
    # Debian and Ubuntu, an IPv6 address first elsewhere. The interfaces' own addresses, IPv4
    # first; never loopback or link-local (fe80::, meaningless on another node).
    local ip v6=""
    for ip in $(hostname --all-ip-addresses 2>/dev/null || true); do
        case $ip in
            127.* | ::1 | [Ff][Ee]80:*) ;;
            *:*) v6=${v6:-$ip} ;;
            *) echo "$ip"; return 0 ;;
        esac
    done
    if [[ -n $v6 ]]; then
        echo "$v6"
        return 0
    fi
    echo "reasoner: this node ($(hostname)) has no address the other nodes can reach for" \
        "the Ray head: \`hostname --all-ip-addresses\` lists none but loopback or link-local" \
        "ones. Run the job on nodes with a network interface up (see \`ip addr\` on the node)," \
        "or run this stage without Ray (ray.workers: 0)." >&2
    return 1
}

ray_token() {  # the job's Ray token: its file, made once per job, readable by the user only
    # Ray turns token authentication on by itself (2.60: `ray start --head` when it finds
    # ~/.ray/auth_token, which a local `ray.init()` writes; 2.61: always), but a process that
    # joins at an address has no token unless told, and home folders may differ between nodes:
    # so one token for every Ray process of the job, in the run folder every node sees. Ray
    # before 2.52 knows neither variable and runs without authentication, as it always did.
    local path=$RUN_DIR/ray-token-$SLURM_JOB_ID
    if [[ ! -s $path ]]; then  # 32 random bytes in hex, as `ray get-auth-token --generate`
        rm -f "$path"  # an empty one left behind would keep its mode
        (umask 077 && od -An -N32 -tx1 /dev/urandom | tr -d ' \n' >"$path") || return 1
    fi
    echo "$path"
}

ray_stage() {  # K reasoner STAGE CONFIG: a Ray cluster on every node for the stage's engines
    local port=$((MASTER_PORT + $1)) head_ip address log head workers="" rc=0
    shift
    head_ip=$(ray_head_ip) || return 1
    # the head, the other nodes' `ray start` (srun passes the environment) and the stage
    RAY_AUTH_TOKEN_PATH=$(ray_token) || return 1
    export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH
    unset RAY_AUTH_TOKEN  # it would come before the file
    address=$head_ip:$port
    if [[ $head_ip == *:* ]]; then  # IPv6: bracketed where a port follows
        address=[$head_ip]:$port
    fi
    log=$RUN_DIR/ray-head-$SLURM_JOB_ID-$port.log
    "$PY" -m ray.scripts.scripts start --head --block --node-ip-address="$head_ip" \
        --port="$port" --include-dashboard=false "${RAY_RESOURCES[@]}" >"$log" 2>&1 &
    head=$!
    until grep -q "Ray runtime started" "$log"; do
        if ! kill -0 "$head" 2>/dev/null || ((SECONDS > RAY_START_S)); then
            echo "the Ray head did not start (log: $log):" >&2
            cat "$log" >&2
            kill "$head" 2>/dev/null || true
            return 1
        fi
        sleep 1
    done
    if ((NNODES > 1)); then
        srun --nodes=$((NNODES - 1)) --ntasks-per-node=1 --cpus-per-task="$SLURM_CPUS_ON_NODE" \
            --exclude="$MASTER_ADDR" --overlap \
            "$PY" -m ray.scripts.scripts start --block --address="$address" \
            "${RAY_RESOURCES[@]}" &
        workers=$!
    fi
    RAY_ADDRESS="$address" "$PY" -m "$@" || rc=$?
    # `ray start --block` takes its processes down with it (and srun its tasks' on each node)
    if [[ -n $workers ]]; then
        kill "$workers"
        wait "$workers" || true
    fi
    kill "$head"
    wait "$head" || true
    return "$rc"
}
"""


def script_path(recipe: RecipeConfig, recipe_path: Path) -> Path:
    """RUN_DIR/<recipe name>.sbatch, beside pipeline.json."""
    return Path(recipe.run_dir).absolute() / f"{recipe_path.stem}.sbatch"


def _header(recipe: RecipeConfig, recipe_path: Path, alloc: Allocation, command: str) -> list[str]:
    run_dir = Path(recipe.run_dir).absolute()
    lines = ["#!/bin/bash",
             f"#SBATCH --job-name=reasoner-{run_dir.name}",
             f"#SBATCH --nodes={alloc.nodes}",
             "#SBATCH --ntasks-per-node=1",
             "#SBATCH --exclusive"]
    if alloc.kind not in (*NPU_KINDS, "cpu"):
        lines.append(f"#SBATCH --gpus-per-node={alloc.per_node}")
    lines.append(f"#SBATCH --output={run_dir}/slurm-%j.out")
    lines += [f"#SBATCH {option}" for option in recipe.cluster.sbatch]
    return lines + [
        "#",
        f"# Written by reasoner {__version__}: {command}",
        f"# for {alloc.describe()}. Submit it again (sbatch {script_path(recipe, recipe_path)})",
        "# to continue the recipe: each stage runs through `reasoner run --only STAGE`, which",
        "# skips a stage finished with this recipe and resumes an interrupted one.",
        "# `bash THIS_SCRIPT train | shard | ray_stage ...` are the launchers those calls get.",
    ]


def _settings(recipe: RecipeConfig, recipe_path: Path, overrides: list[str],
              alloc: Allocation) -> list[str]:
    if alloc.kind in NPU_KINDS:  # Ray's name for Ascend devices (infer/raygen.py reserves it)
        resources = shlex.quote(f'{{"NPU": {alloc.per_node}}}')
        ray = f"RAY_RESOURCES=(--resources={resources})"
    else:
        ray = f"RAY_RESOURCES=(--num-gpus={0 if alloc.kind == 'cpu' else alloc.per_node})"
    lines = ["set -euo pipefail",
             f"cd {shlex.quote(str(Path.cwd()))}",
             "",
             f"PY={shlex.quote(sys.executable)}",
             f"SCRIPT={shlex.quote(str(script_path(recipe, recipe_path)))}",
             f"RECIPE={shlex.quote(str(recipe_path.absolute()))}",
             f"RUN_DIR={shlex.quote(str(Path(recipe.run_dir).absolute()))}",
             f"ARGS=({' '.join(shlex.quote(o) for o in overrides)})  # the recipe's overrides",
             f"PER_NODE={alloc.per_node}  # processes per node: its {alloc.kind} devices",
             ray,
             "RAY_START_S=300  # how long the Ray head may take to start"]
    if recipe.cluster.env:
        lines += ["", "# every node's environment (the recipe's cluster.env): srun passes it on"]
        lines += [f"export {k}={shlex.quote(v)}" for k, v in recipe.cluster.env.items()]
    return lines + [
        "",
        'NODES=$(scontrol show hostnames "$SLURM_JOB_NODELIST")',
        'MASTER_ADDR=$(head -n 1 <<<"$NODES")',
        "MASTER_PORT=${MASTER_PORT:-$((20000 + SLURM_JOB_ID % 20000))}  # + K for stage K",
        "NNODES=$SLURM_JOB_NUM_NODES",
        "export MASTER_ADDR MASTER_PORT",
    ]


def stage_line(stage: StageRun, index: int, alloc: Allocation) -> str:
    """The script's line for one stage: `stage NAME [--launch PREFIX]  # where it runs`."""
    place = cluster.placement(stage)
    if place == "first":
        return f"stage {shlex.quote(stage.name)}  # {stage.command}: {cluster.where(stage, alloc)}"
    launch = f"bash $SCRIPT {MODES[place]}"
    if place in ("train", "ray"):
        launch += f" {index + 1}"  # its rendezvous / Ray port: MASTER_PORT + K
    if place == "train" and alloc.kind in NPU_KINDS:
        launch = f"env HCCL_EXEC_TIMEOUT={cluster.hccl_timeout_s(stage)} {launch}"
    return (f'stage {shlex.quote(stage.name)} --launch "{launch}"  # {stage.command}: '
            f"{cluster.where(stage, alloc)}")


def write_script(recipe: RecipeConfig, recipe_path: Path, overrides: list[str],
                 stages: list[StageRun], alloc: Allocation, command: str,
                 until: str | None = None, spread: list[str] = ()) -> Path:
    """Write the batch script of these stages (in recipe order) and return its path; `spread`:
    the overrides (among `overrides`) that cluster.spread added."""
    body = _header(recipe, recipe_path, alloc, command)
    if spread:
        body += ["# generation spread over the allocation (cluster.spread; false leaves the "
                 "stages as", f"# their configs say): {' '.join(spread)}"]
    body += _settings(recipe, recipe_path, overrides, alloc)
    body += HELPERS.splitlines()
    body += ["",
             'case ${1:-} in  # `bash $SCRIPT MODE ...`: one stage\'s launcher, called by reasoner',
             '    train | shard | ray_stage) "$@"; exit ;;',
             "esac",
             "",
             'echo "reasoner: job $SLURM_JOB_ID, $NNODES node(s): ${NODES//$\'\\n\'/ };'
             ' master $MASTER_ADDR:$MASTER_PORT"',
             "# every node must see the run folder the first node writes in (checkpoints, shards",
             "# and final models are written there by all of them)",
             'torchrun_on_every_node "$MASTER_PORT" 1 -m reasoner check-folder "$RUN_DIR"',
             ""]
    if any(cluster.placement(s) == "ray" for s in stages):
        body += ["# the Ray stages' head needs an address the other nodes reach: refused now, not",
                 "# after the stages before them; and the job's Ray token, which they all share",
                 "ray_head_ip >/dev/null", "ray_token >/dev/null", ""]
    body += ["stage() {  # NAME [--launch PREFIX]: one stage, skipped or resumed as reasoner run "
             "decides",
             '    "$PY" -m reasoner run "$RECIPE" "${ARGS[@]}" --no-plan --only "$@"',
             "}",
             ""]
    body += [stage_line(s, i, alloc) for i, s in enumerate(stages)]
    last = f" --until {shlex.quote(until)}" if until else ""
    body += ["", f'"$PY" -m reasoner run "$RECIPE" "${{ARGS[@]}}" --dry-run{last}'
                 "  # every stage: skip, finished"]
    path = script_path(recipe, recipe_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(body) + "\n")
    path.chmod(0o755)
    return path


def submit(path: Path) -> str:
    """sbatch the script; return the job id."""
    try:
        done = subprocess.run(["sbatch", "--parsable", str(path)], capture_output=True,
                              text=True, check=False)
    except FileNotFoundError:
        raise InputError(f"sbatch was not found (no Slurm here); the script is written: {path} "
                         "(submit it where Slurm runs, or use --print-only)") from None
    if done.returncode != 0:
        raise InputError(f"sbatch {path} failed (exit {done.returncode}): "
                         f"{(done.stderr or done.stdout).strip()}")
    return done.stdout.strip().split(";")[0]
