"""`reasoner plan RECIPE --rehearse`: each training stage's own step run at the recipe's shapes
and world size on fake tensors, its memory per process measured, beside the plan's arithmetic.

One process stands for rank 0 of `devices`: a fake process group of the real world size (its
sequence-parallel groups real), the model built on the meta device from its config and sharded
by the loader's own code (`models.fsdp.build_sharded`: FSDP2 units, vocabulary layout, mixed
precision), the trainer's state from `training.start` (optimiser, fp16 loss scaler, gradient
checkpointing), and then, under torch's FakeTensorMode, two optimiser steps of two micro-batches
each through the trainer's own functions: sft's `step_loss` or train-offline's `MicroStep`
(forward, loss, backward) and the loop's `unscale_and_clip`, then the optimiser's step, as
`training.optimizer_step` applies a finite gradient. Each micro-batch is one row of the recipe's
longest samples (`seq_len` tokens). torch's `FSDPMemTracker` counts every tensor by category;
the peak is the second step's (the first has no optimiser state yet). A moving reference (ProRL's
resets, the discounted objective's average) is a second copy sharded alike, scored in every
micro-batch and moved by the trainer's `move_reference`; its shards are a line of their own.
Attention on a GPU or NPU runs through a stand-in of its kernel (models/stand_ins.py).

What a rehearsal cannot see: the CUDA / CANN context, NCCL / HCCL buffers, cuBLAS and attention
workspaces, the allocator's fragmentation (the plan's 10% margin stands for them: `plan.MARGIN`),
nor kernel speed (time per step comes from its FLOPs at an assumed MFU and its collectives'
bytes at an assumed link bandwidth).
"""

from __future__ import annotations

import itertools
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reasoner.config import OfflineConfig, TrainerConfig
from reasoner.errors import ConfigError
from reasoner.models.shapes import KNOWN
from reasoner.pipeline.rehearsal_step import MICRO_BATCHES, PROMPT  # noqa: F401  (re-exported)

GIB = 2**30
STEPS = 2  # optimiser steps rehearsed
# the tracker's categories under the plan's lines (models.footprint.sharded_bytes)
LINES = {"weight shards": ("Sharded Param", "Buffer"), "gradient shards": ("Sharded Grad",),
         "AdamW state": ("OptState",), "gathered weights": ("Unsharded Param", "Unsharded Grad"),
         "collective buffers": ("All Gather", "Reduce Scatter"),
         "temporaries": ("Temp",), "activations": ("Activation", "Inputs")}
# ... and MemTracker's for one process, which holds the whole model (models.footprint)
LINES_WHOLE = {"weights": ("Parameter", "Buffer"), "gradients": ("Gradient",),
               "AdamW state": ("Optstate",), "temporaries": ("Temp",),
               "activations": ("Activation", "Other")}


@dataclass
class Rehearsal:
    """One training stage rehearsed: bytes per process at the peak, by category, and where."""

    stage: str
    devices: int
    config: TrainerConfig  # the stage's config as rehearsed (rows, vocabulary layout)
    shape: Any  # the model's shapes as built (models.shapes.Shape; fewer layers when reduced)
    row_tokens: int  # tokens of each micro-batch's row (before sequence parallelism)
    peak: dict[str, float]  # bytes by category at the peak
    by_kind: dict[str, float]  # bytes by the tracker's own categories at the peak
    where: str  # the phase and module at the peak
    load: float  # bytes after loading (the sharded weights), before any step
    flops: float = 0.0  # FLOPs of one optimiser step on this process
    collectives: dict[str, float] = field(default_factory=dict)  # bytes per step, by collective
    wall_s: float = 0.0

    @property
    def total(self) -> float:
        return sum(self.peak.values())


def kernel_of(kind: str) -> str | None:
    """The attention stand-in a device kind's trainer runs: flash-attn's varlen kernel on CUDA
    kinds, torch_npu's fused attention on Ascend; None on a CPU (sdpa runs for real)."""
    from reasoner.pipeline.plan import NPU_KINDS

    if kind == "cpu":
        return None
    return "npu-fusion" if kind in NPU_KINDS else "flash-varlen"


