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
    average or a pre-multiplied sum (HCCL refuses AVG, gloo and HCCL lack PREMUL_SUM): before,
    FSDP2 reduce-scattered with AVG and the trainer multiplied the result back. The gradient is
    the sum over processes with no divide anywhere: the whole model's, to fp32 precision. With
    bf16, FSDP2 all-gathers bf16 parameters (before: fp32, twice the traffic) and still
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


def test_vocab_traffic_grows_with_processes_only_when_vocab_parallel():
    from reasoner.errors import ConfigError
    from reasoner.models.fsdp import VocabSplit, vocab_layout, vocab_traffic_bytes

    big = dict(tokens=32768, hidden=5120, vocab=152064, untied=True)  # Qwen2.5-32B, 32K rows
    vp = [vocab_traffic_bytes("vocab-parallel", w, **big) for w in (2, 4, 64)]
    fs = [vocab_traffic_bytes("fsdp", w, **big) for w in (2, 4, 64)]
    assert vp[1] == 2 * vp[0] and vp[2] == 32 * vp[0]  # linear in the processes
    assert fs[2] < 2 * fs[0] and fs[2] == pytest.approx(63 / 64 * 2 * 152064 * 5120 * 8)
    # auto: the cheaper one (2 processes of 32K tokens: vocab-parallel; 64: FSDP2 units)
    assert vocab_layout(VocabSplit("auto", 32768), 2, 5120, 152064, tied=False) == "vocab-parallel"
    assert vocab_layout(VocabSplit("auto", 32768), 64, 5120, 152064, tied=False) == "fsdp"
    assert vocab_layout(VocabSplit("auto", 32768), 64, 5120, 152064, tied=True) == "vocab-parallel"
    with pytest.raises(ConfigError, match="needs untied embeddings"):
        vocab_layout(VocabSplit("fsdp", 32768), 64, 896, 151936, tied=True)
    # fsdp chosen by auto for an untied policy; a tied reference model beside it stays split
    assert vocab_layout(VocabSplit("fsdp", 32768, chosen=True), 64, 896, 151936,
                        tied=True) == "vocab-parallel"


@pytest.mark.slow
def test_the_plans_traffic_is_what_the_processes_send(tmp_path):
    """scripts/bench_comm.py's count on 2 gloo processes, both layouts: the bytes each process
    receives for the embedding and lm-head per micro-batch are the plan's, within 2%."""
    import sys

    from reasoner.models.fsdp import vocab_traffic_bytes

    script = Path(__file__).parents[3] / "scripts" / "bench_comm.py"
    for layout in ("vocab-parallel", "fsdp"):
        out = tmp_path / f"{layout}.json"
        done = subprocess.run(torchrun_two_processes(script, "--worker", layout, out),
                              capture_output=True, text=True, env=SUBPROCESS_ENV, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        got = max(json.loads(Path(f"{out}.{r}").read_text())["vocab"] for r in (0, 1))
        sys.path.insert(0, str(script.parent))
        from bench_comm import HIDDEN, TOKENS, VOCAB

        plan = vocab_traffic_bytes(layout, 2, TOKENS, HIDDEN, VOCAB, True, 2, 2)
        assert got == pytest.approx(plan, rel=0.02), (layout, got, plan)
