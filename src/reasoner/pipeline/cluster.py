"""What a recipe needs of a cluster allocation, checked before anything is submitted.

`reasoner run RECIPE --launcher slurm` runs each stage on the nodes of one allocation (slurm.py
writes the batch script). This module says how each stage uses the nodes (`placement`): a trainer
runs under torchrun on every device of every node, a generation or judge stage on Ray actors
spread over every node (or, without Ray, infer as one shard per node), anything else on the
first node as `reasoner run` would run it there. On several nodes, the engines that set no
ray.workers get as many actors as the allocation holds (`spread`), unless cluster.spread is off. And it refuses, with the plan's numbers, a recipe
that needs more devices, or more memory per device, than the allocation has (`check`).
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from reasoner.device import HCCL_AIV_CAP_S, HCCL_CAP_S
from reasoner.errors import ConfigError, InputError
from reasoner.pipeline.plan import DEVICE_MEM_GIB, NPU_KINDS, PEAK_TFLOPS, plan_recipe
from reasoner.pipeline.recipe import RecipeConfig
from reasoner.pipeline.resolve import StageRun

TRAINERS = ("sft", "train-offline")


@dataclass(frozen=True)
class Allocation:
    """The nodes a job gets: how many, devices on each, their kind and memory (GiB each;
    None on CPU nodes, where the memory plan does not apply)."""

    nodes: int
    per_node: int
    kind: str
    mem_gib: float | None

    @property
    def devices(self) -> int:
        return self.nodes * self.per_node

    def describe(self) -> str:
        mem = f" x {self.mem_gib:.4g} GiB" if self.mem_gib else ""  # 79.65, 22.49, 80
        return f"{self.nodes} node(s) x {self.per_node} {self.kind}{mem}"


def allocation(nodes: int, per_node: int | None, kind: str | None, mem_gib: float | None,
               partition: str | None = None) -> Allocation:
    """The allocation from the command line's values, the rest read from `sinfo` (devices per
    node and their kind from the partition's GRES, e.g. `gpu:h100:8`)."""
    if nodes < 1 or (per_node is not None and per_node < 1):
        raise ConfigError("--nodes and --devices-per-node must be at least 1")
    if per_node is None or kind is None:
        found_kind, found_count = read_sinfo(partition)
        kind = kind or found_kind
        per_node = per_node or found_count
    if kind == "cpu":
        return Allocation(nodes, per_node, kind, None)
    mem = mem_gib or DEVICE_MEM_GIB.get(kind)  # GiB as the device reports it (plan.py)
    if mem is None:
        raise ConfigError(f"the memory of one {kind} device is not known here: give "
                          "--device-mem-gib in GiB as the device reports it (nvidia-smi's "
                          "memory.total / 1024: 79.65 for an H100; 64 for an Ascend 910B)")
    return Allocation(nodes, per_node, kind, mem)


def parse_gres(lines: str) -> tuple[str, int]:
    """(kind, devices per node) from sinfo's GRES column, one node per line: the smallest count
    over the nodes; the kind is the type (`h100` in `gpu:h100:8(S:0-1)`) when every node has the
    same one and this project knows it, else the family (`gpu`, `npu`)."""
    found = []
    for line in lines.split():
        m = re.match(r"(gpu|npu)(?::([A-Za-z0-9_.-]+))?:(\d+)", line.strip().lower())
        if m:
            found.append((m.group(1), m.group(2) or "", int(m.group(3))))
    if not found:
        raise ConfigError("sinfo lists no GPU or NPU on these nodes (GRES: "
                          f"{' '.join(lines.split()) or 'none'}): give --kind and "
                          "--devices-per-node (--kind cpu for CPU nodes)")
    names = {name for _, name, _ in found}
    name = names.pop() if len(names) == 1 else ""
    kind = name if name in PEAK_TFLOPS else found[0][0]
    return kind, min(n for _, _, n in found)


