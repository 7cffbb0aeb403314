"""`reasoner plan`: memory per device and time per step of every stage of a recipe, before any
of it runs, ending in "fits" or "does not fit: change X".

Training stages (sft, train-offline) are modelled as this project's trainer runs them: FSDP2
over all devices, fp32 master weights, gradients and AdamW moments sharded (16 bytes per
parameter / devices; the embeddings and lm-head too, vocab-parallel), the final norm and up
to three decoder layers gathered whole in fp32 while they compute, activations of one
micro-batch in the compute dtype (the layer inputs only, plus one layer recomputed, with
gradient checkpointing), and the lm-head's log-prob chunk in fp32 (this device's share of
the vocabulary). Generation stages (infer, eval, the judge) are modelled as vLLM runs
them: weights split over tensor parallelism, the rest of `gpu_memory_utilization` for the KV
cache, which must hold at least one sequence of `max_model_len` tokens.

The same model, with the process's own baseline and the checkpoint file pages it touches,
predicts the host peak of a CPU run; scripts/bench_memory.py checks it against measured peaks.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reasoner.config import ObjectiveConfig
from reasoner.errors import ConfigError
from reasoner.models import fsdp

GIB = 2**30
# Shapes of the models the shipped recipes name, for planning without downloading them
# (each model's config.json on the hub).
KNOWN = {
    "Qwen/Qwen2.5-32B": dict(hidden_size=5120, intermediate_size=27648, num_hidden_layers=64,
                             num_attention_heads=40, num_key_value_heads=8, vocab_size=152064,
                             tie_word_embeddings=False, attention_bias=True),
    "Qwen/Qwen3-32B": dict(model_type="qwen3", hidden_size=5120, intermediate_size=25600, num_hidden_layers=64,
                           num_attention_heads=64, num_key_value_heads=8, head_dim=128,
                           vocab_size=151936, tie_word_embeddings=False),
    "internlm/OREAL-32B-SFT": dict(hidden_size=5120, intermediate_size=27648, num_hidden_layers=64,
                                   num_attention_heads=40, num_key_value_heads=8,
                                   vocab_size=152064, tie_word_embeddings=False,
                                   attention_bias=True),
    "Qwen/Qwen2.5-0.5B-Instruct": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                       num_attention_heads=14, num_key_value_heads=2,
                                       vocab_size=151936, tie_word_embeddings=True,
                                       attention_bias=True),
    "Qwen/Qwen2.5-1.5B-Instruct": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                       num_attention_heads=12, num_key_value_heads=2,
                                       vocab_size=151936, tie_word_embeddings=True,
                                       attention_bias=True),
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B": dict(
        hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
        num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=False, attention_bias=True),
}
# Dense bf16 peak TFLOP/s of each device kind (the vendors' data sheets, without sparsity);
# `gpu` and `npu` are the H100/H200 and Ascend 910B. `reasoner plan --tflops` overrides them.
PEAK_TFLOPS = {"gpu": 989.0, "h100": 989.0, "h200": 989.0, "a100": 312.0, "l40s": 362.0,
               "a10g": 125.0, "l4": 121.0, "rtx4090": 165.0, "npu": 313.0, "910b": 313.0,
               "cpu": 1.0}
NPU_KINDS = ("npu", "910b")
CPU_BASELINE_GIB = 0.55  # python + torch + transformers + reasoner imported (measured here)


@dataclass(frozen=True)
class Shape:
    """A decoder-only transformer's sizes (Llama / Qwen2 / Qwen3 layout)."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    bias: bool = False
    qk_norm: bool = False  # Qwen3: RMSNorm on each head's queries and keys

    @property
    def layer_params(self) -> int:
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        attn = self.hidden * (q + 2 * kv) + q * self.hidden + (q + 2 * kv if self.bias else 0)
        norms = 2 * self.hidden + (2 * self.head_dim if self.qk_norm else 0)
        return attn + 3 * self.hidden * self.intermediate + norms

    @property
    def root_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + self.root_params

    def activation_bytes_per_token(self, dtype_bytes: int) -> int:
        """Saved activations of one layer per token (flash / sdpa attention: no T^2 term)."""
        kv = self.kv_heads * self.head_dim
        return dtype_bytes * (7 * self.hidden + 2 * kv + 4 * self.intermediate)

    def kv_cache_bytes_per_token(self, dtype_bytes: int, tp: int) -> float:
        kv_local = max(1.0, self.kv_heads / tp)
        return 2 * self.layers * kv_local * self.head_dim * dtype_bytes


