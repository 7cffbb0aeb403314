"""What one training process holds, in bytes, by component: the trainer's own (FSDP2 over every
device) and MindSpeed-LLM's (how `reasoner export mindspeed` sets it up). `reasoner plan` adds
these up per stage (pipeline/plan.py); the vocabulary layout weighs them (vocab_layout.py);
scripts/bench_memory.py checks them against measured peaks.

The trainer: fp32 master weights, gradients and AdamW moments sharded (16 bytes per parameter
/ devices; the embeddings and lm-head too, vocab-parallel), the final norm and up to three
decoder layers gathered whole in the gather dtype while they compute (FSDP2's mixed precision:
bf16 / fp16 gathers for a half-precision run, plus one layer's fp32 gradient for its
reduce-scatter), activations of one process's tokens of one micro-batch (its 1/N of each row
under sequence parallelism: the layer inputs only, plus one layer recomputed, with gradient
checkpointing), and the lm-head's log-prob chunk in fp32 (this device's share of the
vocabulary).

Loading (`load_bytes`): the weights as they reach the device, before anything else is there:
fp32 masters for a model that trains, a frozen model or LoRA base read in the compute dtype (it
never reaches the device as a whole fp32 copy), plus a fixed reference scored beside the policy.

Bytes per activation element, as the trainer holds them (`residual_bytes`; a test reads them
off the first decoder layer's input in 1 and 2 processes): under FSDP2 the compute dtype's (a
half-precision gather makes the residual stream half); in one process 4, whatever the compute
dtype (fp32 master weights under autocast: the residual additions stay fp32).
"""

from __future__ import annotations

import math
from pathlib import Path

from reasoner.models.shapes import Shape, shape_of

GIB = 2**30
CPU_BASELINE_GIB = 0.55  # python + torch + transformers + reasoner imported (measured here)


def residual_bytes(dtype_bytes: int, processes: int, frozen_base: bool = False) -> int:
    """Bytes per element of the hidden states entering each decoder layer (what activation
    checkpointing keeps): the compute dtype's under FSDP2 or with a LoRA base held in it, 4 in
    one process of full training."""
    return dtype_bytes if processes > 1 or frozen_base else 4


def training_bytes(s: Shape, devices: int, tokens: int, dtype_bytes: int, checkpointing: bool,
                   logprob_chunk: int, extra_models: float = 0, vocab_layout: str = "vocab-parallel",
                   adapters: int = 0, lora_inputs: int = 0) -> dict[str, float]:
    """Bytes per device of one training process, by component (see the module docstring).
    `tokens`: this process's tokens of one micro-batch (`TrainerConfig.micro_batch_tokens`).
    `adapters`: LoRA's parameter count (0: the whole model trains); the base is then held in
    the compute dtype with no gradient or optimiser state, the adapters as fp32 masters with
    their gradients and AdamW moments, and a layer is gathered without a whole-layer gradient.
    Sharded over several devices, the lines are the rehearsal's categories at its peak
    (`sharded_bytes`)."""
    if devices > 1:
        return sharded_bytes(s, devices, tokens, dtype_bytes, checkpointing, logprob_chunk,
                             extra_models, vocab_layout, adapters)
    return whole_bytes(s, tokens, dtype_bytes, checkpointing, logprob_chunk, extra_models,
                       adapters, lora_inputs)


def whole_bytes(s: Shape, tokens: int, dtype_bytes: int, checkpointing: bool, logprob_chunk: int,
                extra_models: float = 0, adapters: int = 0, lora_inputs: int = 0
                ) -> dict[str, float]:
    """Bytes of one process training the whole model at its peak, in the rehearsal's
    categories (torch's MemTracker): fp32 master weights (a LoRA base in the compute dtype),
    gradients and AdamW moments of what trains, the temporaries and activations of the larger
    of the lm-head's backward (a trained head: its fp32 gradient sum, below fp32 a compute-dtype
    copy; a chunk's logits) and the last layer's (with LoRA its recomputed activations hold
    each target's input in fp32 too, `lora_inputs` features a token, and its backward computes
    no weight gradient of the base: 1 hidden and 1 intermediate size a token of temporaries, as
    rehearsed)."""
    trained = adapters or s.params
    out = {"weights": (dtype_bytes * s.params + 4 * adapters) if adapters else 4 * s.params,
           "gradients": 4 * trained, "AdamW state": 8 * trained}
    head = 0 if adapters else 4 + (dtype_bytes if dtype_bytes < 4 else 0)
    moments = [{"temporaries": head * s.vocab * s.hidden
                + 12 * min(logprob_chunk, tokens) * s.vocab},
               {"temporaries": _layer_backward(s, tokens, dtype_bytes, "whole",
                                               adapters)[0]["temporaries"]}]
    if adapters:
        moments[1]["temporaries"] = (s.hidden + s.intermediate) * dtype_bytes * tokens
    _activations(moments, s, tokens, dtype_bytes, checkpointing,
                 residual_bytes(dtype_bytes, 1, adapters > 0), "activations")
    if checkpointing:
        moments[1]["activations"] += 4 * lora_inputs * tokens
    best = max(moments, key=lambda m: sum(m.values()))
    out.update({k: best[k] for k in ("temporaries", "activations")})
    if extra_models:
        out["reference / token RM"] = extra_models * s.params
    return out