def read_sinfo(partition: str | None) -> tuple[str, int]:
    cmd = ["sinfo", "--noheader", "--Node", "--format=%G", *(["--partition", partition]
                                                               if partition else [])]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    except FileNotFoundError:
        raise InputError("sinfo was not found (no Slurm here): give --kind and "
                         "--devices-per-node (and --device-mem-gib)") from None
    except subprocess.CalledProcessError as exc:
        raise InputError(f"{' '.join(cmd)} failed: {exc.stderr.strip()}; give --kind and "
                         "--devices-per-node instead") from None
    return parse_gres(out)


# --------------------------------------------------------------------------------------------
# How each stage uses the nodes


def engines(stage: StageRun) -> list[tuple[str, int, int, float | None]]:
    """(config prefix, tensor-parallel size, Ray actors, devices per actor) of each generating
    engine the stage builds: infer's and eval's own, and the judge of verify or eval."""
    cfg, found = stage.config, []
    if stage.command in ("infer", "eval") and cfg.backend != "openai":
        found.append(("", cfg.vllm.tensor_parallel_size, cfg.ray.workers,
                      cfg.ray.gpus_per_worker))
    if stage.command in ("verify", "eval") and cfg.mode != "rule":
        judge = cfg.judge
        if judge.model is not None and judge.backend != "openai":
            found.append(("judge.", judge.vllm.tensor_parallel_size, judge.ray.workers,
                          judge.ray.gpus_per_worker))
    return found


def ray_workers(stage: StageRun) -> int:
    """Ray actors the stage's engines run on (its own, or its judge's); 0: no Ray."""
    return max((workers for _, _, workers, _ in engines(stage)), default=0)


def placement(stage: StageRun) -> str:
    """`train` (torchrun on every node), `ray` (a Ray cluster on every node for its engines),
    `shard` (infer without Ray: `--shard R --num-shards N`, one process per node) or `first`
    (on the first node, in or beside the `reasoner run` process, as run.own_process says)."""
    if stage.command in TRAINERS:
        return "train"
    if ray_workers(stage):
        return "ray"
    if stage.command == "infer" and stage.config.backend != "openai":
        return "shard"
    return "first"


