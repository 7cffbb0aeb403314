"""`reasoner plan`: memory per device and time per step of every stage of a recipe, before any
of it runs, ending in "fits" or "does not fit: change X".

Training stages (sft, train-offline) are modelled as this project's trainer runs them
(models/footprint.py: what each process holds, by component; models/vocab_layout.py: how the
embedding and lm-head split); a stage needs its largest moment: training, train-offline's
scoring forward, or the loading of its weights (a note each), plus 10%. Generation stages (infer, eval, the judge) are modelled as vLLM
runs them: weights split over tensor parallelism, the rest of `gpu_memory_utilization` for the
KV cache, which must hold at least one sequence of `max_model_len` tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from reasoner.config import OfflineConfig, TrainerConfig
from reasoner.errors import ConfigError
from reasoner.models.footprint import (
    GIB,
    frozen_bytes,
    load_bytes,
    megatron_bytes,
    packed_mask_bytes,
    scoring_bytes,
    training_bytes,
)
from reasoner.models.sequence_parallel import check_heads
from reasoner.models.shapes import KNOWN, Shape, shape_of
from reasoner.models.vocab_layout import choose_vocab_layout, vocab_note
from reasoner.pipeline.step_time import (  # noqa: F401  (plan.PEAK_TFLOPS, plan.step_seconds)
    DEFAULT_LINK_GBPS,
    LINK_GBPS,
    PEAK_TFLOPS,
    collective_seconds,
    step_seconds,
    step_tokens,
)

NPU_KINDS = ("npu", "910b")

# Memory of one device of each named kind in GiB (2**30 bytes) as the device reports it, not as
# its data sheet names it ("24 GB" on an L4 is 22.49 GiB): nvidia-smi's memory.total (MiB) for
# the NVIDIA kinds; `gpu`, `npu` and `cpu` name no one device. `reasoner plan --kind` and the
# Slurm launcher's check (pipeline/cluster.py) read it when no --device-mem-gib is given.
DEVICE_MEM_GIB = {
    "h100": 81559 / 1024,  # H100 80GB HBM3: 81,559 MiB
    "h200": 143771 / 1024,  # H200 141GB HBM3e: 143,771 MiB
    "a100": 81920 / 1024,  # A100 80GB: 81,920 MiB (an A100 40GB has 40,960: give the memory)
    "l40s": 46068 / 1024,  # 46,068 MiB
    "a10g": 23028 / 1024,  # 23,028 MiB
    "l4": 23034 / 1024,  # 23,034 MiB
    "rtx4090": 24564 / 1024,  # 24,564 MiB
    # npu-smi info's HBM-Usage total, 65,536 MB (that is MiB), as a 64 GB 910B part reports
    # it (seen on a 910B4-1); it assumes a 64 GB part: give --device-mem-gib for a 32 GB one
    "910b": 65536 / 1024,
}
DEFAULT_MEM_GIB = 80.0  # a kind that names no one device, without --device-mem-gib


def device_mem_gib(kind: str, given: float | None = None) -> float:
    """GiB of one device: `given` (--device-mem-gib), else what a device of `kind` reports
    (DEVICE_MEM_GIB), else 80."""
    return given or DEVICE_MEM_GIB.get(kind, DEFAULT_MEM_GIB)


# --------------------------------------------------------------------------------------------
# The plan of a recipe


@dataclass
class MemoryEstimate:
    name: str
    command: str
    model: str
    devices: int
    parts: dict[str, float]  # GiB per device
    need_gib: float
    have_gib: float
    step_s: float | None
    verdict: str
    vocab: str = ""  # training: how the embedding and lm-head split, and the bytes it moves
    config: TrainerConfig | None = None  # training: the stage's config (what --rehearse runs)
    notes: list[str] = field(default_factory=list)  # what else the plan says of the stage

    @property
    def fits(self) -> bool:
        return self.verdict == "fits"


def plan_training(name: str, cfg: TrainerConfig, shape: Shape, model: str, devices: int,
                  mem_gib: float, kind: str, mfu: float, layout: str = "fsdp", tp: int = 8,
                  pp: int = 4, extra: float = 0, tflops: float | None = None,
                  scores: bool = False) -> MemoryEstimate:
    """Memory per device and time per step of an sft or train-offline stage; `extra`: bytes per
    parameter of the models kept beside the policy (`resident_bytes_per_param`); `scores`: the
    stage scores reference / behaviour log-probs before training (train-offline)."""
    dtype_bytes = _dtype_bytes(cfg, kind)
    sp = cfg.run.sequence_parallel
    masked = kind == "cpu" or cfg.model.attn_implementation in ("sdpa", "eager")
    per_step, attended, counted = step_tokens(cfg, masked and layout == "fsdp")
    step = step_seconds(shape, per_step, attended, devices, tflops or PEAK_TFLOPS[kind], mfu,
                        cfg.run.gradient_checkpointing)
    if layout == "mindspeed":
        estimate = _plan_mindspeed(name, cfg, shape, model, devices, mem_gib, step, tp, pp)
        estimate.notes.append(f"time per step: {counted}")
        return estimate
    refused = _sequence_parallel_refused(shape, model, sp, devices)
    parts, vocab, peaks = _fsdp_parts(cfg, shape, devices, mem_gib, dtype_bytes, extra)
    additive = 0 if kind in NPU_KINDS else dtype_bytes  # torch_npu takes the bool mask as is
    mask = packed_mask_bytes(cfg.run.micro_batch, cfg.row_tokens, sp, additive) \
        if cfg.packing else 0
    if mask and masked:  # no varlen kernel: the block mask of every micro-batch (attention.py)
        parts["packed-row mask (T x T)"] = mask
    if not scores:
        del peaks["scoring"]
    need = _need(parts, peaks)
    verdict = "fits"
    if refused:
        verdict = f"does not fit: {refused}"
    elif need > mem_gib and peaks["loading"] >= max(sum(parts.values()), *peaks.values()):
        verdict = (f"does not fit: loading the weights needs {need:.1f} GiB: use more devices "
                   "(each then reads only its shards) or devices with more memory")
    elif need > mem_gib:
        verdict = "does not fit: " + _advice(cfg, shape, devices, mem_gib, dtype_bytes, extra,
                                             parts)
    comm, moved = collective_seconds(cfg, shape, devices, kind, dtype_bytes, choose_vocab_layout(
        cfg, shape, devices, mem_gib, dtype_bytes, extra), _adapters(cfg, shape))
    estimate = MemoryEstimate(name, cfg.__class__.__name__, model, devices,
                              {k: v / GIB for k, v in parts.items()}, need, mem_gib, step + comm,
                              verdict, vocab)
    anchor = " and the fixed reference" if _anchor(cfg) else ""
    estimate.notes.append(f"time per step: {counted}" + (
        f": {step:.0f} s of compute + {comm:.0f} s of collectives ({moved:,.1f} GB a micro-batch "
        f"at {LINK_GBPS.get(kind, DEFAULT_LINK_GBPS):g} GB/s a device, assumed, not "
        "overlapped)" if devices > 1 else ""))
    estimate.notes.append(f"loading (the policy's weights{anchor} as they reach the device): "
                          f"{1.1 * peaks['loading'] / GIB:.1f} GiB")
    if scores:
        estimate.notes.append(f"scoring forward (reference / behaviour log-probs, no gradient"
                              f"{'; the fixed reference beside the policy' if anchor else ''}): "
                              f"{1.1 * peaks['scoring'] / GIB:.1f} GiB")
    if mask and not masked and kind != "cpu" and cfg.model.attn_implementation is None:
        kernel = ("flash-attn installed (pip install 'reasoner[flash]')" if kind not in NPU_KINDS
                  else "torch_npu's fused attention (flash_attention_2)")
        estimate.notes.append(f"packed rows assume {kernel}; under sdpa each micro-batch adds a "
                              f"T x T mask of {1.1 * mask / GIB:.2f} GiB")
    if sp > 1:
        estimate.notes.append(f"sequence parallel {sp}: each process {cfg.micro_batch_tokens:,} "
                              f"of a micro-batch's {cfg.run.micro_batch * cfg.row_tokens:,} "
                              "tokens")
    return estimate


def _plan_mindspeed(name: str, cfg: TrainerConfig, shape: Shape, model: str, devices: int,
                    mem_gib: float, step: float, tp: int, pp: int) -> MemoryEstimate:
    """`plan_training` of the stage as `reasoner export mindspeed` sets it up (TP x PP)."""
    if devices % (tp * pp):
        raise ConfigError(f"--devices {devices} is not a multiple of tp x pp = {tp * pp}")
    offline = isinstance(cfg, OfflineConfig)  # PCL's fork: one unpacked sample per micro-batch
    tokens = cfg.seq_len if offline else cfg.run.micro_batch * cfg.row_tokens
    parts = megatron_bytes(shape, devices, tokens, tp, pp, cfg.run.gradient_checkpointing)
    need = 1.1 * sum(parts.values()) / GIB
    estimate = MemoryEstimate(name, cfg.__class__.__name__, model, devices,
                              {k: v / GIB for k, v in parts.items()}, need, mem_gib, step,
                              "fits" if need <= mem_gib else "does not fit: raise tp / pp")
    if offline:
        estimate.notes.append(f"PCL's MindSpeed-LLM fork (--stage opg, `reasoner export "
                              f"mindspeed`): micro-batch 1, one sample of up to {tokens:,} "
                              "tokens; its --swap-optimizer moves optimizer state to host "
                              "memory, counted here as resident")
    return estimate


def _dtype_bytes(cfg: TrainerConfig, kind: str) -> int:
    fp32 = cfg.model.dtype == "float32" or (cfg.model.dtype == "auto" and kind == "cpu")
    return 4 if fp32 else 2


def _fsdp_parts(cfg: TrainerConfig, shape: Shape, devices: int, mem_gib: float,
                dtype_bytes: int, extra: float
                ) -> tuple[dict[str, float], str, dict[str, float]]:
    """This trainer's bytes per component while training, its vocabulary layout note, and the
    stage's two other peaks: its scoring forward and its loading."""
    tokens, lora, adapters = cfg.micro_batch_tokens, cfg.model.lora, _adapters(cfg, shape)
    layout = choose_vocab_layout(cfg, shape, devices, mem_gib, dtype_bytes, extra)
    parts = training_bytes(shape, devices, tokens, dtype_bytes, cfg.run.gradient_checkpointing,
                           cfg.run.logprob_chunk, extra, layout if devices > 1 else "whole",
                           adapters, shape.lora_inputs(lora.target_modules) if lora else 0)
    vocab = vocab_note(shape, devices, tokens, dtype_bytes, layout) if devices > 1 else ""
    # train-offline's fixed reference is loaded and scored while the policy is held
    anchor = frozen_bytes(shape, devices, dtype_bytes) if _anchor(cfg) else 0.0
    peaks = {"scoring": anchor + scoring_bytes(shape, devices, tokens, dtype_bytes,
                                               cfg.run.logprob_chunk,
                                               layout if devices > 1 else "whole", adapters),
             "loading": anchor + load_bytes(shape, devices, dtype_bytes, adapters)}
    return parts, vocab, peaks


