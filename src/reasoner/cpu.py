"""What this CPU computes natively, probed once with torch's own checks.

Every CPU fast path asks here instead of assuming the machine it was written on:
- `model.dtype: auto` picks bf16 on a CPU only where it is native (AVX512-BF16 or AMX, with
  ATen's and oneDNN's kernels allowed to use them), fp32 elsewhere. On an AVX2-only CPU bf16 is
  emulated: a 1024^2 bf16 matmul ran about 70x slower than fp32 on a 2-core AVX2 EPYC.
- the hf decode step's oneDNN weight prepack runs only where oneDNN's bf16 kernels can
  (`mkldnn_reorder_linear_weight` refuses a CPU without avx_ne_convert or AVX-512 BW/VL/DQ).

`ATEN_CPU_CAPABILITY=avx2`, `ONEDNN_MAX_CPU_ISA=AVX2` and `MKL_ENABLE_INSTRUCTIONS=AVX2` make a
newer CPU compute as an AVX2-only one (ATen, oneDNN and MKL read them when torch loads); `REASONER_CPU_BF16=0` (or `1`) sets
whether bf16 counts as native for `auto`, whatever the probe says.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache

import torch

SLOW_BF16 = ("bf16 is emulated on this CPU (no AVX512-BF16 or AMX): measured about 70x slower "
             "than fp32 on an AVX2-only CPU")


@dataclass(frozen=True)
class CpuFeatures:
    """The probe's answers (see `features`)."""

    capability: str  # ATen's kernel set: DEFAULT, AVX2, AVX512 (ATEN_CPU_CAPABILITY lowers it)
    onednn_bf16: bool  # oneDNN's bf16 kernels run here (its weight prepack refuses otherwise)
    bf16_instructions: bool  # the CPU has AVX512-BF16 or AMX tiles
    amx: bool
    forced: str | None = None  # REASONER_CPU_BF16 as given, when it overrides the probe

    @property
    def native_bf16(self) -> bool:
        """bf16 is computed by the CPU's own instructions through both ATen and oneDNN."""
        if self.forced is not None:
            return self.forced == "1"
        return self.onednn_bf16 and self.bf16_instructions and self.capability not in (
            "DEFAULT", "AVX2", "NO AVX")

    @property
    def prepacks_bf16(self) -> bool:
        """oneDNN can hold a bf16 weight in its blocked layout (same numbers, fewer reorders)."""
        return self.onednn_bf16 and _has_prepack()

    def describe(self, dtype: torch.dtype | None = None) -> str:
        """One line for the start of a run: what the CPU has and which path the run takes."""
        units = "AMX" if self.amx else "AVX512-BF16" if self.bf16_instructions else "no bf16 units"
        if self.bf16_instructions and self.forced is None and not self.native_bf16:
            units += " (unused: the kernels are capped below them)"
        line = f"CPU path: {self.capability} kernels, {units}, bf16 " + (
            "native" if self.native_bf16 else "emulated")
        if self.forced is not None:
            line += f" (REASONER_CPU_BF16={self.forced})"
        if dtype is not None:
            name = str(dtype).removeprefix("torch.")
            line += f"; computing in {name}"
            if dtype == torch.bfloat16:
                line += ", oneDNN prepacked decode" if self.prepacks_bf16 else ", plain decode"
        return line


@lru_cache(maxsize=1)
def features() -> CpuFeatures:
    """This CPU's answers, probed once (torch reads the CPU and the two variables at load)."""
    forced = os.environ.get("REASONER_CPU_BF16", "").strip() or None
    if forced not in (None, "0", "1"):
        from reasoner.errors import InputError

        raise InputError(f"REASONER_CPU_BF16={forced!r}: use 1 (bf16 counts as native for "
                         "model.dtype: auto), 0 (it does not), or leave it unset (probed)")
    cpu = torch.cpu
    return CpuFeatures(
        capability=torch.backends.cpu.get_cpu_capability(),
        onednn_bf16=torch.backends.mkldnn.is_available()
        and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
        bf16_instructions=bool(cpu._is_avx512_bf16_supported() or cpu._is_amx_tile_supported()),
        amx=bool(cpu._is_amx_tile_supported()),
        forced=forced)


def _has_prepack() -> bool:
    """This torch has oneDNN's prepacked linear (the ops inductor's CPU backend uses)."""
    return torch.backends.mkldnn.is_available() and all(
        hasattr(torch.ops.mkldnn, op) for op in ("_reorder_linear_weight", "_linear_pointwise"))


def auto_dtype() -> torch.dtype:
    """`model.dtype: auto` on a CPU: bf16 where native, fp32 elsewhere."""
    return torch.bfloat16 if features().native_bf16 else torch.float32