def shape_from_config(c: dict) -> Shape:
    heads = c["num_attention_heads"]
    return Shape(c["num_hidden_layers"], c["hidden_size"], c["intermediate_size"], heads,
                 c.get("num_key_value_heads") or heads,
                 c.get("head_dim") or c["hidden_size"] // heads, c["vocab_size"],
                 bool(c.get("tie_word_embeddings", False)),
                 bool(c.get("attention_bias", c.get("model_type") == "qwen2")),
                 c.get("model_type") == "qwen3")


def shape_of(name_or_path: str) -> Shape:
    """From a local folder's config.json, the hub cache, or the shapes above."""
    path = Path(name_or_path) / "config.json"
    if path.exists():
        return shape_from_config(json.loads(path.read_text()))
    if name_or_path in KNOWN:
        return shape_from_config(KNOWN[name_or_path])
    try:
        from huggingface_hub import hf_hub_download

        cached = hf_hub_download(name_or_path, "config.json", local_files_only=True)
        return shape_from_config(json.loads(Path(cached).read_text()))
    except Exception as exc:  # noqa: BLE001
        raise ConfigError(f"{name_or_path}: no config.json to plan from (not a local folder, "
                          f"not in the hub cache, not one of {', '.join(KNOWN)})") from exc


def count_parameters(name_or_path: str | Path) -> int:
    return shape_of(str(name_or_path)).params


# --------------------------------------------------------------------------------------------
# Training


def training_bytes(s: Shape, devices: int, tokens: int, dtype_bytes: int, checkpointing: bool,
                   logprob_chunk: int, extra_models: int = 0, vocab_layout: str = "vocab-parallel"
                   ) -> dict[str, float]:
    """Bytes per device of one training process, by component (see the module docstring)."""
    sharded = devices > 1
    rows = s.vocab if vocab_layout == "fsdp" else math.ceil(s.vocab / devices)
    out = {
        "weights+grads+adam fp32": 16 * s.params / devices,
        # the root FSDP unit (the final norm) stays gathered through forward and backward;
        # layers: current + prefetched + gradient
        "gathered root + 3 layers": 4 * (2 * s.hidden + 3 * s.layer_params) if sharded else 0.0,
        # one chunk of one process's tokens against this device's rows of the vocabulary (all
        # of them when the lm-head is an FSDP2 unit of its own)
        "logits chunk": 3 * 4 * min(logprob_chunk, tokens) * rows,
    }
    if sharded and vocab_layout == "fsdp":
        # backward of the gathered lm-head (`logprobs._ChunkedLogprobs`): the weight and its
        # gradient in the compute dtype, and below fp32 also an fp32 copy and fp32 gradient sum
        # (bf16: 2 + 4 + 4 + 2 bytes per element; fp32: 4 + 4)
        out["gathered lm-head"] = s.vocab * s.hidden * (2 * dtype_bytes
                                                        + (8 if dtype_bytes < 4 else 0))
    per_layer = s.activation_bytes_per_token(dtype_bytes) * tokens
    if checkpointing:
        out["activations"] = s.layers * tokens * s.hidden * dtype_bytes + 2 * per_layer
    else:
        out["activations"] = s.layers * per_layer
    if extra_models:  # a resident reference (weights only) or token RM (trained: 16 B/param)
        out["reference / token RM"] = extra_models * s.params / devices
    return out


