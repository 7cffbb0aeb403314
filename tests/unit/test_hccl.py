"""HCCL's time-out: its checks, and that the CLI reaches them before anything imports torch
(tests/integration/test_hccl_cli.py runs the real trainers under a stand-in backend)."""

import subprocess
import sys

import pytest

from reasoner import hccl
from reasoner.errors import InputError


@pytest.fixture
def clean_env(monkeypatch):
    monkeypatch.delenv("HCCL_EXEC_TIMEOUT", raising=False)
    monkeypatch.delenv("HCCL_OP_EXPANSION_MODE", raising=False)
    return monkeypatch


def test_hccl_waits_as_long_as_the_config_says_within_its_cap(clean_env):
    """torch_npu passes init_process_group's time-out to its watchdog only; HCCL's own wait is
    HCCL_EXEC_TIMEOUT (1836 s by default). It is set from run.dist_timeout_min; a value above
    the expansion mode's cap is refused, and so is an environment that sets it lower."""
    hccl.set_hccl_timeout(60)
    assert hccl.os.environ["HCCL_EXEC_TIMEOUT"] == "3600"
    hccl.set_hccl_timeout(60)  # again (the CLI, then the trainer's setup): the same value
    assert hccl.os.environ["HCCL_EXEC_TIMEOUT"] == "3600"
    clean_env.setenv("HCCL_OP_EXPANSION_MODE", "AIV")
    with pytest.raises(InputError, match="above the 1091 s HCCL_EXEC_TIMEOUT allows with "
                                         "HCCL_OP_EXPANSION_MODE=AIV"):
        hccl.set_hccl_timeout(60)
    hccl.set_hccl_timeout(18)
    assert hccl.os.environ["HCCL_EXEC_TIMEOUT"] == "1080"
    clean_env.delenv("HCCL_OP_EXPANSION_MODE")
    with pytest.raises(InputError, match=r"above the 17340 s HCCL_EXEC_TIMEOUT allows: lower "
                                         r"run.dist_timeout_min to at most 289"):
        hccl.set_hccl_timeout(290)
    clean_env.setenv("HCCL_EXEC_TIMEOUT", "1800")
    with pytest.raises(InputError, match="sets HCCL_EXEC_TIMEOUT=1800, shorter than"):
        hccl.set_hccl_timeout(60)


def test_only_a_run_that_may_use_hccl_sets_it(clean_env):
    """npu, or auto where torch_npu is installed; on a GPU or CPU the cap must not refuse a
    time-out NCCL or gloo take."""
    clean_env.setattr(hccl, "npu_installed", lambda: False)
    hccl.set_before_torch("auto", 600)
    hccl.set_before_torch("cuda", 600)
    assert "HCCL_EXEC_TIMEOUT" not in hccl.os.environ
    hccl.set_before_torch("npu", 45)
    assert hccl.os.environ["HCCL_EXEC_TIMEOUT"] == "2700"
    clean_env.delenv("HCCL_EXEC_TIMEOUT")
    clean_env.setattr(hccl, "npu_installed", lambda: True)
    hccl.set_before_torch("cpu", 600)
    assert "HCCL_EXEC_TIMEOUT" not in hccl.os.environ
    hccl.set_before_torch("auto", 30)
    assert hccl.os.environ["HCCL_EXEC_TIMEOUT"] == "1800"


def test_the_cli_imports_no_torch_before_a_trainer_sets_hccl():
    """`import torch` loads torch_npu, which reads HCCL_EXEC_TIMEOUT: neither the app (typer
    reads every command's options, whichever runs) nor this module may import torch."""
    code = "import sys, reasoner.cli, reasoner.hccl; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_cli_names_the_device_kinds_of_the_plan():
    """recipe_commands names the kinds instead of importing plan (which imports torch)."""
    from reasoner.cli.recipe_commands import DEVICE_KINDS
    from reasoner.pipeline.plan import PEAK_TFLOPS

    assert DEVICE_KINDS == tuple(PEAK_TFLOPS)
