import json
import subprocess
from pathlib import Path

import pytest
import torch
from tests_helpers import SUBPROCESS_ENV, torchrun_two_processes, why
from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

from reasoner.models.fsdp import mixed_precision

CHECK = Path(__file__).parents[2] / "collectives_check.py"


@pytest.mark.slow
def test_sharded_gradients_are_summed_in_fp32_and_half_types_gathered_half(tmp_path):
    """Two gloo processes, every torch.distributed collective wrapped. No reduction is an
    average or a pre-multiplied sum (HCCL refuses AVG, gloo and HCCL lack PREMUL_SUM): the
    gradient is the sum over processes with no divide anywhere, the whole model's to fp32
    precision. With bf16 or fp16, FSDP2 all-gathers parameters in that type (half fp32's
    traffic) and still reduces in fp32 onto fp32 master shards."""
    out = tmp_path / "result.json"
    done = subprocess.run(torchrun_two_processes(CHECK, out), capture_output=True, text=True,
                          env=SUBPROCESS_ENV, timeout=600)
    assert done.returncode == 0, why(done)
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
    assert gathers(result["float16"]) == {"torch.float16"}
    assert result["float32"]["grad_rel_err"] < 1e-5
    # half parameters in every layer: near the fp32-parameter autocast gradient, not half of it
    assert result["bfloat16"]["grad_rel_err"] < 0.1
    assert result["float16"]["grad_rel_err"] < 0.02


def test_fp16_parameters_keep_norm_gradients_finite_at_the_trainers_loss():
    """Why an fp16 run may gather fp16 parameters (`mixed_precision`): with them a norm's weight
    gradient is an fp16 sum over a row's tokens, but the trainers' loss is normalised by the
    global batch's tokens, so each token's upstream gradient is the loss scale over that count.
    At PCL's initial scale of 4096 and a 51,200-token row, the fp16 gradient of an RMSNorm's
    weight is finite and within 1% of the fp64 one; the loss scaler then only has to back off
    from rare outliers, never from every step."""
    g = torch.Generator().manual_seed(0)
    tokens, hidden, scale = 51_200, 64, 4096.0
    x = torch.randn(tokens, hidden, generator=g)
    probe = torch.randn(hidden, generator=g)
    grads = {}
    for dtype in (torch.float16, torch.float64):
        norm = Qwen2RMSNorm(hidden, eps=1e-6).to(dtype)
        out = norm(x.to(dtype))  # (T, H), the norm in fp16 as FSDP2's fp16 gather runs it
        loss = (out * probe.to(dtype)).sum() / tokens  # token-normalised, as the trainers' losses
        (loss * scale).backward()
        grads[dtype] = norm.weight.grad.double()
    assert torch.isfinite(grads[torch.float16]).all()
    err = (grads[torch.float16] - grads[torch.float64]).norm() / grads[torch.float64].norm()
    assert err < 0.01, err
    assert mixed_precision(torch.float16).param_dtype == torch.float16
    assert mixed_precision(torch.bfloat16).param_dtype == torch.bfloat16
    assert {mixed_precision(d).reduce_dtype for d in (torch.float16, torch.bfloat16)} == {
        torch.float32}
    assert mixed_precision(torch.float32).param_dtype is None
