"""What a recipe needs of an allocation: where each stage runs, which allocations are refused
(and with which numbers), and the allocation read from sinfo's GRES column."""

from pathlib import Path

import pytest

from reasoner.errors import ConfigError
from reasoner.pipeline import cluster
from reasoner.pipeline import run as pipeline
from reasoner.pipeline.recipe import load_recipe

REPO = Path(__file__).resolve().parents[3]
PCL = REPO / "configs/pcl_reasoner_v1_5/recipe.yaml"


def stages(*overrides: str, recipe: Path = PCL) -> dict[str, pipeline.StageRun]:
    cfg = load_recipe(recipe, ["run_dir=/nowhere", *overrides])
    return {s.name: s for s in pipeline.resolve(cfg, recipe.parent)}


def test_placement_of_each_stage():
    by = stages()
    assert {n: cluster.placement(s) for n, s in by.items()} == {
        "sft": "train", "samples": "shard", "verify": "first", "train-offline": "train",
        "aime24": "first", "aime25": "first"}
    by = stages("samples.ray.workers=8", "verify.judge.ray.workers=8", "aime24.ray.workers=2")
    assert [cluster.placement(by[n]) for n in ("samples", "verify", "aime24")] == ["ray"] * 3
    # a judge that never runs (rule mode) or a server's engines need no Ray cluster here
    by = stages("verify.mode=rule", "verify.judge.ray.workers=8", "samples.ray.workers=8",
                "samples.backend=openai", "samples.server.base_url=http://h:8000/v1")
    assert cluster.placement(by["verify"]) == "first" and cluster.placement(by["samples"]) == "first"


def test_engines_without_ray_workers_get_the_actors_the_allocation_holds():
    """Issue 51, finding 14: N = nodes x the engines a node holds; infer keeps its node shards
    where they already give every device an engine; what a recipe sets is left as it is."""
    gpu, npu = cluster.Allocation(8, 8, "h100", 80.0), cluster.Allocation(4, 16, "910b", 64.0)
    assert cluster.spread(list(stages().values()), gpu) == [
        "verify.judge.ray.workers=8", "aime24.ray.workers=8", "aime25.ray.workers=8"]
    assert cluster.spread(list(stages().values()), npu) == [
        "samples.ray.workers=8", "verify.judge.ray.workers=8", "aime24.ray.workers=8",
        "aime25.ray.workers=8"]
    by = stages("aime24.ray.workers=2", "aime25.vllm.tensor_parallel_size=4")
    assert cluster.spread(list(by.values()), gpu) == [
        "verify.judge.ray.workers=8", "aime25.ray.workers=16"]
    assert cluster.spread(list(stages().values()), cluster.Allocation(1, 8, "h100", 80.0)) == []
    assert cluster.spread(list(stages().values()), cluster.Allocation(4, 2, "cpu", None)) == []


def test_device_counts_the_allocation_cannot_hold_are_named():
    by = stages("samples.ray.workers=9", "train-offline.run.sequence_parallel=8",
                "verify.judge.vllm.tensor_parallel_size=16")
    lines = cluster.device_problems(list(by.values()), cluster.Allocation(8, 8, "h100", 80.0), {})
    assert lines == [
        "stage samples: ray.workers=9 engines of 8 devices need 72 devices; the allocation has "
        "64 (8 node(s) x 8 h100 x 80 GiB)",
        "stage verify: judge.vllm.tensor_parallel_size=16 needs 16 devices on one node; a node "
        "has 8"]
    lines = cluster.device_problems(list(by.values()), cluster.Allocation(4, 12, "910b", 64.0), {})
    assert ("stage train-offline: run.sequence_parallel=8 groups consecutive processes within a "
            "node; 12 per node do not divide into them") in lines
    # HCCL_EXEC_TIMEOUT's cap (device.set_hccl_timeout): 17,340 s, 1,091 s in AIV mode
    by = stages("sft.run.dist_timeout_min=30")
    npu = cluster.Allocation(4, 16, "910b", 64.0)
    assert cluster.device_problems([by["sft"]], npu, {}) == []
    assert cluster.device_problems([by["sft"]], npu, {"HCCL_OP_EXPANSION_MODE": "AIV"}) == [
        "stage sft: run.dist_timeout_min=30 is 1800 s, above HCCL_EXEC_TIMEOUT's 1091 s cap: "
        "lower it"]


