"""Hub files fetched by one process, read offline by every process (no hub here: the download is
a stand-in that records who called it)."""

import pytest
import torch

from reasoner import device as dev
from reasoner.errors import InputError
from reasoner.models import load

CPU = torch.device("cpu")


@pytest.fixture
def hub(monkeypatch):
    """A fake hub: records downloads; HF_HUB_OFFLINE starts unset and is restored after."""
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    calls = []
    monkeypatch.setattr("huggingface_hub.snapshot_download",
                        lambda name, allow_patterns: calls.append((name, allow_patterns)))
    monkeypatch.setattr(dev, "all_reduce", lambda values, dist, device, op="sum": list(values))
    return calls


@pytest.mark.parametrize("rank, local_rank, shared, downloads", [
    (0, 0, True, 1),  # rank 0 fetches for everyone when the hub cache is shared
    (3, 1, True, 0),
    (2, 0, True, 0),  # the second node's first process: the shared cache already has it
    (2, 0, False, 1),  # node-local caches: each node's first process fetches its copy
    (3, 1, False, 0),
])
def test_one_process_downloads_and_every_process_then_reads_offline(hub, monkeypatch, rank,
                                                                    local_rank, shared, downloads):
    from huggingface_hub import constants

    monkeypatch.setattr(dev, "sees_same_folder", lambda folder, dist, device: shared)
    dist = dev.DistInfo(rank=rank, world_size=4, local_rank=local_rank)
    load.fetch_once("Qwen/Qwen2.5-32B", dist, CPU)
    assert hub == [("Qwen/Qwen2.5-32B", load.HUB_FILES)] * downloads
    assert constants.HF_HUB_OFFLINE is True
    import os

    assert os.environ["HF_HUB_OFFLINE"] == "1"


def test_a_failed_download_stops_every_process_with_its_reason(hub, monkeypatch):
    def refuse(name, allow_patterns):
        raise OSError("401 Client Error: gated repo\nmore lines")

    monkeypatch.setattr("huggingface_hub.snapshot_download", refuse)
    monkeypatch.setattr(dev, "sees_same_folder", lambda folder, dist, device: True)
    with pytest.raises(InputError, match=r"Qwen/Qwen2.5-32B: cannot download it \(401 Client "
                                         r"Error: gated repo\)$"):
        load.fetch_once("Qwen/Qwen2.5-32B", dev.DistInfo(rank=0, world_size=2), CPU)
    monkeypatch.setattr(dev, "all_reduce", lambda values, dist, device, op="sum": [1.0])
    with pytest.raises(InputError, match="the download failed on another process"):
        load.fetch_once("Qwen/Qwen2.5-32B", dev.DistInfo(rank=1, world_size=2, local_rank=1), CPU)


def test_local_folders_one_process_and_offline_runs_never_ask(hub, monkeypatch, tmp_path):
    monkeypatch.setattr(dev, "sees_same_folder", lambda *a: pytest.fail("asked"))
    load.fetch_once("Qwen/Qwen2.5-32B", dev.DistInfo(), CPU)
    load.fetch_once(str(tmp_path), dev.DistInfo(rank=0, world_size=2), CPU)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    load.fetch_once("Qwen/Qwen2.5-32B", dev.DistInfo(rank=0, world_size=2), CPU)
    assert hub == []