def model_config(source: str, layers: int | None = None) -> Any:
    """The transformers config of `source` (a local folder's config.json or a known shape),
    with `layers` decoder layers when given."""
    from transformers import AutoConfig

    path = Path(source)
    if (path / "config.json").exists():
        config = AutoConfig.from_pretrained(path)
    elif source in KNOWN:
        known = dict(KNOWN[source])
        config = AutoConfig.for_model(known.pop("model_type", "qwen2"), **known)
    else:
        from reasoner.models.shapes import shape_of

        shape_of(source)  # says what it cannot find
        raise AssertionError(source)
    if layers is not None:
        config.num_hidden_layers = layers
        if getattr(config, "layer_types", None):
            config.layer_types = config.layer_types[:layers]
    return config


def fake_world(devices: int, sp: int) -> Any:
    """A fake process group of `devices` ranks, this process rank 0, its sequence-parallel group
    of `sp` consecutive ranks made; the `DistInfo` the trainer reads."""
    import torch.distributed as tdist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from reasoner.device import DistInfo

    _leave_world()
    tdist.init_process_group("fake", rank=0, world_size=devices, store=FakeStore())
    groups = [tdist.new_group(list(range(first, first + sp))) for first in range(0, devices, sp)
              ] if sp > 1 else [None]
    return DistInfo(0, devices, 0, sp, groups[0])


def _leave_world() -> None:
    import torch.distributed as tdist

    if tdist.is_initialized():
        tdist.destroy_process_group()


def recipe_layout(cfg: TrainerConfig, source: str, devices: int, kind: str,
                  mem_gib: float | None = None) -> str:
    """The vocabulary layout the stage runs with on `devices` of `kind` with `mem_gib` each
    (what its `auto` picks there: `models.vocab_layout.choose_vocab_layout`); a reduced
    rehearsal keeps it."""
    from reasoner.models.shapes import shape_of
    from reasoner.models.vocab_layout import choose_vocab_layout
    from reasoner.pipeline.plan import _dtype_bytes, device_mem_gib, resident_bytes

    whole = shape_of(source)
    extra = resident_bytes(cfg, whole) if isinstance(cfg, OfflineConfig) else 0.0
    return choose_vocab_layout(cfg, whole, devices, device_mem_gib(kind, mem_gib),
                               _dtype_bytes(cfg, kind), extra)


def not_rehearsed(cfg: TrainerConfig, devices: int, layout: str) -> str:
    """Why this stage cannot be rehearsed yet ("" when it can)."""
    if isinstance(cfg, OfflineConfig) and cfg.objective.resident_reference and cfg.model.lora:
        return "a LoRA moving reference, a second adapter set (not built yet)"
    if cfg.model.lora is not None and devices > 1:
        return "LoRA adapters on several processes (not built yet)"
    return ""