def megatron_bytes(s: Shape, devices: int, tokens: int, tp: int, pp: int, checkpointing: bool
                   ) -> dict[str, float]:
    """Bytes per device of MindSpeed-LLM / Megatron training as `reasoner export mindspeed`
    sets it up (how PCL-Reasoner ran): bf16 weights, fp32 gradients and a distributed
    optimizer over the data-parallel ranks, sequence parallelism inside tensor parallelism,
    1F1B pipelining (the first stage holds `pp` micro-batches), full recompute."""
    dp = max(1, devices // (tp * pp))
    local = s.params / (tp * pp)
    per_layer = s.activation_bytes_per_token(2) * tokens / tp
    layers = math.ceil(s.layers / pp)
    acts = (pp * layers * tokens * s.hidden * 2 / tp + 2 * per_layer) if checkpointing \
        else pp * layers * per_layer
    return {"weights bf16 + grads fp32": 6 * local, "distributed optimizer": 12 * local / dp,
            "activations": acts, "logits (vocab-parallel)": 3 * 4 * tokens * s.vocab / tp}


def host_peak_gib(model: str | Path, processes: int, seq_len: int, micro_batch: int = 1,
                  gradient_checkpointing: bool = True, disk_bytes: int = 4) -> float:
    """Predicted peak RSS (GiB) of each process of a CPU `reasoner sft` run in fp32: the
    training peak, or the load peak when higher (one process: the model plus the checkpoint
    file's pages; sharded: each process's rows of both)."""
    s = shape_of(str(model))
    train = sum(training_bytes(s, processes, seq_len * micro_batch, 4, gradient_checkpointing,
                               4096).values())
    load = (4 + disk_bytes) * s.params / processes
    return CPU_BASELINE_GIB + max(train, load) / GIB


def step_seconds(s: Shape, tokens_per_step: int, seq_len: int, devices: int, tflops: float,
                 mfu: float, checkpointing: bool) -> float:
    """6 (8 with recompute) x params x tokens, plus causal attention, at `mfu` of peak."""
    mult = 8 if checkpointing else 6
    attn = (mult / 2) * s.layers * s.hidden * seq_len * tokens_per_step  # 2 L s^2 H per seq fwd
    flops = mult * s.params * tokens_per_step + attn
    return flops / (devices * tflops * 1e12 * mfu)


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

    @property
    def fits(self) -> bool:
        return self.verdict == "fits"


def resident_extra(obj: ObjectiveConfig) -> int:
    """Bytes per parameter of the models train-offline keeps beside the policy: a moving
    reference (fp32 weights: 4) and a token RM (trained: 16)."""
    return 4 * obj.resident_reference + 16 * obj.uses_token_rm


def plan_training(name: str, cfg: Any, shape: Shape, model: str, devices: int, mem_gib: float,
                  kind: str, mfu: float, layout: str = "fsdp", tp: int = 8, pp: int = 4,
                  extra: int = 0, tflops: float | None = None) -> MemoryEstimate:
    """Memory per device and time per step of an sft or train-offline stage; `extra`: bytes per
    parameter of the models kept beside the policy (see resident_extra)."""
    fp32 = cfg.model.dtype == "float32" or (cfg.model.dtype == "auto" and kind == "cpu")
    dtype_bytes = 4 if fp32 else 2
    tokens = cfg.run.micro_batch * (cfg.seq_len if cfg.packing else cfg.max_tokens)
    if layout == "mindspeed":
        if devices % (tp * pp):
            raise ConfigError(f"--devices {devices} is not a multiple of tp x pp = {tp * pp}")
        parts = megatron_bytes(shape, devices, tokens, tp, pp, cfg.run.gradient_checkpointing)
        vocab = ""
    else:
        layout = choose_vocab_layout(cfg, shape, devices, mem_gib, dtype_bytes, extra)
        parts = training_bytes(shape, devices, tokens, dtype_bytes,
                               cfg.run.gradient_checkpointing, cfg.run.logprob_chunk, extra,
                               layout if devices > 1 else "whole")
        vocab = vocab_note(shape, devices, tokens, dtype_bytes, layout) if devices > 1 else ""
    need = 1.1 * sum(parts.values()) / GIB  # allocator fragmentation
    per_step = cfg.run.global_batch * (cfg.seq_len if cfg.packing else cfg.max_tokens)
    step = step_seconds(shape, per_step, cfg.seq_len if cfg.packing else cfg.max_tokens,
                        devices, tflops or PEAK_TFLOPS[kind], mfu,
                        cfg.run.gradient_checkpointing)
    verdict = "fits"
    if need > mem_gib:
        biggest = max(parts, key=parts.get)
        advice = {"activations": "lower seq_len / micro_batch, turn on gradient_checkpointing, "
                                 "or train with tensor parallelism (--layout mindspeed)",
                  "weights+grads+adam fp32": "use more devices",
                  "logits chunk": "lower run.logprob_chunk",
                  "gathered root + 3 layers": "use devices with more memory",
                  "reference / token RM": "drop the moving reference / token RM"}.get(
                      biggest, "raise tp / pp or use more devices")
        verdict = f"does not fit: {advice} ({biggest} is the largest part)"
    return MemoryEstimate(name, cfg.__class__.__name__, model, devices,
                          {k: v / GIB for k, v in parts.items()}, need, mem_gib, step, verdict,
                          vocab)


def choose_vocab_layout(cfg: Any, shape: Shape, devices: int, mem_gib: float | None,
                        dtype_bytes: int, extra: int = 0) -> str:
    """run.vocab_layout, or for `auto` the layout that moves fewer bytes among those that fit
    `mem_gib` (all when it is unknown): what `reasoner plan` reports and the trainers use.
    FSDP2 units for the embedding and lm-head move a constant number of bytes whatever the
    number of processes, vocab-parallel ones a number that grows with it, but they hold the
    whole vocabulary while they compute (the gathered lm-head, its logits chunks)."""
    tokens = cfg.run.micro_batch * (cfg.seq_len if cfg.packing else cfg.max_tokens)
    split = fsdp.VocabSplit(cfg.run.vocab_layout, tokens)
    if cfg.run.vocab_layout != "auto" or shape.tied or devices == 1:
        return fsdp.vocab_layout(split, devices, shape.hidden, shape.vocab, shape.tied,
                                 dtype_bytes)
    moved = {lay: fsdp.vocab_traffic_bytes(lay, devices, tokens, shape.hidden, shape.vocab,
                                           True, dtype_bytes, dtype_bytes)
             for lay in ("vocab-parallel", "fsdp")}
    need = {lay: 1.1 * sum(training_bytes(shape, devices, tokens, dtype_bytes,
                                          cfg.run.gradient_checkpointing, cfg.run.logprob_chunk,
                                          extra, lay).values()) / GIB for lay in moved}
    fitting = [lay for lay in moved if mem_gib is None or need[lay] <= mem_gib]
    if not fitting:  # neither fits: the one closer to fitting (the plan says what to change)
        return min(need, key=need.get)
    return min(fitting, key=moved.get)


def vocab_note(s: Shape, devices: int, tokens: int, dtype_bytes: int, layout: str) -> str:
    """The layout run.vocab_layout gives, and the bytes per micro-batch each device receives
    for the embedding and lm-head in it and in the other (scripts/bench_comm.py counts them)."""
    moved = {lay: fsdp.vocab_traffic_bytes(lay, devices, tokens, s.hidden, s.vocab, not s.tied,
                                           dtype_bytes, dtype_bytes) / 1e9
             for lay in ("vocab-parallel", "fsdp")}
    other = "fsdp" if layout == "vocab-parallel" else "vocab-parallel"
    alt = f"{other} {moved[other]:.1f} GB" if not s.tied else "fsdp: needs untied weights"
    return f"vocab {layout}: {moved[layout]:.1f} GB / micro-batch ({alt})"


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
    return MemoryEstimate(name, "vllm", model, tp, parts,
                     (weights + reserve + kv_one) / GIB, utilization * mem_gib, None, verdict)


def plan_recipe(path: Path, devices: int, mem_gib: float, kind: str = "gpu", mfu: float = 0.35,
                overrides: list[str] | None = None, layout: str = "fsdp", tp: int = 8,
                pp: int = 4, tflops: float | None = None) -> list[MemoryEstimate]:
    """Every stage of a recipe, with the start model's shape for the models it trains."""
    from reasoner.pipeline.recipe import load_recipe
    from reasoner.pipeline.run import resolve

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
            extra = resident_extra(cfg.objective) if st.command == "train-offline" else 0
            plans.append(plan_training(st.name, cfg, shape_of(src), src, devices, mem_gib, kind,
                                       mfu, layout, tp, pp, extra, tflops))
            plans[-1].command = st.command
        elif st.command in ("infer", "eval"):
            src = cfg.model.name_or_path
            src = src if Path(src).exists() or src in KNOWN else start
            plans.append(plan_generation(st.name, src, shape_of(src), cfg.model.dtype,
                                         cfg.vllm.tensor_parallel_size,
                                         cfg.vllm.gpu_memory_utilization,
                                         cfg.max_model_len or 32768, devices, mem_gib))
            plans[-1].command = st.command
        elif st.command == "verify" and cfg.mode != "rule":
            j = cfg.judge
            plans.append(plan_generation(st.name, j.model.name_or_path,
                                         shape_of(j.model.name_or_path), j.model.dtype,
                                         j.vllm.tensor_parallel_size,
                                         j.vllm.gpu_memory_utilization,
                                         j.max_model_len or 32768, devices, mem_gib))
            plans[-1].command = "judge"
    return plans


def check_before_run(recipe: Path, overrides: list[str]) -> list[MemoryEstimate]:
    """`reasoner run`'s check on a GPU / NPU machine: the stages that would not fit on this
    node's devices (none on a CPU-only machine)."""
    from reasoner import device as dev

    found = dev.local_devices()
    if found is None:
        return []
    kind, n, mem = found
    return [p for p in plan_recipe(recipe, n, mem, kind, overrides=overrides) if not p.fits]
