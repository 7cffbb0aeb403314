"""Accelerator choice, distributed init and memory stats.

The only module that touches `torch.cuda` or `torch_npu`; everything else asks it.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from reasoner.errors import DependencyError, InputError
from reasoner.hccl import (  # noqa: F401  (re-exported: training.policy, pipeline.cluster)
    HCCL_AIV_CAP_S,
    HCCL_CAP_S,
    npu_installed,
    set_hccl_timeout,
)


@lru_cache(maxsize=1)
def npu_available() -> bool:
    """True when torch_npu is installed and sees an Ascend NPU (imported only here)."""
    try:
        import torch_npu  # noqa: F401
    except ImportError:
        return False
    return bool(getattr(torch, "npu", None) and torch.npu.is_available())


def cuda_available() -> bool:
    return torch.cuda.is_available()


def local_devices() -> tuple[str, int, float] | None:
    """(kind, count, GiB each) of this machine's GPUs or NPUs; None on a CPU-only machine."""
    if cuda_available():
        n = torch.cuda.device_count()
        return "gpu", n, torch.cuda.get_device_properties(0).total_memory / 2**30
    if npu_available():
        n = torch.npu.device_count()
        return "npu", n, torch.npu.get_device_properties(0).total_memory / 2**30
    return None


def pick_device(preference: str = "auto", local_rank: int | None = None) -> torch.device:
    """`auto` -> cuda, then npu, then cpu; an explicit choice that is absent is an error."""
    if local_rank is None:
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if preference == "auto":
        preference = "cuda" if cuda_available() else "npu" if npu_available() else "cpu"
    if preference == "cuda":
        if not cuda_available():
            raise InputError("device=cuda was asked for but torch sees no CUDA GPU")
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    if preference == "npu":
        if not npu_available():
            raise DependencyError(
                "device=npu was asked for but torch_npu is missing or sees no NPU; "
                "install the extra: pip install 'reasoner[npu]'"
            )
        torch.npu.set_device(local_rank)
        return torch.device("npu", local_rank)
    if preference == "cpu":
        return torch.device("cpu")
    raise InputError(f"unknown device {preference!r}; use auto, cpu, cuda or npu")


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    """`auto` -> bf16 on accelerators; on a CPU bf16 only where it computes it natively (AMX,
    AVX512-BF16), else fp32 (reasoner.cpu). A CPU run says which path it took, once."""
    from reasoner import cpu

    if name == "auto":
        dtype = cpu.auto_dtype() if device.type == "cpu" else torch.bfloat16
    else:
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16,
                 "float16": torch.float16}[name]
    if device.type == "cpu":
        _say_cpu_path(dtype)
    return dtype


@lru_cache(maxsize=4)
def _say_cpu_path(dtype: torch.dtype) -> None:
    """The CPU path, once per dtype, from the main process: what the CPU has and what it costs."""
    from reasoner import cpu

    if not is_main_process():
        return
    found = cpu.features()
    line = found.describe(dtype)
    if dtype == torch.bfloat16 and not found.native_bf16:
        line += f"; warning: {cpu.SLOW_BF16}: set model.dtype: auto (fp32 here) or float32"
    print(f"reasoner: {line}", file=sys.stderr)


@dataclass(frozen=True)
class DistInfo:
    """This process's place: its rank among `world_size`, and its sequence-parallel group (the
    `sp_size` consecutive ranks sharing each row; models.sequence_parallel). Data is split over
    the `dp_size` groups: every member of a group gets the same rows."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    sp_size: int = 1
    sp_group: Any = field(default=None, compare=False, repr=False)  # a torch process group

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def sp_rank(self) -> int:
        """This process's place within its sequence-parallel group."""
        return self.rank % self.sp_size

    @property
    def dp_rank(self) -> int:
        """Which data-parallel share of each global batch this process (and its group) gets."""
        return self.rank // self.sp_size

    @property
    def dp_size(self) -> int:
        return self.world_size // self.sp_size