def _adapters(cfg: TrainerConfig, shape: Shape) -> int:
    """LoRA's parameter count (0: the whole model trains)."""
    lora = cfg.model.lora
    return shape.lora_params(lora.r, lora.target_modules) if lora is not None else 0


def _anchor(cfg: TrainerConfig) -> bool:
    """Whether the stage loads a fixed reference model beside the policy (train-offline's
    `reference`)."""
    return isinstance(cfg, OfflineConfig) and cfg.reference is not None


MARGIN = 1.1  # what a rehearsal cannot see: context, comm buffers, workspaces, fragmentation


def _need(parts: dict[str, float], peaks: dict[str, float]) -> float:
    """GiB per device the stage needs: its largest moment (training, scoring, loading), plus
    `MARGIN`."""
    return MARGIN * max(sum(parts.values()), *peaks.values()) / GIB


def _sequence_parallel_refused(shape: Shape, model: str, sp: int, devices: int) -> str:
    """Why run.sequence_parallel cannot run here ("" when it can)."""
    if sp > 1 and devices % sp:
        return f"run.sequence_parallel={sp} does not divide {devices} devices into groups"
    try:
        check_heads(shape.heads, shape.kv_heads, sp, model)
    except ConfigError as exc:
        return str(exc)
    return ""


def _advice(cfg: TrainerConfig, shape: Shape, devices: int, mem_gib: float, dtype_bytes: int,
            extra: float, parts: dict[str, float]) -> str:
    """What to change: a larger sequence-parallel size where one fits (whatever the largest
    part: it divides activations and log-prob chunks), then what shrinks the largest part;
    never a setting that is already on."""
    biggest = max(parts, key=parts.get)
    options = []
    if biggest == "activations" and not cfg.run.gradient_checkpointing:
        options.append("turn on run.gradient_checkpointing")
    fitting = _fitting_sequence_parallel(cfg, shape, devices, mem_gib, dtype_bytes, extra)
    if fitting:
        options.append(f"set run.sequence_parallel={fitting[0]} (then {fitting[1]:.1f} GiB "
                       "per device)")
    options.append({"activations": "lower seq_len / micro_batch (drops the long samples)",
                    "logits chunk": "lower run.logprob_chunk",
                    "temporaries": "lower run.logprob_chunk or set run.vocab_layout=vocab-parallel",
                    "gathered weights": "use devices with more memory",
                    "reference / token RM": "drop the moving reference / token RM"}.get(
                        biggest, "use more devices"))
    return f"{', or '.join(options)} ({biggest} is the largest part)"


