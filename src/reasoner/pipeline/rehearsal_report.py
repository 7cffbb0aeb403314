"""What `reasoner plan --rehearse` says of a rehearsal (pipeline/rehearsal.py): the plan's lines
beside it (`compare`, and the lines off by more than 10%: `mismatched`), where its peak was, and
its time per step from its FLOPs and its collectives' bytes at stated assumptions."""

from __future__ import annotations

from reasoner.config import OfflineConfig
from reasoner.pipeline.rehearsal import GIB, MICRO_BATCHES, Rehearsal
from reasoner.pipeline.step_time import DEFAULT_LINK_GBPS, LINK_GBPS


def mismatched(rows: list[tuple[str, float, float]], tolerance: float = 0.10,
               floor: float = 0.001) -> list[str]:
    """The lines of `compare` where the plan is more than `tolerance` off the rehearsal (a
    line under `floor` of the rehearsed total on both sides is not judged), said."""
    total = rows[-1][2]
    return [f"{line}: plan {plan / GIB:.2f} GiB, rehearsed {seen / GIB:.2f}"
            for line, plan, seen in rows
            if max(plan, seen) >= floor * total and abs(plan - seen) > tolerance * seen]


def compare(r: Rehearsal, kind: str) -> list[tuple[str, float, float]]:
    """(line, the plan's bytes, the rehearsal's bytes) for each line of the plan's arithmetic
    at the rehearsed shapes (`models.footprint.training_bytes`), then the total."""
    from reasoner.models.footprint import training_bytes
    from reasoner.pipeline.plan import _dtype_bytes, resident_bytes

    cfg = r.config
    lora = cfg.model.lora
    adapters = r.shape.lora_params(lora.r, lora.target_modules) if lora is not None else 0
    extra = resident_bytes(cfg, r.shape) if isinstance(cfg, OfflineConfig) else 0.0
    plan = training_bytes(r.shape, r.devices, cfg.micro_batch_tokens, _dtype_bytes(cfg, kind),
                          cfg.run.gradient_checkpointing, cfg.run.logprob_chunk, extra,
                          cfg.run.vocab_layout if r.devices > 1 else "whole", adapters,
                          r.shape.lora_inputs(lora.target_modules) if lora is not None else 0)
    rows = [(line, plan.get(line, 0.0), r.peak.get(line, 0.0))
            for line in dict.fromkeys([*plan, *r.peak])]
    return rows + [("total", sum(plan.values()), r.total)]


def step_seconds(r: Rehearsal, kind: str, mfu: float, tflops: float | None = None
                 ) -> tuple[float, float, int]:
    """(compute s, collective s, micro-batches) of one optimiser step of the recipe on this
    process: its micro-batches (the global batch's rows over the data-parallel groups, each as
    long as the rehearsed one) at the rehearsal's FLOPs and bytes per micro-batch, at `mfu` of
    the kind's peak and the link's bandwidth."""
    from reasoner.pipeline.step_time import PEAK_TFLOPS, micro_batches_per_step

    micro = micro_batches_per_step(r.config, r.devices)
    per_micro = r.flops / MICRO_BATCHES
    compute = micro * per_micro / ((tflops or PEAK_TFLOPS[kind]) * 1e12 * mfu)
    moved = sum(r.collectives.values()) / MICRO_BATCHES * (r.devices - 1) / r.devices
    return compute, micro * moved / (LINK_GBPS.get(kind, DEFAULT_LINK_GBPS) * 1e9), micro


def report(r: Rehearsal, kind: str, mfu: float, tflops: float | None = None) -> list[str]:
    """What `reasoner plan --rehearse` prints of a rehearsal: the plan's lines beside it, where
    its peak was, its loading, FLOPs, bytes and time per step, with the assumptions."""
    from reasoner.pipeline.plan import MARGIN, PEAK_TFLOPS

    head = (f"{r.stage}: rehearsed on {r.devices} fake process{'es' if r.devices > 1 else ''} "
            f"({r.shape.layers} layers, rows "
            f"of {r.row_tokens:,} tokens, sequence parallel {r.config.run.sequence_parallel}, "
            f"vocab {r.config.run.vocab_layout}) in {r.wall_s:.0f} s")
    out = [head, f"  {'line':<20} {'plan GiB':>9} {'rehearsed':>10} {'plan/rehearsed':>15}"]
    for line, plan, seen in compare(r, kind):
        ratio = f"{plan / seen:.2f}" if seen else "-"
        out.append(f"  {line:<20} {plan / GIB:9.2f} {seen / GIB:10.2f} {ratio:>15}")
    compute, comm, micro = step_seconds(r, kind, mfu, tflops)
    peak = tflops or PEAK_TFLOPS[kind]
    moved = ", ".join(f"{k} {v / MICRO_BATCHES / 1e9:.1f}" for k, v in sorted(r.collectives.items())
                      if v)
    out += [f"  peak in {r.where}; need {MARGIN * r.total / GIB:.1f} GiB with the plan's "
            f"{MARGIN - 1:.0%} margin (context, communication buffers, workspaces, "
            "fragmentation: what the tracker cannot see)",
            f"  loading: {r.load / GIB:.2f} GiB (the weights as loaded, before the first step)",
            f"  per micro-batch: {r.flops / MICRO_BATCHES / 1e12:,.0f} TFLOP; collectives (GB): "
            f"{moved}",
            f"  time per step: {micro} micro-batches: {compute:.0f} s of compute at {peak:g} "
            f"TFLOP/s x MFU {mfu:g} + {comm:.0f} s of collectives at "
            f"{LINK_GBPS.get(kind, DEFAULT_LINK_GBPS):g} GB/s a device (assumed, not overlapped)"]
    return out
