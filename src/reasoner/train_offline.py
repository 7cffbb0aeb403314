"""`reasoner train-offline`: offline policy training on a fixed, verified rollout set.

Infer once, train many: the Verified shard is tokenized once (rl/rollouts.py) and every
objective (rl/objectives.py: its signal, token scope and loss step) trains on it through the
shared training core (training/). A step takes `global_batch` samples; each process packs its
share into rows of `seq_len` tokens (or pads them) and each loss is given the global normaliser
it averages over (samples, tokens or positive tokens of the whole batch), so the loss and its
gradient do not depend on how samples are split into micro-batches, packs or processes. (The
published PCL code needed micro-batch 1 and could not pack.) The reference side (starting
log-probs, moving reference, ProRL resets) lives in rl/reference.py; OREAL's token reward model
in rl/token_rm.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

from reasoner import device as dev
from reasoner import models, shards, training
from reasoner.config import ObjectiveConfig, OfflineConfig, dump
from reasoner.data import packing
from reasoner.errors import TrainingError
from reasoner.models.attention import plan_attention
from reasoner.pipeline.memory import resident_extra
from reasoner.rl import losses, reference
from reasoner.rl.objectives import (
    OBJECTIVES,
    Micro,
    Norm,
    behaviour_gap,
    behaviour_logprobs,
    sample_signal,
    token_scope,
)
from reasoner.rl.rollouts import Rollouts, load_rollouts, sampling_of
from reasoner.rl.token_rm import TokenRewardModel, token_weights
from reasoner.runlog import check_sinks, progress_bar
from reasoner.training import checkpoints, schedule


@dataclass(frozen=True)
class Rows:
    """How a step's samples become rows and micro-batches (the config's packing settings)."""

    packing: bool
    seq_len: int
    micro_batch: int
    varlen: bool = False  # packed rows go flat to a varlen kernel (models.attention)

    @classmethod
    def of(cls, cfg: OfflineConfig, varlen: bool = False) -> Rows:
        return cls(cfg.packing, cfg.seq_len, cfg.run.micro_batch, varlen)


def micro_batches(samples: list[int], data: Rollouts, rows: Rows) -> list[list[list[int]]]:
    """Micro-batches of rows of rollout indices: packed bins, or one sample per row."""
    if rows.packing:
        bins = packing.pack([len(data.ids[i]) for i in samples], rows.seq_len)
        cut = [[samples[j] for j in b] for b in bins]
    else:
        cut = [[i] for i in sorted(samples, key=lambda i: len(data.ids[i]))]
    mb = rows.micro_batch
    return [cut[k:k + mb] for k in range(0, len(cut), mb)]


def _collate(data: Rollouts, rows: list[list[int]], how: Rows, pad: int) -> packing.Batch:
    """A micro-batch's rows as tensors: packed, with no mask (one flat row for a varlen kernel;
    transformers derives the mask from the position ids otherwise), or padded."""
    if how.packing:
        return packing.collate_packed([[(data.ids[i], data.loss_mask(i)) for i in r] for r in rows],
                                      max(sum(len(data.ids[i]) for i in r) for r in rows), pad,
                                      flat=how.varlen)
    return packing.collate_padded([(data.ids[r[0]], data.loss_mask(r[0])) for r in rows], pad)


def _flat(values: Sequence[list[float]] | None, index: list[int], device: torch.device
          ) -> Tensor | None:
    if values is None:
        return None
    return torch.tensor([x for i in index for x in values[i]], dtype=torch.float32, device=device)


@dataclass
class Ctx:
    """Everything a micro-batch step reads besides the policy."""

    obj: ObjectiveConfig
    rows: Rows
    global_batch: int
    seed: int
    data: Rollouts
    signal: Tensor  # (M,)
    scope: list[list[float]] | None
    old_lp: Sequence[list[float]] | None
    ref_lp: Sequence[list[float]] | None
    pad: int
    device: torch.device
    dtype: torch.dtype
    ref_model: nn.Module | None = None
    rm: nn.Module | None = None
    behaviour: str = ""  # where the behaviour log-probs come from (the summary says it)
    behaviour_gap: dict = field(default_factory=dict)  # stored vs the trainer's, when checked


def micro_loss(ctx: Ctx, policy: nn.Module, rows: list[list[int]], norm: Norm, scale: float
               ) -> training.MicroOut:
    """Forward + backward of one micro-batch's share of the global loss (times `scale`)."""
    data, device = ctx.data, ctx.device
    index = [i for r in rows for i in r]
    b = _collate(data, rows, ctx.rows, ctx.pad).to(device)
    sample_index = b.sample_index[b.labels >= 0]  # (N,)
    m = Micro(index, sample_index, ctx.signal[index].to(device), data.rewards[index].to(device),
              data.group_acc[index].to(device), _flat(ctx.old_lp, index, device),
              _flat(ctx.ref_lp, index, device), _flat(ctx.scope, index, device))
    share = len(index) / norm.samples
    extra: dict[str, float] = {}
    if ctx.ref_model is not None:
        with torch.no_grad(), dev.autocast(device, ctx.dtype):
            m.ref_logp = ctx.ref_model(b.input_ids, b.position_ids, b.attention_mask,
                                       b.labels).float()  # (N,)
    if ctx.rm is not None:
        scores, extra["rm_bce"] = rm_pass(ctx, b, sample_index, m.rewards, norm, scale)
        m.weights = token_weights(scores, sample_index, m.rewards)
    with dev.autocast(device, ctx.dtype):
        logp = policy(b.input_ids, b.position_ids, b.attention_mask, b.labels).float()  # (N,)
    loss, metrics = OBJECTIVES[ctx.obj.name].step(logp, m, ctx.obj, norm)
    (loss * scale).backward()
    metrics = {k: v for k, v in {**metrics, **extra}.items() if k not in ("loss", "pos_tokens")}
    return training.MicroOut({"loss": float(loss.detach()), "tokens": b.real_tokens}, metrics, share)