def _fitting_sequence_parallel(cfg: TrainerConfig, shape: Shape, devices: int, mem_gib: float,
                               dtype_bytes: int, extra: float) -> tuple[int, float] | None:
    """The smallest sequence-parallel size above the configured one that the model's heads
    allow, that divides the devices within one node (8), and that fits: (size, GiB)."""
    for sp in range(cfg.run.sequence_parallel + 1, min(devices, 8) + 1):
        if devices % sp or _sequence_parallel_refused(shape, "", sp, devices):
            continue
        trial = cfg.model_copy(update={"run": cfg.run.model_copy(
            update={"sequence_parallel": sp})})
        parts, _, peaks = _fsdp_parts(trial, shape, devices, mem_gib, dtype_bytes, extra)
        need = _need(parts, peaks)
        if need <= mem_gib:
            return sp, need
    return None


def plan_generation(name: str, model: str, shape: Shape, dtype: str, tp: int, utilization: float,
                    max_model_len: int, devices: int, mem_gib: float) -> MemoryEstimate:
    dtype_bytes = 4 if dtype == "float32" else 2
    weights = dtype_bytes * shape.params / tp
    reserve = 2 * GIB  # activations, CUDA graphs, sampler
    kv_one = shape.kv_cache_bytes_per_token(dtype_bytes, tp) * max_model_len
    budget = utilization * mem_gib * GIB - weights - reserve
    parts = {"weights": weights / GIB, "activation reserve": reserve / GIB,
             "KV cache, 1 full sequence": kv_one / GIB}
    if tp > devices:
        verdict = f"does not fit: tensor_parallel_size {tp} > {devices} devices"
    elif budget < kv_one:
        verdict = ("does not fit: raise tensor_parallel_size or gpu_memory_utilization, or "
                   "lower max_model_len")
    else:
        verdict = "fits"
        parts["full sequences at once"] = math.floor(budget / kv_one)
    return MemoryEstimate(name, "vllm", model, tp, parts, (weights + reserve + kv_one) / GIB,
                          utilization * mem_gib, None, verdict)