def spread(stages: list[StageRun], alloc: Allocation) -> list[str]:
    """The overrides that put each generating engine of these stages that sets no ray.workers
    (infer's, eval's, a judge's) on Ray actors over the whole allocation, as many as its devices
    hold: `STAGE.ray.workers=N` (`STAGE.judge.ray.workers=N`), N = nodes x engines a node holds.
    None on one node, on CPU nodes (an actor holds no device there to place it by), nor for an
    infer whose node shards already give every device an engine (one engine per node)."""
    if alloc.nodes == 1 or alloc.kind == "cpu":
        return []
    found: dict[str, int] = {}
    for s in stages:
        for prefix, tp, workers, each in engines(s):
            per_engine = tp if each is None else each
            per_node = int(alloc.per_node // per_engine) if per_engine else 0
            if workers or per_node == 0:  # asked for; or over a node (device_problems says)
                continue
            if s.command == "infer" and not prefix and per_node == 1:
                continue
            found.setdefault(f"{s.spec.name}.{prefix}ray.workers", alloc.nodes * per_node)
    return [f"{key}={n}" for key, n in found.items()]


def where(stage: StageRun, alloc: Allocation) -> str:
    """Where the stage runs on the allocation, in words (the script's comments, the summary
    `reasoner run --launcher slurm` prints); a stage that leaves devices idle (`idles`) says
    so, and how to spread it."""
    place = placement(stage)
    if place == "train":
        return f"torchrun, {alloc.per_node} processes on each of {alloc.nodes} node(s)"
    if place == "ray":
        actors = " and ".join(f"{workers} {prefix.rstrip('.') + ' ' if prefix else ''}"
                              f"actor(s) of {tp if each is None else each:g} device(s)"
                              for prefix, tp, workers, each in engines(stage) if workers)
        return f"its engines on a Ray cluster of every node: {actors}"
    said = (f"one shard per node, {alloc.nodes} in all" if place == "shard" else
            "on the first node")
    if not idles(stage, alloc):
        return said
    keys = " / ".join(f"{stage.spec.name}.{prefix}ray.workers" for prefix, *_ in engines(stage))
    how = "" if alloc.kind == "cpu" else ", or cluster.spread=true,"
    if place == "shard":
        tp = engines(stage)[0][1]
        return (f"{said}, one engine of {tp} device(s) each: {alloc.per_node - tp} of each "
                f"node's {alloc.per_node} devices wait (set {keys}{how} to use them)")
    return (f"{said} only: the other {alloc.nodes - 1} node(s) wait while it runs (set "
            f"{keys}{how} to spread it)")


def idles(stage: StageRun, alloc: Allocation) -> bool:
    """The stage's engines leave devices of a several-node allocation idle: on the first node
    alone, or as node shards of one engine where a node holds more."""
    place = placement(stage)
    if alloc.nodes == 1 or not engines(stage):
        return False
    if place == "shard":  # on CPU nodes, --devices-per-node counts processes, not engines
        return alloc.kind != "cpu" and alloc.per_node // engines(stage)[0][1] > 1
    return place == "first"


def hccl_timeout_s(stage: StageRun) -> int:
    """HCCL_EXEC_TIMEOUT of a training stage: its run.dist_timeout_min (device.set_hccl_timeout)."""
    return int(round(stage.config.run.dist_timeout_min * 60))


def device_problems(stages: list[StageRun], alloc: Allocation, env: dict[str, str]) -> list[str]:
    """What the allocation's device counts cannot hold, one line per stage and reason."""
    lines = []
    for s in stages:
        if s.command in TRAINERS:
            sp = s.config.run.sequence_parallel
            if alloc.per_node % sp:
                lines.append(f"stage {s.name}: run.sequence_parallel={sp} groups consecutive "
                             f"processes within a node; {alloc.per_node} per node do not divide "
                             "into them")
            if alloc.kind in NPU_KINDS:
                aiv = env.get("HCCL_OP_EXPANSION_MODE", "").upper() == "AIV"
                cap = HCCL_AIV_CAP_S if aiv else HCCL_CAP_S
                if hccl_timeout_s(s) > cap:
                    lines.append(f"stage {s.name}: run.dist_timeout_min="
                                 f"{s.config.run.dist_timeout_min:g} is {hccl_timeout_s(s)} s, "
                                 f"above HCCL_EXEC_TIMEOUT's {cap} s cap: lower it")
            continue
        if alloc.kind == "cpu":
            continue
        for prefix, tp, workers, each in engines(s):
            if tp > alloc.per_node:
                lines.append(f"stage {s.name}: {prefix}vllm.tensor_parallel_size={tp} needs {tp} "
                             f"devices on one node; a node has {alloc.per_node}")
            need = workers * (tp if each is None else each)
            if need > alloc.devices:
                lines.append(f"stage {s.name}: {prefix}ray.workers={workers} engines of {tp} "
                             f"devices need {need:g} devices; the allocation has "
                             f"{alloc.devices} ({alloc.describe()})")
    return lines


def check(recipe_path: Path, overrides: list[str], recipe: RecipeConfig, stages: list[StageRun],
          alloc: Allocation) -> None:
    """Refuse, before anything is submitted, a recipe whose stages need more devices than the
    allocation has, or more memory per device than the plan finds (`reasoner plan`'s numbers)."""
    lines = device_problems([s for s in stages if s.works], alloc, recipe.cluster.env)
    if alloc.mem_gib is not None:
        running = {s.name for s in stages if s.works}
        for p in plan_recipe(recipe_path, alloc.devices, alloc.mem_gib, alloc.kind,
                             overrides=overrides):
            if p.name in running and not p.fits:
                lines.append(f"stage {p.name}: needs {p.need_gib:.1f} GiB per device on "
                             f"{p.devices} devices, has {p.have_gib:.1f}: {p.verdict}")
    if lines:
        see = (f"see `reasoner plan {recipe_path} --devices {alloc.devices} --device-mem-gib "
               f"{alloc.mem_gib:g} --kind {alloc.kind}`; " if alloc.mem_gib else "")
        raise ConfigError(f"the allocation ({alloc.describe()}) cannot run this recipe; nothing "
                          "was submitted:\n" + "\n".join(lines)
                          + f"\n{see}ask for more nodes (--nodes) or change the stages")
