"""Which attention kernel the trainers run, on fake devices (no GPU / NPU here)."""

from types import SimpleNamespace

import pytest
import torch

from reasoner.errors import ConfigError, DependencyError
from reasoner.models import attention
from reasoner.models.attention import AttentionPlan, plan_attention

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
    assert plan_attention(None, CUDA, FP32, True) == AttentionPlan("sdpa", False)
    assert plan_attention(None, NPU, FP32, True) == AttentionPlan("sdpa", False)
    with pytest.raises(ConfigError, match="computes in bf16 / fp16, but this run computes in "
                                          "float32: set model.dtype=bfloat16"):
        plan_attention("flash_attention_2", CUDA, FP32, True)


def test_without_flash_attn_sdpa_and_asking_for_it_names_the_extra(flash_absent):
    assert plan_attention(None, CUDA, BF16, True) == AttentionPlan("sdpa", False)
    with pytest.raises(DependencyError, match=r"pip install 'reasoner\[flash\]'"):
        plan_attention("flash_attention_2", CUDA, BF16, True)


def test_cpu_runs_sdpa_or_what_is_asked_and_never_flat(flash_absent):
    assert plan_attention(None, CPU, FP32, True) == AttentionPlan("sdpa", False)
    assert plan_attention("eager", CPU, BF16, True) == AttentionPlan("eager", False)
    with pytest.raises(ConfigError, match="runs on CUDA or Ascend devices, not cpu"):
        plan_attention("flash_attention_2", CPU, BF16, True)


def test_train_offline_never_sends_a_dense_mask(tmp_path, tiny_model_dir, verified_dir):
    """train-offline's packed micro-batches carry no mask (position ids keep the samples apart):
    never a (B, 1, T, T) host mask, and one flat row when the kernel is varlen."""
    from reasoner.config import OfflineConfig
    from reasoner.models import load_tokenizer
    from reasoner.rl.rollouts import Batching, load_rollouts

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