def plan_recipe(path: Path, devices: int, mem_gib: float | None, kind: str = "gpu",
                mfu: float = 0.35, overrides: list[str] | None = None, layout: str = "fsdp",
                tp: int = 8, pp: int = 4, tflops: float | None = None) -> list[MemoryEstimate]:
    """Every stage of a recipe, with the start model's shape for the models it trains;
    `mem_gib` None: what a device of `kind` reports (`device_mem_gib`)."""
    from reasoner.pipeline.recipe import load_recipe
    from reasoner.pipeline.resolve import resolve

    mem_gib = device_mem_gib(kind, mem_gib)
    recipe = load_recipe(path, overrides or [])
    stages = resolve(recipe, path.parent)
    start = next((s.config.model.name_or_path for s in stages if s.command == "sft"),
                 recipe.start_model)
    plans = []
    for st in stages:
        cfg = st.config
        if st.command in ("sft", "train-offline"):
            src = cfg.model.name_or_path if st.command == "sft" else start
            src = src if Path(src).exists() or src in KNOWN else start
            extra = resident_bytes(cfg, shape_of(src)) if st.command == "train-offline" else 0
            plans.append(plan_training(st.name, cfg, shape_of(src), src, devices, mem_gib, kind,
                                       mfu, layout, tp, pp, extra, tflops,
                                       scores=st.command == "train-offline"))
            plans[-1].command, plans[-1].config = st.command, cfg
        elif st.command in ("infer", "eval") and cfg.backend != "openai":  # a server's: not here
            src = cfg.model.name_or_path
            src = src if Path(src).exists() or src in KNOWN else start
            plans.append(plan_generation(st.name, src, shape_of(src), cfg.model.dtype,
                                         cfg.vllm.tensor_parallel_size,
                                         cfg.vllm.gpu_memory_utilization,
                                         cfg.max_model_len or 32768, devices, mem_gib))
            plans[-1].command = st.command
        elif st.command == "verify" and cfg.mode != "rule" and cfg.judge.backend != "openai":
            j = cfg.judge
            plans.append(plan_generation(st.name, j.model.name_or_path,
                                         shape_of(j.model.name_or_path), j.model.dtype,
                                         j.vllm.tensor_parallel_size,
                                         j.vllm.gpu_memory_utilization,
                                         j.max_model_len or 32768, devices, mem_gib))
            plans[-1].command = "judge"
    return plans


