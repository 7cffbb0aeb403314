"""How long a training step takes, before it runs: its FLOPs at a device kind's peak times an
assumed MFU (`step_seconds`), plus its collectives' bytes at an assumed link bandwidth
(`collective_seconds`, from models/traffic.py), not overlapped: what `reasoner plan` prints and
a rehearsal's counted FLOPs and bytes are held to (tests/unit/pipeline/test_rehearsal.py)."""

from __future__ import annotations

from pathlib import Path

from reasoner.config import OfflineConfig, TrainerConfig
from reasoner.models.shapes import Shape
from reasoner.models.traffic import micro_batch_traffic

# Dense bf16 peak TFLOP/s of each device kind (the vendors' data sheets, without sparsity);
# `gpu` and `npu` are the H100/H200 and Ascend 910B. `reasoner plan --tflops` overrides them.
PEAK_TFLOPS = {"gpu": 989.0, "h100": 989.0, "h200": 989.0, "a100": 312.0, "l40s": 362.0,
               "a10g": 125.0, "l4": 121.0, "rtx4090": 165.0, "npu": 313.0, "910b": 313.0,
               "cpu": 1.0}
# Assumed bandwidth of one device's link to the other nodes, GB/s each way (64 devices span 8
# nodes: FSDP2's collectives cross them): one 400 Gb/s NIC per GPU (H100 / H200 / A100 HGX),
# one 200 Gb/s RoCE port per Ascend 910B; collectives not overlapped with compute (an upper
# bound on the step)
LINK_GBPS = {"h100": 50.0, "h200": 50.0, "gpu": 50.0, "a100": 25.0, "910b": 25.0, "npu": 25.0}
DEFAULT_LINK_GBPS = 25.0


def step_flops(s: Shape, tokens: float, attended: float, checkpointing: bool) -> float:
    """FLOPs of training on `tokens`: 6 (8 with recompute) x the parameters that multiply
    (an untied input embedding is a lookup) x tokens, plus causal attention over `attended`
    tokens per token (a sequence's length): 2 x layers x hidden x attended per token forward,
    and 2.5 times that backward, as flash-attention's backward computes (the rehearsal's kernel
    stand-ins count the same, models/stand_ins.py)."""
    mult = 8 if checkpointing else 6
    multiplying = s.params - (0 if s.tied else s.vocab * s.hidden)
    forward_attn = 2 * s.layers * s.hidden * attended * tokens
    return mult * multiplying * tokens + forward_attn * (2.5 + (2 if checkpointing else 1))


def step_seconds(s: Shape, tokens_per_step: float, attended: float, devices: int, tflops: float,
                 mfu: float, checkpointing: bool) -> float:
    """`step_flops` of a step's tokens over `devices`, at `mfu` of `tflops` each."""
    return step_flops(s, tokens_per_step, attended, checkpointing) / (
        devices * tflops * 1e12 * mfu)


LENGTHS_READ = 1000  # samples of train-offline's input read for their lengths (a 32B run's
# rollouts hold tens of thousands of 32K-token samples: their mean is known well before that)


def step_tokens(cfg: TrainerConfig, masked: bool) -> tuple[float, float, str]:
    """Tokens one optimiser step computes, the tokens each attends to (the length of its
    sample: a packed row's samples never see each other, unless a T x T mask computes the whole
    row: `masked`), and where the numbers come from. sft's global_batch counts rows of
    row_tokens; train-offline's counts samples: their lengths in its input when that exists,
    else max_tokens each."""
    rows = cfg.run.global_batch
    if not isinstance(cfg, OfflineConfig):
        span = cfg.row_tokens if masked or not cfg.packing else cfg.max_tokens
        return rows * cfg.row_tokens, span, f"{rows} rows of {cfg.row_tokens:,} tokens"
    lengths = _sample_lengths(Path(cfg.input_dir), cfg.max_tokens)
    if lengths:
        mean = sum(lengths) / len(lengths)
        span = sum(n * n for n in lengths) / sum(lengths)  # a token's sample, by token
        said = (f"{rows} samples of {mean:,.0f} tokens on average (the first "
                f"{len(lengths):,} of {cfg.input_dir} within max_tokens)")
    else:
        mean = span = cfg.max_tokens
        said = (f"{rows} samples of at most {cfg.max_tokens:,} tokens (max_tokens; "
                f"{cfg.input_dir} is not made yet)")
    return rows * mean, (cfg.seq_len if masked and cfg.packing else span), said


def _sample_lengths(folder: Path, max_tokens: int) -> list[int]:
    """Prompt + response tokens of the first samples of a Verified shard, as train-offline keeps
    them (longer than max_tokens: dropped); [] when the shard is not there."""
    from reasoner import shards

    if not shards.is_complete(folder):
        return []
    lengths = []
    for row in shards.iter_rows(folder):
        n = row["prompt_tokens"] + row["response_tokens"]
        if n <= max_tokens:
            lengths.append(n)
        if len(lengths) == LENGTHS_READ:
            break
    return lengths


def micro_batches_per_step(cfg: TrainerConfig, devices: int) -> int:
    """Micro-batches one process runs per optimiser step: the global batch's rows (train-offline:
    samples, packed at most seq_len // max_tokens a row) over the data-parallel groups."""
    rows = cfg.run.global_batch
    if isinstance(cfg, OfflineConfig) and cfg.packing:
        rows = -(-rows // max(1, cfg.seq_len // cfg.max_tokens))
    per_group = -(-rows // max(1, devices // cfg.run.sequence_parallel))
    return -(-per_group // cfg.run.micro_batch)


def collective_seconds(cfg: TrainerConfig, s: Shape, devices: int, kind: str, dtype_bytes: int,
                       vocab_layout: str, adapters: int = 0) -> tuple[float, float]:
    """(seconds, GB per micro-batch) of a step's collectives on one process: each micro-batch's
    bytes (models.traffic), (W-1)/W of them crossing the link at LINK_GBPS."""
    obj = cfg.objective if isinstance(cfg, OfflineConfig) else None
    moved = sum(micro_batch_traffic(s, devices, cfg.run.sequence_parallel,
                                    cfg.micro_batch_tokens, dtype_bytes, vocab_layout,
                                    cfg.run.gradient_checkpointing, adapters,
                                    bool(obj and obj.resident_reference and not adapters),
                                    bool(obj and obj.uses_token_rm)).values())
    crossing = moved * (devices - 1) / devices if devices > 1 else 0.0
    return (micro_batches_per_step(cfg, devices) * crossing
            / (LINK_GBPS.get(kind, DEFAULT_LINK_GBPS) * 1e9), moved / 1e9)
