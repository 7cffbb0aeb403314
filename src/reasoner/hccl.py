"""HCCL's own time-out on Ascend, put in the environment before torch is imported.

Since torch 2.5, `import torch` loads every device backend registered under the
`torch.backends` entry points (unless TORCH_DEVICE_BACKEND_AUTOLOAD=0), torch_npu among them,
and torch_npu reads HCCL's settings when it loads. So a command that trains sets
HCCL_EXEC_TIMEOUT from its config's run.dist_timeout_min after reading the config and before
anything imports torch (cli/stage_commands.py); this module imports no torch, so that it can.
"""

from __future__ import annotations

import importlib.util
import os

from reasoner.errors import InputError

HCCL_CAP_S = 17340  # HCCL_EXEC_TIMEOUT's largest value on Atlas A2 / A3
HCCL_AIV_CAP_S = 1091  # ... with HCCL_OP_EXPANSION_MODE=AIV


def npu_installed() -> bool:
    """torch_npu is there (found, not imported: importing it reads HCCL's settings)."""
    return importlib.util.find_spec("torch_npu") is not None


def may_use_hccl(device: str) -> bool:
    """Whether a trainer whose model.device is `device` may join an HCCL process group."""
    return device == "npu" or (device == "auto" and npu_installed())


def set_hccl_timeout(timeout_min: float) -> None:
    """Make HCCL wait as long as run.dist_timeout_min says. On Ascend the time-out given to
    `init_process_group` reaches torch_npu's watchdog only; HCCL's own wait for an operation is
    HCCL_EXEC_TIMEOUT (1836 s by default on A2 / A3). Refused with one paragraph above the cap
    of the expansion mode, or when the environment already sets it lower (it would silently win
    on some nodes)."""
    want = int(round(timeout_min * 60))
    aiv = os.environ.get("HCCL_OP_EXPANSION_MODE", "").upper() == "AIV"
    cap = HCCL_AIV_CAP_S if aiv else HCCL_CAP_S
    if want > cap:
        raise InputError(
            f"run.dist_timeout_min={timeout_min:g} asks HCCL to wait {want} s, above the "
            f"{cap} s HCCL_EXEC_TIMEOUT allows{' with HCCL_OP_EXPANSION_MODE=AIV' if aiv else ''}:"
            f" lower run.dist_timeout_min to at most {cap / 60:.0f}")
    given = os.environ.get("HCCL_EXEC_TIMEOUT")
    if given is not None and given.strip().isdigit() and int(given) < want:
        raise InputError(
            f"the environment sets HCCL_EXEC_TIMEOUT={given}, shorter than run.dist_timeout_min="
            f"{timeout_min:g} ({want} s): HCCL would end the run after {given} s of one rank's "
            "work behind a barrier. Unset it (reasoner sets it from run.dist_timeout_min), or "
            "lower run.dist_timeout_min")
    os.environ["HCCL_EXEC_TIMEOUT"] = str(want)


def set_before_torch(device: str, timeout_min: float) -> None:
    """A trainer's first step, before torch is imported: HCCL_EXEC_TIMEOUT from
    run.dist_timeout_min (`timeout_min`) when the run may use HCCL; elsewhere nothing (HCCL's
    cap would refuse a long time-out that NCCL or gloo take)."""
    if may_use_hccl(device):
        set_hccl_timeout(timeout_min)