@dataclass(frozen=True)
class Env:
    """Where a training run computes: its device, its process group and its compute dtype."""

    device: torch.device
    dist: DistInfo
    dtype: torch.dtype


def init_distributed(device: torch.device, timeout_min: float = 60.0,
                     sequence_parallel: int = 1) -> DistInfo:
    """Join the process group torchrun set up (nccl / hccl / gloo); a no-op for one process.

    `timeout_min` bounds every collective and barrier. NCCL's default is 10 minutes, shorter
    than the work one rank does while the others wait at a barrier: tokenizing a 666K-row SFT
    set, merging the reference log-probs, copying the final checkpoint (run.dist_timeout_min).
    `sequence_parallel`: the size of the groups of consecutive ranks that share each row (one
    process group each; every rank creates every group, as torch requires).
    """
    world = int(os.environ.get("WORLD_SIZE", 1))
    if world % sequence_parallel:
        raise InputError(
            f"run.sequence_parallel={sequence_parallel} does not divide the {world} processes "
            "into whole groups: launch a multiple of it (torchrun --nproc-per-node), or lower it")
    if world == 1:
        return DistInfo()
    import datetime

    import torch.distributed as dist

    if not dist.is_initialized():
        backend = {"cuda": "nccl", "npu": "hccl"}.get(device.type, "gloo")
        dist.init_process_group(backend=backend, timeout=datetime.timedelta(minutes=timeout_min))
    rank, group = dist.get_rank(), None
    if sequence_parallel > 1:
        for first in range(0, world, sequence_parallel):
            made = dist.new_group(list(range(first, first + sequence_parallel)))
            if first <= rank < first + sequence_parallel:
                group = made
    return DistInfo(rank, dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0)),
                    sequence_parallel, group)


def check_same_folder(folder: Path, dist: DistInfo, device: torch.device,
                      patience_s: float = 30.0) -> None:
    """Stop every process, with one clear error, unless all of them see the same `folder`.

    On two nodes without a shared file system the other node's processes would find nothing
    there: left alone, rank 0 would publish checkpoints whose optimiser shards sit on other
    disks, and a resume would pick different steps on different nodes. Every process raises,
    so none is left waiting in a collective; also when rank 0 cannot create it."""
    if dist.world_size == 1:
        return
    missing, failed = _mark_seen(folder, dist, device, patience_s)
    if failed is not None:
        raise InputError(f"rank 0 could not create the run folder {folder}"
                         f"{': ' + failed if failed else ''}; check output_dir and its permissions")
    if missing:
        raise InputError(
            f"{missing} of {dist.world_size} processes do not see the run folder "
            f"{folder} that rank 0 created: put output_dir on a file system every node shares "
            "(checkpoints, resumes and the final model are written there by all of them)")


def sees_same_folder(folder: Path, dist: DistInfo, device: torch.device,
                     patience_s: float = 5.0) -> bool:
    """Whether every process sees the `folder` rank 0 writes in (one shared file system), so
    that one process can fill it for all; False when some do not (node-local disks), or when
    rank 0 cannot write there. A collective: every process calls it."""
    if dist.world_size == 1:
        return True
    missing, failed = _mark_seen(folder, dist, device, patience_s)
    return failed is None and not missing


def _mark_seen(folder: Path, dist: DistInfo, device: torch.device, patience_s: float
               ) -> tuple[int, str | None]:
    """Rank 0 leaves a random number in `folder`; every process reads it back, for up to
    `patience_s` seconds (NFS caches a file's absence for a while on other nodes). Returns how
    many processes did not see it, and rank 0's error when it could not write it (else None)."""
    import secrets

    token, failed = (secrets.randbits(24) if dist.is_main else 0), ""
    if dist.is_main:  # the name carries the token: two runs checking one folder never collide
        try:
            Path(folder).mkdir(parents=True, exist_ok=True)
            (Path(folder) / f".same-folder-check-{token}").write_text(str(token))
        except OSError as e:
            token, failed = -1, str(e)
    token = int(all_reduce([token], dist, device)[0])  # exact: 24 bits fit fp32 (HCCL's)
    if token < 0:
        return dist.world_size, failed
    mark = Path(folder) / f".same-folder-check-{token}"
    missing = all_reduce([float(not read_mark(mark, token, patience_s))], dist, device)
    if dist.is_main:
        mark.unlink(missing_ok=True)
    return int(missing[0]), None