def test_the_plan_refuses_a_too_small_allocation_with_its_numbers():
    cfg = load_recipe(PCL, ["run_dir=/nowhere"])
    run = pipeline.resolve(cfg, PCL.parent)
    with pytest.raises(ConfigError) as err:
        cluster.check(PCL, ["run_dir=/nowhere"], cfg, run, cluster.Allocation(1, 8, "h100", 80.0))
    said = str(err.value)
    assert "nothing was submitted" in said
    assert "stage sft: needs 108.5 GiB per device on 8 devices, has 80.0" in said
    assert "stage train-offline: needs 100.4 GiB per device on 8 devices, has 80.0" in said
    assert "--devices 8 --device-mem-gib 80 --kind h100" in said
    # docs/run.md's commands: 8 nodes of 8 GPUs, 4 Atlas A3 nodes of 16 NPU devices
    on_ray = ["verify.judge.ray.workers=8", "aime24.ray.workers=8", "aime25.ray.workers=8"]
    for alloc, extra in ((cluster.Allocation(8, 8, "h100", 80.0), []),
                         (cluster.Allocation(4, 16, "910b", 64.0), [
                             "sft.model.device=npu", "train-offline.model.device=npu",
                             "samples.ray.workers=8"])):
        overrides = ["run_dir=/nowhere", *on_ray, *extra]
        cfg_here = load_recipe(PCL, overrides)
        cluster.check(PCL, overrides, cfg_here, pipeline.resolve(cfg_here, PCL.parent), alloc)
    with pytest.raises(ConfigError, match="ray.workers=9 engines of 8 devices need 72"):
        overrides = ["run_dir=/nowhere", "aime24.ray.workers=9"]
        cfg_here = load_recipe(PCL, overrides)
        cluster.check(PCL, overrides, cfg_here, pipeline.resolve(cfg_here, PCL.parent),
                      cluster.Allocation(8, 8, "h100", 80.0))
    for s in run:  # finished stages are not checked: they will not run
        s.status = "skip"
    cluster.check(PCL, ["run_dir=/nowhere"], cfg, run, cluster.Allocation(1, 8, "h100", 80.0))


@pytest.mark.parametrize("gres, want", [
    ("gpu:h100:8(S:0-1)\ngpu:h100:8(S:0-1)\n", ("h100", 8)),
    ("gpu:a100:4\ngpu:a100:8\n", ("a100", 4)),  # the smallest node
    ("gpu:8\n", ("gpu", 8)),
    ("gpu:h100:8\ngpu:a100:8\n", ("gpu", 8)),  # mixed types: the family
    ("npu:16\n", ("npu", 16)),
    ("npu:910b:8\n", ("910b", 8)),
])
def test_gres_from_sinfo(gres, want):
    assert cluster.parse_gres(gres) == want


def test_the_allocation_needs_what_it_cannot_read():
    with pytest.raises(ConfigError, match="sinfo lists no GPU or NPU"):
        cluster.parse_gres("(null)\n")
    with pytest.raises(ConfigError, match="give --device-mem-gib"):
        cluster.allocation(2, 8, "gpu", None)
    assert cluster.allocation(2, 8, "gpu", 40.0).mem_gib == 40.0
    assert cluster.allocation(2, 16, "910b", None) == cluster.Allocation(2, 16, "910b", 64.0)
    assert cluster.allocation(1, 2, "cpu", None).mem_gib is None


LORA_7B = REPO / "configs/gsm8k_1gpu/recipe_7b_lora.yaml"


def test_a_kinds_memory_is_what_the_device_reports():
    """Without --device-mem-gib a named kind's memory is nvidia-smi's memory.total in GiB (MiB /
    1024), not the data sheet's GB: an L4 and an A10G hold 22.49 GiB, an L40S 44.99, an H100
    79.65. The launcher's check plans on it: the 7B LoRA recipe fits an L4 (20.9 GiB), and with
    2,048-token log-prob chunks (23.0 GiB) it is refused with those numbers."""
    gib = {kind: cluster.allocation(1, 1, kind, None).mem_gib
           for kind in ("l4", "a10g", "l40s", "h100")}
    assert gib == {"l4": 23034 / 1024, "a10g": 23028 / 1024, "l40s": 46068 / 1024,
                   "h100": 81559 / 1024}
    assert [round(v, 2) for v in gib.values()] == [22.49, 22.49, 44.99, 79.65]
    l4 = cluster.allocation(1, 1, "l4", None)
    for overrides, fits in ((["run_dir=/nowhere"], True),
                            (["run_dir=/nowhere", "rl.run.logprob_chunk=2048"], False)):
        cfg = load_recipe(LORA_7B, overrides)
        run = pipeline.resolve(cfg, LORA_7B.parent)
        if fits:
            cluster.check(LORA_7B, overrides, cfg, run, l4)
            continue
        with pytest.raises(ConfigError, match=r"stage rl: needs 23\.0 GiB per device on 1 "
                                              r"devices, has 22\.5"):
            cluster.check(LORA_7B, overrides, cfg, run, l4)