def resident_bytes(cfg: OfflineConfig, shape: Shape) -> float:
    """Bytes per policy parameter of what train-offline keeps beside the policy: the
    objective's (`resident_bytes_per_param`), with a LoRA run's moving reference a second
    adapter set (4 bytes per adapter parameter) instead of a second model, and a token RM's
    untied lm-head frozen."""
    obj, lora = cfg.objective, cfg.model.lora
    extra = float(obj.resident_bytes_per_param)
    if lora is not None and obj.resident_reference:
        extra += 4 * (shape.lora_params(lora.r, lora.target_modules) / shape.params - 1)
    if obj.uses_token_rm and not shape.tied:  # the RM scores from its trunk: an untied
        # lm-head is frozen, its weights held but no gradient or AdamW state (12 bytes less)
        extra -= 12 * shape.vocab * shape.hidden / shape.params
    return extra


def check_before_run(recipe: Path, overrides: list[str]) -> list[MemoryEstimate]:
    """`reasoner run`'s check on a GPU / NPU machine: the stages that would not fit on this
    node's devices (none on a CPU-only machine)."""
    from reasoner import device as dev

    found = dev.local_devices()
    if found is None:
        return []
    kind, n, mem = found
    return [p for p in plan_recipe(recipe, n, mem, kind, overrides=overrides) if not p.fits]