def read_mark(mark: Path, token: int, patience_s: float) -> bool:
    """Whether `mark` holds `token`, looking again for up to `patience_s` seconds: listing the
    folder makes an NFS client drop the absence it cached before rank 0 wrote the file."""
    import time

    deadline = time.monotonic() + patience_s
    while True:
        try:
            if int(mark.read_text()) == token:
                return True
        except (OSError, ValueError):
            pass
        if time.monotonic() >= deadline:
            return False
        with contextlib.suppress(OSError):
            os.listdir(mark.parent)
        time.sleep(0.5)


def autocast(device: torch.device, dtype: torch.dtype):
    """bf16/fp16 autocast (on CPU too when asked for: `auto` picks fp32 there); off for fp32.

    The weight-cast cache is off: it keeps a bf16 copy of every weight used until the outermost
    autocast region ends, i.e. the whole model for one forward, which under FSDP2 would undo
    the sharding (2 bytes per parameter of the whole model on every device)."""
    enabled = dtype in (torch.bfloat16, torch.float16)
    return torch.autocast(device_type=device.type, dtype=dtype, enabled=enabled,
                          cache_enabled=False)


def reduce_dtype(device: torch.device) -> torch.dtype:
    """Dtype for metric and count reductions: fp64 where the backend has it (HCCL has not)."""
    return torch.float32 if device.type == "npu" else torch.float64


def all_reduce(values: list[float], dist: DistInfo, device: torch.device, op: str = "sum"
               ) -> list[float]:
    """Sum (or max) `values` over every process, as a tensor on the process group's device.

    NCCL and HCCL reject CPU tensors, so the tensor lives on `device` (the rank's GPU/NPU);
    with gloo that is the CPU. One process: the values themselves.
    """
    if dist.world_size == 1 or not values:
        return list(values)
    import torch.distributed as tdist

    t = torch.tensor(values, dtype=reduce_dtype(device), device=device)
    tdist.all_reduce(t, op=tdist.ReduceOp.MAX if op == "max" else tdist.ReduceOp.SUM)
    return t.tolist()


def barrier(dist: DistInfo) -> None:
    if dist.world_size > 1:
        import torch.distributed as tdist

        tdist.barrier()


def is_main_process() -> bool:
    """True on rank 0, or when no process group was started (one process)."""
    import torch.distributed as tdist

    if tdist.is_available() and tdist.is_initialized():
        return tdist.get_rank() == 0
    return int(os.environ.get("RANK", 0)) == 0


def memory_stats(device: torch.device) -> dict[str, float]:
    """Peak allocated memory in GiB on accelerators; process max RSS on CPU."""
    if device.type == "cuda":
        return {"peak_mem_gib": torch.cuda.max_memory_allocated(device) / 2**30}
    if device.type == "npu":
        return {"peak_mem_gib": torch.npu.max_memory_allocated(device) / 2**30}
    return {"max_rss_gib": peak_rss_bytes() / 2**30}


def peak_rss_bytes() -> int:
    """This process's peak resident memory, in bytes.

    On Linux it is VmHWM from /proc/self/status, the peak of this process's own address space.
    `ru_maxrss` is not: exec keeps the larger of the old and new peaks, so a process started by
    a big one (a pytest worker, a launcher) reports its parent's peak until it exceeds it.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB elsewhere


def flash_attention_available(device: torch.device) -> bool:
    """flash-attention varlen kernels are usable (CUDA with the flash_attn package)."""
    if device.type != "cuda":
        return False
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        return False
    return True