def rm_pass(ctx: Ctx, b: packing.Batch, sample_index: Tensor, rewards: Tensor, norm: Norm,
            scale: float) -> tuple[Tensor, float]:
    """The token RM's scores (N,) and its BCE step: sigmoid(mean token score) against
    correctness, backward as this micro-batch's share; (scores, mean BCE)."""
    with dev.autocast(ctx.device, ctx.dtype):
        scores = ctx.rm(b)  # (N,)
    seq = losses.segment_mean(scores, sample_index, len(rewards))  # (b,)
    bce = nn.functional.binary_cross_entropy_with_logits(seq, (rewards > 0).float(),
                                                         reduction="sum")
    # the RM has its own optimiser and no loss scaler: only the dummy-pass zero applies
    (bce / norm.samples * float(scale > 0)).backward()
    return scores, float(bce.detach()) / len(rewards)


def rm_step(rm_opt: torch.optim.Optimizer) -> None:
    rm_opt.step()
    rm_opt.zero_grad(set_to_none=True)


def rm_warmup(ctx: Ctx, trainer: training.Run, rm_opt: torch.optim.Optimizer,
              train_idx: list[int], steps: int) -> list[float]:
    """OREAL's frozen-actor start: `steps` global batches (the first ones of the schedule)
    that train only the token RM; the policy, its optimiser and its schedule are untouched.
    Returns the mean BCE per step."""
    bces: list[float] = []
    with progress_bar(trainer.settings.progress and trainer.dist.is_main) as bar:
        task = bar.add_task("token RM warm-up", total=steps, info="")
        for step in range(steps):
            bces.append(_rm_warmup_step(ctx, trainer, rm_opt, train_idx, step))
            bar.update(task, advance=1, info=f"bce {bces[-1]:.4f}")
    return bces