def _activations(moments: list[dict], s: Shape, tokens: int, dtype_bytes: int,
                 checkpointing: bool, res: int, recomputed: str = "temporaries") -> None:
    """Each moment's activations: the lm-head's, then the layers', whose activations are
    recomputed under checkpointing (counted as `recomputed`: FSDPMemTracker says temporaries,
    MemTracker activations)."""
    extra = EXTRA_HIDDEN_BYTES[res] * s.hidden * tokens
    saved = _layer_elements(s) * dtype_bytes * tokens  # one layer's, for its backward
    moments[0]["activations"] = s.layers * (tokens * s.hidden * res if checkpointing
                                            else saved) + extra + moments[0].pop("forward logits", 0)
    for m in moments[1:]:  # a layer's backward, with the layers below it still held
        held = m.pop("layers held", s.layers)
        if checkpointing:  # every layer's input, and at the lm-head a few more hidden-sized
            m["activations"] = held * tokens * s.hidden * res
            m[recomputed] += saved
        else:  # every layer's saved tensors
            m["activations"] = held * saved


# Elements per token a decoder layer keeps for its backward without checkpointing, in hidden
# sizes beyond its MLP's 4 x intermediate and its key / value projections: 10 (measured by the
# rehearsal of Qwen2.5-32B, bf16: 327,900 bytes a token a layer)
LAYER_HIDDEN_COPIES = 10
# Bytes a token a hidden unit held at the lm-head's backward besides the decoder layers' inputs
# (the embedding's output, the final norm's input and output, the selected hidden states), by
# the residual stream's bytes: 4 half-precision hidden-sized tensors under FSDP2 (0.49 GiB at
# 12,800 tokens of Qwen2.5-32B), 3 fp32 ones in one process (0.084 GiB at 8,192 tokens of
# Qwen2.5-0.5B), as rehearsed
EXTRA_HIDDEN_BYTES = {2: 8, 4: 12}


def sharded_bytes(s: Shape, devices: int, tokens: int, dtype_bytes: int, checkpointing: bool,
                  logprob_chunk: int, extra_models: float = 0, vocab_layout: str = "vocab-parallel",
                  adapters: int = 0) -> dict[str, float]:
    """Bytes per device of one FSDP2 training process at its peak, in the rehearsal's
    categories (pipeline/rehearsal.py, torch's FSDPMemTracker): fp32 weight and gradient shards,
    AdamW's two moments, what is gathered, the collective buffers, activations and the
    temporaries of the lm-head's backward.

    The peak is the largest of a few moments of the backward. The lm-head's, first: with the
    head an FSDP2 unit of its own (`fsdp`), the head gathered in the compute dtype, the next
    layer's all-gather buffer, and `logprobs._ChunkedLogprobs`' temporaries: below fp32 an fp32
    copy of the head and its fp32 gradient sum (8 bytes x vocab x hidden), and for a chunk of
    tokens its logits, their softmax and its gradient (12 bytes x chunk x vocab);
    vocabulary-parallel, the forward's chunk of this device's rows' logits, larger. Then the decoder layers' (`_layer_backward`),
    larger with many tokens per process (sft's 32K rows) or a vocabulary-parallel lm-head (its
    rows' gradient stays on the device, so the largest buffer in flight is a layer's)."""
    trained = adapters or s.params
    out = {"weight shards": ((dtype_bytes * s.params + 4 * adapters) if adapters
                             else 4 * s.params) / devices,
           "gradient shards": 4 * trained / devices,
           "AdamW state": 8 * trained / devices}
    moments = [_lm_head_backward(s, devices, tokens, dtype_bytes, logprob_chunk, vocab_layout,
                                 adapters),
               *_layer_backward(s, tokens, dtype_bytes, vocab_layout, adapters)]
    _activations(moments, s, tokens, dtype_bytes, checkpointing,
                 residual_bytes(dtype_bytes, devices, adapters > 0))
    out.update(max(moments, key=lambda m: sum(m.values())))
    if extra_models:  # a resident reference (weights only: 4 B/param; with LoRA a second
        # adapter set) or token RM (trained: 16 B/param)
        out["reference / token RM"] = extra_models * s.params / devices
    return out


