import json
import subprocess
from pathlib import Path

import pytest
import torch
from tests_helpers import SUBPROCESS_ENV, torchrun_two_processes
from transformers import Qwen2Config
from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

from reasoner.models.fsdp import mixed_precision

CHECK = Path(__file__).parents[2] / "collectives_check.py"


@pytest.mark.slow
def test_sharded_gradients_are_summed_in_fp32_and_bf16_gathers_in_bf16(tmp_path):
    """Two gloo processes, every torch.distributed collective wrapped. No reduction is an
    average or a pre-multiplied sum (HCCL refuses AVG, gloo and HCCL lack PREMUL_SUM): the
    gradient is the sum over processes with no divide anywhere, the whole model's to fp32
    precision. With bf16, FSDP2 all-gathers bf16 parameters (half fp32's traffic) and still
    reduces in fp32 onto fp32 master shards."""
    out = tmp_path / "result.json"
    done = subprocess.run(torchrun_two_processes(CHECK, out), capture_output=True, text=True,
                          env=SUBPROCESS_ENV, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    for dtype, r in result.items():
        ops = {op for _, _, op in r["collectives"]}
        assert not any("AVG" in op or "PREMUL" in op for op in ops), (dtype, ops)
        scatters = [(d, op) for name, d, op in r["collectives"] if name.startswith("reduce_scatter")]
        assert scatters == [("torch.float32", "RedOpType.SUM")], (dtype, scatters)
        assert r["master_dtypes"] == ["torch.float32"]
    gathers = lambda r: {d for name, d, _ in r["collectives"] if name == "all_gather_single"}  # noqa: E731
    assert gathers(result["float32"]) == {"torch.float32"}
    assert gathers(result["bfloat16"]) == {"torch.bfloat16"}
    assert result["float32"]["grad_rel_err"] < 1e-5
    # bf16 parameters in every layer: near the fp32-parameter autocast gradient, not half of it
    assert result["bfloat16"]["grad_rel_err"] < 0.1


def test_fp16_parameters_overflow_where_autocast_does_not():
    """Why an fp16 run keeps fp32 gathers (`mixed_precision`): with fp16 parameters a norm's
    weight gradient is an fp16 sum over tokens, and at the loss scale fp16 training starts at
    (2^16, GradScaler's default) four tokens already overflow it; with fp32 parameters under
    fp16 autocast the same gradient is an fp32 sum, finite."""
    cfg = Qwen2Config(hidden_size=32)
    x = torch.ones(4, 32)
    grads = {}
    for name in ("fp16 parameters", "fp32 parameters, fp16 autocast"):
        norm = Qwen2RMSNorm(32, eps=cfg.rms_norm_eps)
        inp = x.clone()
        if name == "fp16 parameters":
            norm, inp = norm.half(), inp.half()
        with torch.autocast("cpu", dtype=torch.float16, enabled=name != "fp16 parameters"):
            out = norm(inp)
        (out.float().sum() * 2.0**16).backward()
        grads[name] = norm.weight.grad
    assert not torch.isfinite(grads["fp16 parameters"]).any()
    assert torch.isfinite(grads["fp32 parameters, fp16 autocast"]).all()
    assert mixed_precision(torch.float16).param_dtype is None
    assert mixed_precision(torch.bfloat16).param_dtype == torch.bfloat16
    assert mixed_precision(torch.bfloat16).reduce_dtype == torch.float32