def _rm_warmup_step(ctx: Ctx, trainer: training.Run, rm_opt: torch.optim.Optimizer,
                    train_idx: list[int], step: int) -> float:
    data, dist = ctx.data, trainer.dist
    batch_idx = [train_idx[i] for i in schedule.global_batch_rows(
        len(train_idx), ctx.global_batch, ctx.seed, step)]
    norm = Norm(samples=len(batch_idx), tokens=0, pos_tokens=0)

    def one(rows: list[list[int]], scale: float) -> training.MicroOut:
        index = [i for r in rows for i in r]
        b = _collate(data, rows, ctx.rows, ctx.pad).to(ctx.device)
        _, bce = rm_pass(ctx, b, b.sample_index[b.labels >= 0],
                         data.rewards[index].to(ctx.device), norm, scale)
        return training.MicroOut({}, {"rm_bce": bce}, len(index) / norm.samples)

    mbs = micro_batches(batch_idx[dist.rank::dist.world_size], data, ctx.rows)
    bce = training.accumulate(trainer, mbs, one, dummy=[[batch_idx[0]]])["rm_bce"]
    rm_step(rm_opt)
    return bce


def prepare(cfg: OfflineConfig, env: training.Env, tokenizer, data: Rollouts
            ) -> tuple[Ctx, tuple[nn.Module, nn.Module], Path | None]:
    """The objective's inputs (signal, scopes, reference and behaviour log-probs), the
    (model, policy) to train (the starting model, or the checkpoint resumed from) and that
    checkpoint. With several processes every model here is sharded as it loads."""
    device, dist, dtype = env
    obj, out, chunk = cfg.objective, Path(cfg.output_dir), cfg.run.logprob_chunk
    need_ref = obj.needs_reference
    need_old, ctx_note = behaviour_logprobs(obj, data, sampling_of(cfg.input_dir))
    temperature = obj.logprob_temperature
    attn = plan_attention(cfg.model.attn_implementation, device, dtype, cfg.packing)
    load = lambda source: training.load_policy(  # noqa: E731
        cfg.model, source, env, chunk, temperature, attn.implementation,
        training.vocab_split(cfg, env, resident_extra(obj)))
    start = load(cfg.model.name_or_path)
    start[1].eval()
    gap: dict[str, float] = {}
    if obj.needs_old_logprobs and not need_old:  # the stored ones will be pi_old: check them
        need_old, ctx_note, gap = check_behaviour(obj, data, start[1], tokenizer.pad_token_id,
                                                  device, dtype, ctx_note)
    start_lp = None
    if need_old or (need_ref and cfg.reference is None):
        start_lp = reference.starting_logprobs(out / "ref_logprobs", str(cfg.input_dir), start[1],
                                               data, tokenizer.pad_token_id, device, dtype, dist)
    ref_lp = start_lp
    if need_ref and cfg.reference is not None:  # a fixed anchor other than the starting model
        anchor = load(cfg.reference)[1].eval()
        ref_lp = reference.starting_logprobs(out / "anchor_logprobs",
                                             f"{cfg.input_dir} scored by {cfg.reference}", anchor,
                                             data, tokenizer.pad_token_id, device, dtype, dist)
        del anchor
    ref_model = start[1] if obj.resident_reference else None
    ckpt = training.resume_point(out, cfg.run)
    if ckpt is not None:
        loaded = load(ckpt)
    elif obj.resident_reference:  # a second copy, loaded (and sharded) like the first
        loaded = load(cfg.model.name_or_path)
    else:
        loaded = start
    ctx = Ctx(obj, Rows.of(cfg, attn.varlen), cfg.run.global_batch, cfg.run.seed, data,
              sample_signal(obj, data),
              token_scope(data, obj), start_lp if need_old else data.old_logp, ref_lp,
              tokenizer.pad_token_id, device, dtype, ref_model, behaviour=ctx_note,
              behaviour_gap=gap)
    return ctx, loaded, ckpt


CHECKED = 16  # samples whose stored behaviour log-probs are compared with the trainer's