def _layer_elements(s: Shape) -> int:
    """Elements per token a decoder layer keeps for its backward (no checkpointing)."""
    return LAYER_HIDDEN_COPIES * s.hidden + 2 * s.kv_heads * s.head_dim + 4 * s.intermediate


def _lm_head_backward(s: Shape, devices: int, tokens: int, dtype_bytes: int, chunk: int,
                      vocab_layout: str, adapters: int) -> dict[str, float]:
    """The first moment: the lm-head's backward (see `sharded_bytes`); vocabulary-parallel, its
    forward."""
    rest = max(0, min(chunk, tokens - chunk))  # the backward's largest chunk after the first
    chunk = min(chunk, tokens)
    if vocab_layout != "fsdp":  # its forward's, larger than its backward's: a chunk of this
        # process's logits of an owner's tokens as `vocab_parallel._Logprobs` computes them
        # (13 bytes a logit in half precision, as rehearsed: the product, its fp32 copy, the
        # shifted exponentials) beside the owner's hidden states, the last layer's all-gather
        # buffer prefetched for the backward
        per_logit = 12 + (dtype_bytes < 4)
        return {"gathered weights": dtype_bytes * 2 * s.hidden,
                "collective buffers": dtype_bytes * s.layer_params, "temporaries": 0,
                "forward logits": (per_logit * math.ceil(s.vocab / devices) + 4 * s.hidden)
                * chunk}
    head_copy = 0 if adapters else (8 if dtype_bytes < 4 else 4)
    # `logprobs._ChunkedLogprobs.backward` beside the head's fp32 copy and gradient sum
    # (head_copy): at a chunk's softmax its fp32 logits and their softmax (8 bytes a logit),
    # and from the second chunk on the previous chunk's dlogits (4 bytes a logit of a whole
    # chunk); at `grad_w += dlogits.T @ h` a third vocab x hidden fp32 product beside the
    # chunk's dlogits
    logits = (12 * chunk if adapters else 4 * max(2 * chunk, chunk + 2 * rest)) * s.vocab
    product = 0 if adapters else 4 * s.vocab * s.hidden + 4 * chunk * s.vocab
    return {"gathered weights": dtype_bytes * (s.vocab * s.hidden + 2 * s.hidden),
            "collective buffers": dtype_bytes * s.layer_params,
            "temporaries": head_copy * s.vocab * s.hidden + max(logits, product)}


def _layer_backward(s: Shape, tokens: int, dtype_bytes: int, vocab_layout: str,
                    adapters: int) -> list[dict[str, float]]:
    """The next moments: a decoder layer's backward, its gradients' temporaries held (2 hidden
    and 2 intermediate sizes a token beside its recomputed activations, as rehearsed:
    `_activations` adds those), gathered, the next layer's all-gather buffer beside it (none
    below the first layer), and the fp32 gradient of the unit before it still reduce-scattering:
    at the last layer an FSDP2 lm-head's; at the one below, the last layer's, one layer's
    input fewer held then ("layers held")."""
    head_grad = 4 * s.vocab * s.hidden if vocab_layout == "fsdp" and not adapters else 0
    # an MLP matrix's weight gradient in the compute dtype, made before it is added to the
    # gathered layer's (0.26 GiB at 32B, as rehearsed: a process with few tokens peaks there)
    weight_grad = 0 if adapters else dtype_bytes * s.hidden * s.intermediate

    def moment(buffers: float, held: int) -> dict[str, float]:
        return {"gathered weights": dtype_bytes * (2 * s.hidden + s.layer_params),
                "collective buffers": buffers,
                "temporaries": (2 * s.hidden + 2 * s.intermediate) * dtype_bytes * tokens
                + weight_grad, "layers held": held}

    moments = [moment(dtype_bytes * s.layer_params + head_grad, s.layers)]
    if s.layers > 1 and not adapters:
        moments.append(moment(dtype_bytes * s.layer_params * (s.layers > 2)
                              + 4 * s.layer_params, s.layers - 1))
    return moments


