"""The hardware module on a CPU: what `auto` picks, one-process collectives, memory figures."""

import pytest
import torch

from reasoner import device as dev
from reasoner.errors import InputError


def test_auto_picks_the_cpu_in_fp32_here_and_bf16_on_accelerators():
    assert dev.pick_device("auto") == torch.device("cpu")  # no GPU / NPU on this machine
    assert dev.pick_dtype("auto", torch.device("cpu")) is torch.float32
    assert dev.pick_dtype("auto", torch.device("cuda", 0)) is torch.bfloat16
    assert dev.pick_dtype("float16", torch.device("cpu")) is torch.float16
    with pytest.raises(InputError, match="unknown device 'tpu'; use auto, cpu, cuda or npu"):
        dev.pick_device("tpu")
    assert dev.local_devices() is None  # `reasoner run` skips its memory check on a CPU


def test_one_process_needs_no_process_group(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    d = dev.init_distributed(torch.device("cpu"))
    assert d == dev.DistInfo(0, 1, 0) and d.is_main
    assert dev.all_reduce([1.5, 2.0], d, torch.device("cpu"), "max") == [1.5, 2.0]
    dev.barrier(d)  # a no-op, not a hang


def test_reductions_use_fp64_except_where_hccl_lacks_it():
    from types import SimpleNamespace

    assert dev.reduce_dtype(torch.device("cpu")) is torch.float64
    assert dev.reduce_dtype(torch.device("cuda", 0)) is torch.float64
    # torch knows "npu" only once torch_npu is imported: a stand-in with its type
    assert dev.reduce_dtype(SimpleNamespace(type="npu")) is torch.float32


def test_autocast_is_off_for_fp32_and_on_for_bf16():
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with dev.autocast(torch.device("cpu"), torch.float32):
        assert (a @ b).dtype is torch.float32
    with dev.autocast(torch.device("cpu"), torch.bfloat16):
        assert (a @ b).dtype is torch.bfloat16


def test_memory_on_a_cpu_is_this_process_peak_rss():
    before = dev.peak_rss_bytes()
    block = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
    assert dev.peak_rss_bytes() >= before
    assert dev.peak_rss_bytes() >= block.numel() * 4
    stats = dev.memory_stats(torch.device("cpu"))
    assert list(stats) == ["max_rss_gib"] and stats["max_rss_gib"] * 2**30 >= block.numel() * 4
    assert not dev.flash_attention_available(torch.device("cpu"))


def test_the_process_group_waits_as_long_as_the_config_says(monkeypatch):
    """NCCL's default 10-minute timeout is shorter than rank 0's tokenizing of a large SFT set
    while the others wait at a barrier: the time-out is run.dist_timeout_min."""
    import datetime

    import torch.distributed as tdist

    calls = {}
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(tdist, "is_initialized", lambda: False)
    monkeypatch.setattr(tdist, "init_process_group", lambda **kw: calls.update(kw))
    monkeypatch.setattr(tdist, "get_rank", lambda: 1)
    monkeypatch.setattr(tdist, "get_world_size", lambda: 2)
    d = dev.init_distributed(torch.device("cpu"), timeout_min=90)
    assert calls == {"backend": "gloo", "timeout": datetime.timedelta(minutes=90)}
    assert d == dev.DistInfo(1, 2, 1)


def test_a_trainer_on_ascend_sets_hccl_timeout_before_it_picks_the_npu(monkeypatch, tmp_path):
    """The trainer's setup sets HCCL_EXEC_TIMEOUT too (the CLI set it before torch loaded:
    tests/unit/test_hccl.py), for a caller that did not start from the CLI: an NPU faked by
    torch_npu's presence."""
    from reasoner import training
    from reasoner.config import RunConfig, TrainedModelConfig

    monkeypatch.delenv("HCCL_EXEC_TIMEOUT", raising=False)
    monkeypatch.delenv("HCCL_OP_EXPANSION_MODE", raising=False)
    seen = []
    monkeypatch.setattr(dev, "npu_installed", lambda: True)
    monkeypatch.setattr(dev, "pick_device", lambda pref: seen.append(
        dev.os.environ.get("HCCL_EXEC_TIMEOUT")) or torch.device("cpu"))
    training.setup(TrainedModelConfig(name_or_path=str(tmp_path)), RunConfig(dist_timeout_min=45))
    assert seen == ["2700"]


@pytest.mark.slow
def test_every_process_must_see_the_run_folder_rank_0_created(tmp_path):
    """Two gloo processes: a folder both see passes; one folder per process (two nodes without
    a shared file system) stops both with the same error, so neither waits in a collective for
    the other. Before, rank 0 alone made the checkpoint folder and the other node wrote its
    optimiser shards to its own disk."""
    import json
    import subprocess
    from pathlib import Path

    from tests_helpers import SUBPROCESS_ENV, torchrun_two_processes, why

    check = Path(__file__).parents[1] / "same_folder_check.py"
    out = tmp_path / "result.json"
    done = subprocess.run(torchrun_two_processes(check, tmp_path / "base", out),
                          capture_output=True, text=True, env=SUBPROCESS_ENV, timeout=300)
    assert done.returncode == 0, why(done)
    for rank in (0, 1):
        seen = json.loads(Path(f"{out}.{rank}").read_text())
        assert seen["shared"] is None
        assert seen["per node"].startswith("1 of 2 processes do not see the run folder ")
        assert "a file system every node shares" in seen["per node"]
        assert seen["uncreatable"].startswith(f"rank 0 could not create the run folder "
                                              f"{tmp_path / 'base' / 'a-file' / 'run'}")
        assert seen["uncreatable"].endswith("check output_dir and its permissions")
        assert ("Not a directory" in seen["uncreatable"]) is (rank == 0)  # rank 0 says why
        assert seen["marks_left"] == []
        # what the token cache asks before one process builds it for all (a cache_dir may be
        # a node's own disk): the same answer on every process
        assert (seen["shared shared"], seen["per node shared"], seen["uncreatable shared"]) == (
            True, False, False)


def test_a_mark_that_shows_up_late_is_still_seen(tmp_path):
    """Another node's NFS client may report rank 0's fresh file as absent for a few seconds
    (cached absence): the reader looks again before it calls the folder unshared."""
    import threading
    import time

    from reasoner.device import read_mark

    mark = tmp_path / ".same-folder-check"
    late = threading.Timer(0.8, lambda: mark.write_text("1234"))
    late.start()
    started = time.monotonic()
    assert read_mark(mark, 1234, patience_s=10.0)
    assert 0.8 <= time.monotonic() - started < 5.0
    late.join()
    assert not read_mark(mark, 999, patience_s=0.6)  # a stale number: still not the same folder


@pytest.mark.parametrize("argv, code, left", [(["--version"], 0, True),
                                              (["no-such-command"], 2, False)])
def test_the_command_line_leaves_the_process_group_only_after_success(
        tmp_path, monkeypatch, argv, code, left):
    """A torchrun process that exits holding its process group may abort at interpreter
    shutdown (gloo) and NCCL warns that pending work may be lost: `reasoner` tears the group
    down after a command succeeds. After a failure it leaves it: another rank may still be in a
    collective, and tearing down would hang there instead of exiting."""
    import torch.distributed as tdist

    from reasoner.cli import run

    tdist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                             world_size=1)
    try:
        monkeypatch.setattr("sys.argv", ["reasoner", *argv])
        with pytest.raises(SystemExit) as exit_:
            run()
        assert exit_.value.code == code
        assert tdist.is_initialized() is not left
    finally:
        if tdist.is_initialized():
            tdist.destroy_process_group()