def check_behaviour(obj: ObjectiveConfig, data: Rollouts, policy: nn.Module, pad: int,
                    device: torch.device, dtype: torch.dtype, note: str
                    ) -> tuple[bool, str, dict[str, float]]:
    """Score the first samples with the starting policy and compare with the stored behaviour
    log-probs: (recompute them?, where they come from, the gap). A sampler whose kernels or
    precision differ from the trainer's (vLLM in bf16 on a GPU) gives a ratio that is not 1
    at theta_old; above objective.old_logprobs_tolerance the run recomputes them (or stops)."""
    first = list(range(min(CHECKED, len(data.ids))))
    scored = reference.response_logprobs(policy, data, first, pad, device, dtype)
    gap = behaviour_gap([list(data.old_logp[i]) for i in first], scored)
    said = (f"stored vs trainer on {len(first)} samples: mean |Δ| {gap['mean_abs_diff']:.4f}, "
            f"max {gap['max_abs_diff']:.4f}, ratio {gap['ratio_min']:.3f}-{gap['ratio_max']:.3f}")
    if gap["mean_abs_diff"] <= obj.old_logprobs_tolerance:
        return False, f"{note} ({said})", gap
    if not obj.allow_recompute:
        raise TrainingError(
            f"the stored behaviour log-probs are not the trainer's at theta_old ({said}; "
            f"objective.old_logprobs_tolerance={obj.old_logprobs_tolerance}): set "
            "objective.allow_recompute=true to recompute them, or raise the tolerance")
    return True, f"recomputed by the starting model ({said}, over the tolerance)", gap


def token_reward_model(cfg: OfflineConfig, env: training.Env, model: nn.Module) -> nn.Module:
    """OREAL's token RM: a copy of the starting policy with a zero head (sharded as it loads
    with several processes)."""
    from reasoner.models.fsdp import load_sharded

    device, dist, dtype = env
    if dist.world_size == 1:
        rm = TokenRewardModel(model).to(device)
    else:
        attn = plan_attention(cfg.model.attn_implementation, device, dtype, cfg.packing)
        mcfg = cfg.model.model_copy(update={"attn_implementation": attn.implementation})
        rm = load_sharded(mcfg, cfg.model.name_or_path, device, dist,
                          lambda m: TokenRewardModel(m, copy=False), skip=("head.",), dtype=dtype,
                          vocab=training.vocab_split(cfg, env,
                                                     resident_extra(cfg.objective)))
        rm.reset_head()
    if cfg.run.gradient_checkpointing:  # it trains on the policy's batches: as long, as wide
        rm.model.gradient_checkpointing_enable()
    rm.train()
    return rm