def packed_mask_bytes(micro_batch: int, row_tokens: int, sequence_parallel: int = 1,
                      additive_bytes: int = 0) -> int:
    """Bytes of the block-diagonal mask that packed rows need under sdpa or eager (no varlen
    kernel): the bool (rows, 1, T, T) per micro-batch, built on the device, plus its additive
    form in the compute dtype (`additive_bytes` per element; models.shared_mask makes it once
    for every layer; 0 on NPU, which takes the bool mask); under sequence parallelism the
    micro-batch's rows are one flat row whose whole length every process attends over."""
    if sequence_parallel > 1:
        elements = (micro_batch * row_tokens) ** 2
    else:
        elements = micro_batch * row_tokens ** 2
    return (1 + additive_bytes) * elements


def scoring_bytes(s: Shape, devices: int, tokens: int, dtype_bytes: int, logprob_chunk: int,
                  vocab_layout: str = "vocab-parallel", adapters: int = 0) -> float:
    """Peak bytes per device of a scoring forward (reference, behaviour or validation log-probs,
    no gradient) of one micro-batch, before training: fp32 weight shards (LoRA: the base in the
    compute dtype, fp32 adapters), the gathered root and two layers, one layer's activations
    and the hidden states, a log-prob chunk."""
    rows = s.vocab if vocab_layout == "fsdp" else math.ceil(s.vocab / devices)
    gathered = dtype_bytes * (2 * s.hidden + 2 * s.layer_params) if devices > 1 else 0.0
    acts = (s.activation_bytes_per_token(dtype_bytes)
            + 2 * s.hidden * residual_bytes(dtype_bytes, devices, adapters > 0)) * tokens
    weights = (dtype_bytes * s.params + 4 * adapters if adapters else 4 * s.params) / devices
    return weights + gathered + acts + 2 * 4 * min(logprob_chunk, tokens) * rows


def load_bytes(s: Shape, devices: int, dtype_bytes: int, adapters: int = 0) -> float:
    """Bytes per device of a trained model as `training.policy.load_wrapped` puts it on the
    device, its largest moment while loading: fp32 master weights (4 bytes per parameter), or
    with LoRA the base read in the compute dtype and the fp32 adapters (PEFT makes them in the
    base's dtype; each is widened alone). Sharded over the devices under FSDP2."""
    weights = dtype_bytes * s.params + 4 * adapters if adapters else 4 * s.params
    return weights / devices


def frozen_bytes(s: Shape, devices: int, dtype_bytes: int) -> float:
    """Bytes per device of a frozen model loaded to score beside the policy (train-offline's
    fixed `reference`): in the compute dtype in one process (`load_wrapped(frozen=True)`), fp32
    shards under FSDP2 (`fsdp.load_sharded` builds a model without adapters in fp32)."""
    return (dtype_bytes if devices == 1 else 4) * s.params / devices


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
                  gradient_checkpointing: bool = True, disk_bytes: int = 4,
                  sequence_parallel: int = 1, logprob_chunk: int = 4096, adapters: int = 0,
                  packed: bool = True) -> float:
    """Predicted peak RSS (GiB) of each process of a CPU `reasoner sft` run in fp32: the
    training peak (with the packed rows' mask: CPU has no varlen kernel), or the load peak when
    higher (one process: the model plus the checkpoint file's pages; sharded: each process's
    rows of both). `adapters`: LoRA's parameter count."""
    s = shape_of(str(model))
    tokens = -(-seq_len * micro_batch // sequence_parallel)
    train = sum(training_bytes(s, processes, tokens, 4, gradient_checkpointing,
                               logprob_chunk, adapters=adapters).values())
    if packed:
        train += packed_mask_bytes(micro_batch, seq_len, sequence_parallel, 4)
    load = (4 + disk_bytes) * s.params / processes
    return CPU_BASELINE_GIB + max(train, load) / GIB
