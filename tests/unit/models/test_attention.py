"""Which attention kernel the trainers run, on fake devices (no GPU / NPU here)."""

from types import SimpleNamespace

import pytest
import torch

from reasoner.errors import ConfigError, DependencyError
from reasoner.models import attention
from reasoner.models.attention import AttentionPlan, plan_attention
from reasoner.models.shared_mask import SHARED_MASK_SDPA

CUDA, CPU = torch.device("cuda", 0), torch.device("cpu")
NPU = SimpleNamespace(type="npu")  # torch knows "npu" only once torch_npu is imported
BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32


@pytest.fixture
def flash_installed(monkeypatch):
    monkeypatch.setattr(attention, "flash_attention_available", lambda d: d.type == "cuda")


@pytest.fixture
def flash_absent(monkeypatch):
    monkeypatch.setattr(attention, "flash_attention_available", lambda d: False)


def test_packing_on_a_gpu_with_flash_attention_is_varlen_in_bf16_and_fp16(flash_installed):
    for dtype in (BF16, FP16):
        assert plan_attention(None, CUDA, dtype, True) == AttentionPlan("flash_attention_2", True)
    # padded rows use flash-attention too (its unpadding path), without flattening
    assert plan_attention(None, CUDA, BF16, False) == AttentionPlan("flash_attention_2", False)


def test_ascend_gets_the_fused_attention_transformers_routes_flash_attention_2_to():
    assert plan_attention(None, NPU, BF16, True) == AttentionPlan("flash_attention_2", True)


def test_never_flash_with_fp32(flash_installed):
    """An fp32 run gets sdpa whatever is installed, and asking for flash-attention in fp32 is
    refused before any work (flash kernels compute in bf16 / fp16 only)."""
    for device in (CUDA, NPU):
        got = plan_attention(None, device, FP32, True)
        # sdpa with one additive mask for every layer; torch_npu's sdpa wants the bool mask
        want = "sdpa" if device is NPU else SHARED_MASK_SDPA
        assert (got.implementation, got.varlen) == (want, False) and got.warning
    with pytest.raises(ConfigError, match="computes in bf16 / fp16, but this run computes in "
                                          "float32: set model.dtype=bfloat16"):
        plan_attention("flash_attention_2", CUDA, FP32, True)


def test_without_flash_attn_sdpa_and_asking_for_it_names_the_extra(flash_absent):
    got = plan_attention(None, CUDA, BF16, True)
    assert (got.implementation, got.varlen) == (SHARED_MASK_SDPA, False)
    with pytest.raises(DependencyError, match=r"pip install 'reasoner\[flash\]'"):
        plan_attention("flash_attention_2", CUDA, BF16, True)


def test_packed_rows_without_a_varlen_kernel_on_a_device_are_said_with_their_mask_bytes(
        flash_absent, capsys):
    """PCL's 51,200-token rows under sdpa on a GPU without flash-attn: a (1, 1, T, T) bool mask
    of 2.44 GiB per micro-batch and its bf16 additive form (4.88 GiB), said at the start with
    the fix; on NPU the bool mask only. Sequence parallelism flattens the micro-batch (2 rows of
    32K: one (64K)^2-byte mask, 4 GiB, not 2 x 1 GiB). Padded rows, varlen kernels and the CPU
    are not warned about."""
    got = plan_attention(None, CUDA, BF16, True, micro_batch=1, row_tokens=51_200)
    assert "7.32 GiB with its additive form at 1 x 51,200 tokens" in got.warning
    assert "pip install 'reasoner[flash]'" in got.warning
    npu = plan_attention("sdpa", NPU, BF16, True, micro_batch=2, row_tokens=32_768)
    assert "2.00 GiB at 2 x 32,768 tokens" in npu.warning
    assert "torch_npu" in npu.warning
    assert attention._mask_warning("sdpa", NPU, 2, 32_768, sp=2).count("4.00 GiB") == 1
    attention.warn(got, is_main=True)
    attention.warn(got, is_main=False)
    assert capsys.readouterr().err.count("no varlen kernel") == 1
    assert not plan_attention(None, CUDA, BF16, False, row_tokens=51_200).warning
    assert not plan_attention(None, CPU, FP32, True, row_tokens=51_200).warning


def test_cpu_runs_sdpa_or_what_is_asked_and_never_flat(flash_absent):
    assert plan_attention(None, CPU, FP32, True) == AttentionPlan(SHARED_MASK_SDPA, False)
    assert plan_attention("eager", CPU, BF16, True) == AttentionPlan("eager", False)
    with pytest.raises(ConfigError, match="runs on CUDA or Ascend devices, not cpu"):
        plan_attention("flash_attention_2", CPU, BF16, True)


def test_train_offline_never_sends_a_dense_mask(tmp_path, tiny_model_dir, verified_dir):
    """train-offline's packed micro-batches carry no mask (position ids keep the samples apart):
    never a (B, 1, T, T) host mask, and one flat row when the kernel is varlen."""
    from reasoner.config import OfflineConfig
    from reasoner.models import load_tokenizer
    from reasoner.train_offline.rollouts import Batching, load_rollouts

    cfg = OfflineConfig.model_validate({
        "model": {"name_or_path": str(tiny_model_dir)}, "input_dir": str(verified_dir),
        "output_dir": str(tmp_path), "seq_len": 256, "max_tokens": 256})
    data = load_rollouts(cfg, load_tokenizer(str(tiny_model_dir)))
    for varlen in (False, True):
        batching = Batching.of(cfg, 0, varlen)
        mb = batching.micro_batches(list(range(6)), data)[0]
        batch = batching.collate(data, mb)
        assert batch.attention_mask is None
        assert batch.input_ids.shape[0] == (1 if varlen else len(mb))