def run(cfg: OfflineConfig) -> Path:
    """Train; return the final HF model folder (`output_dir/final`)."""
    out, obj = Path(cfg.output_dir), cfg.objective
    if shards.finished(out, dump(cfg)):
        return out / "final"
    models.check_model(cfg.model.name_or_path)
    check_sinks(cfg.run.tracking)  # before the rollouts are tokenized and cached
    if cfg.reference is not None:
        models.check_model(cfg.reference, "reference")
    env = device, dist, dtype = training.setup(cfg.model, cfg.run.seed,
                                               cfg.run.dist_timeout_min, out)
    tokenizer = models.load_tokenizer(cfg.model.name_or_path, cfg.model.trust_remote_code)
    data = load_rollouts(cfg, tokenizer, dist)
    ctx, loaded, ckpt = prepare(cfg, env, tokenizer, data)
    train_idx, val_idx = reference.split_validation(data, obj, cfg.run.seed)
    plateau = reference.Plateau(obj.reset_patience) if val_idx else None
    trainer = training.start(cfg, "train-offline", env, tokenizer, loaded,
                             schedule.total_steps(len(train_idx), cfg.run), ckpt,
                             {"model": cfg.model.name_or_path, "verified": str(cfg.input_dir)})
    rm_opt = None
    if obj.uses_token_rm:
        ctx.rm = token_reward_model(cfg, env, trainer.model)
        rm_opt = torch.optim.AdamW(ctx.rm.parameters(), lr=obj.rm_lr)
    restore_aux(ckpt, trainer.saved, ctx.rm, rm_opt, ctx.ref_model, plateau)
    warmup_bce: list[float] = []
    if rm_opt is not None and trainer.start == 0 and obj.rm_warmup_steps:
        warmup_bce = rm_warmup(ctx, trainer, rm_opt, train_idx, obj.rm_warmup_steps)
    state = lambda: {"plateau": dict(vars(plateau))} if plateau is not None else {}  # noqa: E731
    if aux_models(ctx.rm, rm_opt, ctx.ref_model)[0]:
        trainer.aux = lambda: checkpoints.aux_state(*aux_models(ctx.rm, rm_opt, ctx.ref_model))
    last: dict[str, float] = {}
    with training.progress(trainer, f"train-offline ({obj.name})"):
        for step in range(trainer.start, trainer.total):
            batch_idx = [train_idx[i] for i in schedule.global_batch_rows(
                len(train_idx), cfg.run.global_batch, cfg.run.seed, step)]
            norm = Norm(samples=len(batch_idx), tokens=sum(data.resp_len(i) for i in batch_idx),
                        pos_tokens=sum(data.resp_len(i) for i in batch_idx if data.rewards[i] > 0))
            mbs = micro_batches(batch_idx[dist.rank::dist.world_size], data, ctx.rows)
            m = training.accumulate(trainer, mbs, lambda mb, scale, norm=norm: micro_loss(
                ctx, trainer.policy, mb, norm, scale), dummy=[[batch_idx[0]]])
            last = {**m, **training.optimizer_step(trainer, m["loss"], step)}
            if rm_opt is not None:
                rm_step(rm_opt)
            reference.move_reference(obj, step + 1, trainer.policy, ctx.ref_model,
                                     trainer.optimizer)
            if plateau is not None and (step + 1) % obj.val_every == 0:
                margin = reference.validation_margin(trainer.policy, data, val_idx, ctx.pad,
                                                     device, dtype)
                if plateau.update(margin):
                    reference.reset(trainer.policy, ctx.ref_model, trainer.optimizer)
                last.update(val_margin=margin, resets=plateau.resets)
            trainer.tokens += last.pop("tokens")
            last = training.end_step(trainer, step, last, f"loss {last['loss']:.4f}", state)
    pos = int((data.rewards > 0).sum())
    return training.finish(trainer, {
        "objective": obj.name, "samples": len(data.ids), "positives": pos,
        "negatives": len(data.ids) - pos, "behaviour_logprobs": ctx.behaviour,
        **{f"behaviour_{k}": round(v, 6) for k, v in ctx.behaviour_gap.items()},
        **({"validation_samples": len(val_idx), "plateau_resets": plateau.resets}
           if plateau is not None else {}),
        **({"rm_warmup_bce": [round(x, 4) for x in warmup_bce]} if warmup_bce else {}),
        "dropped_over_max_tokens": data.dropped, "final_loss": last.get("loss")}, state)


def aux_models(rm: nn.Module | None, rm_opt: torch.optim.Optimizer | None,
               ref_model: nn.Module | None) -> tuple[dict, dict]:
    """The models a resumed run needs beyond the policy, and their optimisers, by name: the
    token RM and its optimiser (oreal), the reference when it moves (ProRL resets, discounted's
    moving reference). Checkpointed shard by shard (`checkpoints.aux_state`)."""
    models = {"token_rm": rm} if rm is not None else {}
    optimizers = {"token_rm_optim": (rm, rm_opt)} if rm is not None else {}
    if ref_model is not None:
        models["reference"] = ref_model
    return models, optimizers


def restore_aux(ckpt: Path | None, saved: dict, rm: nn.Module | None,
                rm_opt: torch.optim.Optimizer | None, ref_model: nn.Module | None,
                plateau: reference.Plateau | None) -> None:
    """Put back what the checkpoint resumed from held beyond the policy (`aux_models`, the
    plateau tracker)."""
    if plateau is not None and "plateau" in saved:
        vars(plateau).update(saved["plateau"])
    models, optimizers = aux_models(rm, rm_opt, ref_model)
    if ckpt is not None and models:
        checkpoints.load_aux(ckpt, models, optimizers)
