"""The CPU probe picks each fast path by what the CPU has, and both branches run on any CPU: the
probe's answers are faked here, and an AVX2-only CPU is simulated in a child process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from reasoner import cpu, device
from reasoner.errors import InputError

AMX = cpu.CpuFeatures("AVX512", onednn_bf16=True, bf16_instructions=True, amx=True)
AVX512 = cpu.CpuFeatures("AVX512", onednn_bf16=True, bf16_instructions=False, amx=False)
AVX2 = cpu.CpuFeatures("AVX2", onednn_bf16=False, bf16_instructions=False, amx=False)
# a Zen 4 / Sapphire Rapids run under ATEN_CPU_CAPABILITY=avx2 alone: units there, ATen's
# kernels not using them
ATEN_AVX2 = cpu.CpuFeatures("AVX2", onednn_bf16=True, bf16_instructions=True, amx=True)

# what torch makes an AVX2-only CPU of any newer x86 one (ATen, oneDNN and MKL's sgemm read them
# when torch loads)
AVX2_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
            "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


@pytest.fixture
def fake(monkeypatch):
    """Make the probe answer `found` (and forget the run's CPU line, said once per process)."""
    def use(found: cpu.CpuFeatures) -> None:
        monkeypatch.setattr(cpu, "features", lambda: found)
        device._say_cpu_path.cache_clear()
    yield use
    device._say_cpu_path.cache_clear()


@pytest.mark.parametrize(("found", "native", "prepacks"), [
    (AMX, True, True), (AVX512, False, True), (AVX2, False, False), (ATEN_AVX2, False, True)])
def test_bf16_counts_as_native_only_with_the_units_and_both_libraries_using_them(
        found, native, prepacks):
    assert found.native_bf16 is native
    assert found.prepacks_bf16 is (prepacks and cpu._has_prepack())


@pytest.mark.parametrize(("found", "dtype"), [(AMX, torch.bfloat16), (AVX512, torch.float32),
                                              (AVX2, torch.float32)])
def test_auto_picks_bf16_on_a_cpu_only_where_it_is_native(fake, found, dtype):
    fake(found)
    assert device.pick_dtype("auto", torch.device("cpu")) == dtype
    assert device.pick_dtype("float32", torch.device("cpu")) == torch.float32
    assert device.pick_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16  # asked: given


def test_the_override_decides_for_auto_but_never_enables_a_refused_prepack():
    forced_on = cpu.CpuFeatures("AVX2", False, False, False, forced="1")
    assert forced_on.native_bf16 and not forced_on.prepacks_bf16
    forced_off = cpu.CpuFeatures("AVX512", True, True, True, forced="0")
    assert not forced_off.native_bf16 and forced_off.prepacks_bf16 == cpu._has_prepack()


def test_a_bad_override_is_one_clear_error(monkeypatch):
    monkeypatch.setenv("REASONER_CPU_BF16", "yes")
    cpu.features.cache_clear()
    try:
        with pytest.raises(InputError, match="REASONER_CPU_BF16='yes': use 1"):
            cpu.features()
    finally:
        monkeypatch.undo()
        cpu.features.cache_clear()


def test_the_probe_reads_torch_s_own_checks(monkeypatch):
    monkeypatch.delenv("REASONER_CPU_BF16", raising=False)
    cpu.features.cache_clear()
    try:
        found = cpu.features()
    finally:
        monkeypatch.undo()
        cpu.features.cache_clear()
    assert found.capability == torch.backends.cpu.get_cpu_capability()
    assert found.onednn_bf16 == bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    assert found.amx == bool(torch.cpu._is_amx_tile_supported())
    assert found.forced is None


@pytest.mark.parametrize(("found", "says"), [
    (AMX, "CPU path: AVX512 kernels, AMX, bf16 native; computing in bfloat16, oneDNN prepacked"),
    (AVX2, "CPU path: AVX2 kernels, no bf16 units, bf16 emulated; computing in float32")])
def test_a_cpu_run_says_which_path_it_took_once(fake, capsys, found, says):
    fake(found)
    for _ in range(2):
        device.pick_dtype("auto", torch.device("cpu"))
    err = capsys.readouterr().err
    if found is AMX and not cpu._has_prepack():
        says = says.replace("oneDNN prepacked", "plain")
    assert err.count("reasoner: CPU path") == 1 and says in err


def test_bf16_asked_for_on_a_cpu_without_it_warns_what_it_costs(fake, capsys):
    fake(AVX2)
    assert device.pick_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16
    err = capsys.readouterr().err
    assert "bf16 emulated; computing in bfloat16, plain decode; warning: bf16 is emulated" in err
    assert "70x slower" in err and "model.dtype: auto" in err


def test_the_decode_step_takes_the_plain_matmul_where_the_prepack_is_refused(fake,
                                                                             tiny_model_dir):
    """Faked AVX2: no prepacked weight, and the step's logits equal the prepacked step's where
    this CPU has one (bit for bit: the same kernels' numbers)."""
    from tests_helpers import step_logits
    from transformers import AutoModelForCausalLM

    from reasoner.infer.decode_step import DecodeStep

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16,
                                                 attn_implementation="sdpa").eval()
    fake(AVX2)
    plain = DecodeStep.for_model(model)
    assert plain.lm_head.packed is None and all(q.packed is None for q in plain.qkv)
    plain_logits = step_logits(model, plain)
    fake(AMX)
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported() or not cpu._has_prepack():
        pytest.skip("this CPU's oneDNN has no bf16 kernels: the prepacked branch cannot run")
    packed = DecodeStep.for_model(model)
    assert packed.lm_head.packed is not None
    assert torch.equal(step_logits(model, packed), plain_logits)


def test_on_a_simulated_avx2_cpu_the_bf16_decode_step_runs_and_auto_is_fp32(tiny_model_dir):
    """A child with torch's kernel sets capped at AVX2 (the variables the probe cannot be told
    apart from a real AVX2-only CPU by): the probe says so, auto is fp32, and the bf16 decode
    step runs instead of dying in oneDNN's prepack (`mkldnn_reorder_linear_weight: bf16 path
    needs the cpu support avx_ne_convert or avx512bw, avx512vl and avx512dq`)."""
    code = textwrap.dedent(f"""
        import torch
        from transformers import AutoModelForCausalLM
        from reasoner import cpu, device
        from reasoner.infer.decode_step import DecodeStep
        from tests_helpers import step_logits
        found = cpu.features()
        assert found.capability == "AVX2" and not found.native_bf16, found
        assert not found.prepacks_bf16, found
        assert device.pick_dtype("auto", torch.device("cpu")) == torch.float32
        model = AutoModelForCausalLM.from_pretrained({str(tiny_model_dir)!r},
            dtype=torch.bfloat16, attn_implementation="sdpa").eval()
        logits = step_logits(model, DecodeStep.for_model(model))
        assert logits.isfinite().all()
        print("ok")
    """)
    env = {k: v for k, v in os.environ.items() if k != "REASONER_CPU_BF16"}
    env.update(AVX2_ENV, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
    assert "CPU path: AVX2 kernels" in done.stderr
