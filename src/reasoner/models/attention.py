"""Which attention kernel a trainer runs, and how packed rows reach it.

Packed rows keep their samples apart through their position ids, which restart at 0 for
every sample (`data.packing`). With a flash backend (flash-attention on CUDA; on Ascend,
transformers routes `flash_attention_2` to torch_npu's fused attention) the packed rows of a
micro-batch are flattened into one row and the kernel finds the samples from the position ids
(varlen): no mask, no T x T scores. Elsewhere (sdpa, eager) no mask is passed either:
transformers derives the block-diagonal causal mask from the restarting position ids, on the
device, as the kernel wants it (a bool mask of ours was added to eager's scores as 0 / 1). A
dense (1, 1, T, T) mask built on the host (1 GiB at 32K tokens) is never made. sdpa runs as
`shared_mask.SHARED_MASK_SDPA` (not on NPU): the same kernel, with the additive form of the mask
made once for every layer instead of once per layer.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

from reasoner.device import flash_attention_available
from reasoner.errors import ConfigError, DependencyError
from reasoner.models import sequence_parallel, shared_mask
from reasoner.models.footprint import packed_mask_bytes
from reasoner.models.sequence_parallel import SequenceGroup

FLASH = "flash_attention_2"
LOW_PRECISION = (torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class AttentionPlan:
    implementation: str  # transformers' attn_implementation
    varlen: bool  # packed rows go flat, one row per micro-batch (a varlen kernel, or split)
    kernel: str = ""  # under sequence parallelism: the kernel the Ulysses attention calls
    warning: str = ""  # said at the start of the run (`warn`): packed rows without varlen


def plan_attention(requested: str | None, device: torch.device, dtype: torch.dtype,
                   packing: bool, sp: SequenceGroup | None = None, micro_batch: int = 1,
                   row_tokens: int = 0) -> AttentionPlan:
    """The kernel for a trainer computing in `dtype` on `device` (`requested`: the config's
    model.attn_implementation, None for the best available). With a sequence-parallel group
    the model runs the Ulysses attention (models.sequence_parallel) around that kernel, on
    flat rows. Packed rows of `row_tokens` on a GPU / NPU without a varlen kernel get a
    warning with the bytes of their T x T mask."""
    flash_here = device.type == "npu" or flash_attention_available(device)
    if requested is None:
        implementation = FLASH if flash_here and dtype in LOW_PRECISION else "sdpa"
    else:
        implementation = requested
    if implementation.startswith("flash_attention"):
        if dtype not in LOW_PRECISION:
            raise ConfigError(
                f"model.attn_implementation={implementation} computes in bf16 / fp16, but this "
                f"run computes in {str(dtype).removeprefix('torch.')}: set model.dtype=bfloat16, "
                "or model.attn_implementation=sdpa")
        if device.type == "cuda" and not flash_here:
            raise DependencyError(
                f"model.attn_implementation={implementation} needs the flash-attn package: "
                "pip install 'reasoner[flash]' (or leave the setting out to use sdpa)")
        if device.type not in ("cuda", "npu"):
            raise ConfigError(f"model.attn_implementation={implementation} runs on CUDA or Ascend "
                              f"devices, not {device.type}: leave it out to use sdpa")
    warning = ""
    if packing and device.type in ("cuda", "npu") and not implementation.startswith("flash"):
        warning = _mask_warning(implementation, device, micro_batch, row_tokens,
                                sp.size if sp is not None and sp.on else 1,
                                torch.empty((), dtype=dtype).element_size())
    if sp is not None and sp.on:
        return AttentionPlan(sequence_parallel.enable(sp, implementation), True, implementation,
                             warning)
    varlen = packing and implementation.startswith("flash_attention")
    if implementation == "sdpa" and device.type != "npu":  # (torch_npu wants a bool mask)
        implementation = shared_mask.register()
    return AttentionPlan(implementation, varlen, warning=warning)


def _mask_warning(implementation: str, device: torch.device, micro_batch: int, row_tokens: int,
                  sp: int, dtype_bytes: int = 2) -> str:
    """What packed rows cost without a varlen kernel, in the plan's words: the bool mask and,
    except on NPU, its additive form in the compute dtype."""
    additive = 0 if device.type == "npu" else dtype_bytes
    gib = packed_mask_bytes(micro_batch, row_tokens, sp, additive) / 2**30
    fix = ("pip install 'reasoner[flash]' and leave model.attn_implementation out"
           if device.type == "cuda" else "leave model.attn_implementation out (flash_attention_2 "
           "runs torch_npu's fused attention)")
    return (f"warning: packed rows under {implementation} on {device.type}: no varlen kernel, so "
            f"each micro-batch builds a T x T block mask on the device ({gib:.2f} GiB"
            f"{' with its additive form' if additive else ''} at "
            f"{micro_batch} x {row_tokens:,} tokens, the plan's 'packed-row mask' term) and the "
            f"masked kernel computes every block of the T x T scores; {fix}")


def warn(plan: AttentionPlan, is_main: bool) -> None:
    """Print the plan's warning once (the main process), at the start of a run."""
    if plan.warning and is_main:
        print(f"reasoner: {plan.warning}", file=sys.stderr)