def rehearse(name: str, cfg: TrainerConfig, source: str, devices: int, kind: str,
             layers: int | None = None, row_tokens: int | None = None,
             mem_gib: float | None = None) -> Rehearsal:
    """Rehearse training stage `name` (`cfg`, the model of `source`) on `devices` processes of
    `kind` with `mem_gib` each (None: what the kind has; it decides the vocabulary layout, see
    the module docstring); `layers` and `row_tokens` shrink it (a test's)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from reasoner import training
    from reasoner.device import DistInfo, Env
    from reasoner.models import stand_ins
    from reasoner.pipeline import rehearsal_step, rehearsal_tracking
    from reasoner.pipeline.plan import _dtype_bytes

    began = time.perf_counter()
    row = row_tokens or cfg.row_tokens
    dtype_bytes = _dtype_bytes(cfg, kind)
    layout = recipe_layout(cfg, source, devices, kind, mem_gib)
    refused = not_rehearsed(cfg, devices, layout)
    if refused:
        raise ConfigError(f"stage {name}: not rehearsed: {refused}")
    cfg = rehearsed_config(cfg, row, layout if devices > 1 else "auto")
    dist = fake_world(devices, cfg.run.sequence_parallel) if devices > 1 else DistInfo()
    dtype = torch.float32 if dtype_bytes == 4 else (
        torch.float16 if cfg.model.dtype == "float16" else torch.bfloat16)
    env = Env(torch.device("cpu"), dist, dtype)
    with ExitStack() as stack:
        stack.callback(_leave_world)
        loaded, shape, ref, rm = _build(stack, cfg, source, env, kind, layers, layout)
        out = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        state = training.start(cfg.model_copy(update={"output_dir": str(out)}), env, None,
                               loaded, STEPS + 1, None, "rehearsal")
        tracker = rehearsal_tracking.tracker(loaded.policy, state.optimizer)
        apart = tracker.hold_apart(ref) if ref is not None else 0.0  # held throughout
        if rm is not None:  # its weights held apart; its training paused (`ApartRM`)
            tracker.hold_apart(rm.model)
            rm = rehearsal_step.ApartRM(rm, tracker)
        load = tracker.held_now()
        micro = rehearsal_step.micro_step(name, cfg, env, state, row, ref, rm)
        steps = itertools.count(1)  # the optimiser steps taken, 1-based as the trainer's

        def step(each_pass: Any) -> None:
            """One optimiser step: the micro-batches' passes, then the update (and the moving
            reference's move, as `train_offline.train_step` makes it)."""
            for _ in range(MICRO_BATCHES):
                each_pass()  # the tracker's per-module stats take one pass each
                micro(cfg.optim.loss_scale if state.scaler is not None else 1.0)
            _update(state, tracker)
            at = next(steps)
            if rm is not None:  # as `train_offline.train_step` steps it
                rm.step(at - 1)
            if ref is not None:
                from reasoner.train_offline import kl_reference

                kl_reference.move_reference(cfg.objective, at, state.policy, ref,
                                            state.optimizer)

        counter = rehearsal_tracking.Collectives()
        flops = FlopCounterMode(display=False)
        with tracker:
            for _ in range(STEPS):
                step(tracker.reset_mod_stats)
        # counted in a step of their own: the flop counter's module hooks keep a layer's
        # recomputed activations alive through the backward, which the tracker would count
        before = stand_ins.flops()
        with flops, counter:
            step(lambda: None)
        attention_flops = stand_ins.flops() - before
    peak = tracker.peak_by_kind()
    lines = LINES if devices > 1 else LINES_WHOLE
    by_line = {k: sum(peak.get(c, 0.0) for c in cs) for k, cs in lines.items()}
    if ref is not None or rm is not None:
        held = rm.held() if rm is not None else 0.0
        by_line["reference / token RM"] = apart + held
        load += apart + (rehearsal_tracking.held(rm.model) if rm is not None else 0.0)
    return Rehearsal(name, devices, cfg, shape, row, by_line, peak, tracker.where, load,
                     flops.get_total_flops() + attention_flops, counter.bytes,
                     time.perf_counter() - began)


def _build(stack: ExitStack, cfg: TrainerConfig, source: str, env: Any, kind: str,
           layers: int | None, layout: str) -> tuple[Any, Any, Any, Any]:
    """(training.Loaded, its shape, the moving reference, OREAL's token RM (`TokenRM`); None
    where the stage has none): the stage's model as its
    trainer loads it, on fake tensors for the rest of `stack`: built on meta (`layers` decoder
    layers), sharded by the loader's own code over several processes, attention through the
    kind's kernel stand-in (and the Ulysses attention around it under sequence parallelism).
    A moving reference (`objective.resident_reference`) is a second copy loaded alike, as
    `train_offline.prepare` loads it; a token RM a third, with its scalar head, made ready by
    `token_rm.ready` as the trainer's `load_token_rm` makes it."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from reasoner import training
    from reasoner.models import sequence_parallel, stand_ins
    from reasoner.models.fsdp import build_sharded, materialise
    from reasoner.models.logprobs import PolicyLogprobs
    from reasoner.models.sequence_parallel import SequenceGroup
    from reasoner.models.shapes import shape_from_config
    from reasoner.models.vocab_layout import VocabSplit

    config = model_config(source, layers)
    sp = SequenceGroup.of(env.dist)
    kernel = kernel_of(kind)
    temperature = cfg.objective.logprob_temperature if isinstance(cfg, OfflineConfig) else 1.0
    impl = stack.enter_context(stand_ins.standing_in(kernel)) if kernel else "sdpa"
    attn = sequence_parallel.enable(sp, impl) if sp.on else impl
    # transformers refuses to build a flash model without flash-attn installed: built with
    # sdpa, then switched to the stand-in (the attention layers read the config per call)
    mcfg = cfg.model.model_copy(update={"attn_implementation": attn if sp.on else "sdpa"})

    def wrap(m: Any) -> Any:
        return PolicyLogprobs(m, cfg.run.logprob_chunk, temperature, sp)

    def build(wrapper: Any = wrap) -> tuple[Any, Any]:
        if env.dist.world_size > 1:
            vocab = VocabSplit(layout, cfg.micro_batch_tokens,
                               chosen=cfg.run.vocab_layout == "auto")
            return build_sharded(config, mcfg, wrapper, env.dtype, vocab)
        return _whole(config, cfg, env.dtype, wrapper)

    offline = isinstance(cfg, OfflineConfig)
    resident = offline and cfg.objective.resident_reference
    built = [build() for _ in range(1 + resident)]
    if offline and cfg.objective.uses_token_rm:
        from reasoner.train_offline.token_rm import TokenRewardModel

        built.append(build(lambda m: TokenRewardModel(m, sp)))
    stack.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
    for wrapped, model in built:
        materialise(wrapped, env.device)
        if env.dist.world_size == 1:
            model.tie_weights()  # to_empty gave a tied head storage of its own
        model.config._attn_implementation = attn
    (wrapped, model), ref = built[0], (built[1][0].eval() if resident else None)
    rm = None
    if offline and cfg.objective.uses_token_rm:
        from reasoner.train_offline import token_rm

        rm = token_rm.ready(built[-1][0], cfg, env, STEPS + 1)
    return training.Loaded(model, wrapped), shape_from_config(config.to_dict()), ref, rm


def _update(state: Any, tracker: Any) -> None:
    """The update of a step with a finite gradient norm, as `training.optimizer_step` applies
    it: unscale (fp16) and clip, the optimiser's step, gradients dropped."""
    from reasoner import training

    # DTensor's sharding propagation makes fake gradients of the whole (unsharded) size for
    # the norm's per-tensor ops: not memory, so not counted (the norms are scalars)
    tracker.paused = True
    try:
        training.unscale_and_clip(state)
    finally:
        tracker.paused = False
    state.optimizer.step()
    if state.scaler is not None:  # update() on a device moves the scale there (a CPU's reads
        # it): what it clears, cleared
        state.scaler._per_optimizer_states.clear()
    state.optimizer.zero_grad(set_to_none=True)


def _whole(config: Any, cfg: TrainerConfig, dtype: Any, wrap: Any) -> tuple[Any, Any]:
    """(`wrap(model)`, model) on the meta device as one process loads it
    (`training.load_wrapped`): fp32 master weights, or a LoRA base in the training dtype with
    fp32 adapters (`lora.inject`); `fsdp.materialise` then gives it (fake) storage."""
    import torch
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    from reasoner.models import lora

    held = dtype if cfg.model.lora is not None else torch.float32
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=held, attn_implementation="sdpa")
    model.tie_weights()
    if cfg.model.lora is not None:
        lora.inject(model, cfg.model.lora, meta=True, base_dtype=dtype)
    return wrap(model), model


def rehearsed_config(cfg: TrainerConfig, row: int, layout: str) -> TrainerConfig:
    """`cfg` as rehearsed: rows of `row` tokens, the vocabulary `layout` of the whole recipe,
    no metric sinks."""
    run = cfg.run.model_copy(update={"tracking": [], "progress": False, "vocab_layout": layout})
    update: dict[str, Any] = {"run": run, "seq_len": row}
    if cfg.max_tokens > row:
        update["max_tokens"] = row
    return cfg.model_copy(update=update)
