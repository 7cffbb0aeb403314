"""`reasoner train-offline`: offline policy training on a fixed, verified rollout set.

Infer once, train many: the Verified shard is tokenized once and every objective of
losses.py trains on it through the shared training core (training.py). A step takes
`global_batch` samples; each process packs its share into rows of `seq_len` tokens (or pads
them) and each loss is given the global normaliser it averages over (samples, tokens or
positive tokens of the whole batch), so the loss and its gradient do not depend on how samples
are split into micro-batches, packs or processes. (The published PCL code needed micro-batch 1
and could not pack.) The reference side (starting log-probs, moving reference, ProRL resets)
lives in reference.py; OREAL's token reward model in token_rm.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from reasoner import device as dev
from reasoner import losses, models, reference, schedule, sharded, shards, training
from reasoner.config import CLIPPED, ObjectiveConfig, OfflineConfig, OREALObjective, dump
from reasoner.data import packing
from reasoner.errors import TrainingError
from reasoner.rollouts import Rollouts, load_rollouts, sample_signal, sampling_of, token_scope
from reasoner.runlog import progress_bar
from reasoner.token_rm import TokenRewardModel, token_weights


@dataclass
class Micro:
    """One micro-batch's per-sample and per-token inputs to an objective."""

    index: list[int]  # rollout indices of its samples
    sample_index: Tensor  # (N,) 0..b-1
    signal: Tensor  # (b,) reward or advantage the objective trains with
    rewards: Tensor  # (b,)
    group_acc: Tensor  # (b,)
    old_logp: Tensor | None  # (N,)
    ref_logp: Tensor | None  # (N,)
    weights: Tensor | None  # (N,) token weights (oreal) or scope mask (pcl neg_scope)


@dataclass
class Norm:
    """Global-batch normalisers, handed to the losses."""

    samples: float
    tokens: float
    pos_tokens: float


def _with_kl(loss: Tensor, metrics: dict, logp: Tensor, m: Micro, obj: ObjectiveConfig, n: Norm,
             agg: str) -> tuple[Tensor, dict]:
    if not getattr(obj, "kl_coef", 0.0):
        return loss, metrics
    kl, mean = losses.kl_loss(logp, m.ref_logp, m.sample_index, len(m.index), agg, n.tokens,
                              n.samples)
    return loss + obj.kl_coef * kl, {**metrics, "kl": mean}


def pcl_step(logp: Tensor, m: Micro, obj, n: Norm) -> tuple[Tensor, dict]:
    keep = m.weights > 0 if m.weights is not None else slice(None)  # neg_scope: own tokens only
    loss, metrics = losses.pcl_loss(logp[keep], m.sample_index[keep], m.signal, n.samples)
    return _with_kl(loss, metrics, logp, m, obj, n, "seq-mean-token-mean")


def rft_step(logp: Tensor, m: Micro, obj, n: Norm) -> tuple[Tensor, dict]:
    return losses.rft_loss(logp, m.sample_index, m.rewards, n.pos_tokens)


def clipped_step(logp: Tensor, m: Micro, obj, n: Norm) -> tuple[Tensor, dict]:
    loss, metrics = losses.clipped_pg_loss(logp, m.old_logp, m.signal, m.sample_index, obj.eps_low,
                                           obj.eps_high, obj.agg, n.tokens, n.samples)
    return _with_kl(loss, metrics, logp, m, obj, n, "token-mean")


def oreal_step(logp: Tensor, m: Micro, obj, n: Norm) -> tuple[Tensor, dict]:
    weights = m.weights if m.weights is not None else torch.ones_like(logp)
    return losses.oreal_loss(logp, m.ref_logp, m.sample_index, m.rewards, m.group_acc, weights,
                             obj.eta, obj.beta, n.samples)


OBJECTIVES = {"pcl": pcl_step, "rft": rft_step, "dapo": clipped_step, "prorl": clipped_step,
              "discounted": clipped_step, "oreal": oreal_step}


def needs(obj: ObjectiveConfig, data: Rollouts, sampling: dict | None = None
          ) -> tuple[bool, bool, str]:
    """(needs reference log-probs, needs recomputed behaviour log-probs, where the behaviour
    log-probs come from, in words).

    Stored log-probs are those of the distribution the sampler drew from: logits / T, top-k,
    top-p. The policy is scored at logprob_temperature over the whole vocabulary, so the
    ratio pi/pi_old is 1 at theta_old only when T matches and nothing was truncated; `auto`
    recomputes them otherwise, an explicit `samples` with another temperature is an error.
    """
    ref = getattr(obj, "kl_coef", 0.0) > 0 or isinstance(obj, OREALObjective)
    if not isinstance(obj, CLIPPED):
        return ref, False, "not used"
    mismatch = []
    if sampling is not None:
        t = sampling.get("temperature", 1.0)
        if abs(t - obj.logprob_temperature) > 1e-9:
            mismatch.append(f"sampled at temperature {t}, scored at objective."
                            f"logprob_temperature {obj.logprob_temperature}")
        if (sampling.get("top_k") or 0) > 0 or sampling.get("top_p", 1.0) < 1.0:
            mismatch.append(f"sampled with top_k {sampling.get('top_k')} / top_p "
                            f"{sampling.get('top_p')}, which truncate the distribution")
    mode = obj.old_logprobs
    if data.old_logp is None and mode != "recompute" and not obj.allow_recompute:
        raise TrainingError(
            f"objective {obj.name} needs the behaviour log-probs of the samples, and "
            f"{data.keys[0]} has none: rerun `reasoner infer` with sampling.logprobs=true, "
            "or set objective.allow_recompute=true to use the starting model's log-probs")
    if mode == "auto":
        mode = "samples" if data.old_logp is not None and sampling is not None and not mismatch \
            else "recompute"
        if mode == "recompute":
            why = "; ".join(mismatch) if mismatch else (
                "the samples carry none" if data.old_logp is None else
                "the samples' sampling settings are unknown")
            return ref, True, f"recomputed by the starting model ({why})"
    if mode == "recompute":
        return ref, True, "recomputed by the starting model (objective.old_logprobs=recompute)"
    if data.old_logp is None:
        return ref, True, "recomputed by the starting model (the samples carry none)"
    if mismatch and mismatch[0].startswith("sampled at temperature"):
        raise TrainingError(
            f"objective.old_logprobs=samples, but the samples were {mismatch[0]}: the ratio "
            f"would not be 1 at theta_old. Set objective.logprob_temperature="
            f"{sampling['temperature']}, or objective.old_logprobs=auto to recompute them")
    if mismatch:
        return ref, False, f"stored by infer ({mismatch[-1]}: the ratio is below 1 at theta_old)"
    return ref, False, "stored by infer"


def micro_batches(samples: list[int], data: Rollouts, cfg: OfflineConfig) -> list[list[list[int]]]:
    """Micro-batches of rows of rollout indices: packed bins, or one sample per row."""
    if cfg.packing:
        bins = packing.pack([len(data.ids[i]) for i in samples], cfg.seq_len)
        rows = [[samples[j] for j in b] for b in bins]
    else:
        rows = [[i] for i in sorted(samples, key=lambda i: len(data.ids[i]))]
    mb = cfg.run.micro_batch
    return [rows[k:k + mb] for k in range(0, len(rows), mb)]


def _collate(data: Rollouts, rows: list[list[int]], cfg: OfflineConfig, pad: int) -> packing.Batch:
    if cfg.packing:
        return packing.collate_packed([[(data.ids[i], data.loss_mask(i)) for i in r] for r in rows],
                                      max(sum(len(data.ids[i]) for i in r) for r in rows), pad)
    return packing.collate_padded([(data.ids[r[0]], data.loss_mask(r[0])) for r in rows], pad)


def _flat(values: Sequence[list[float]] | None, index: list[int], device: torch.device
          ) -> Tensor | None:
    if values is None:
        return None
    return torch.tensor([x for i in index for x in values[i]], dtype=torch.float32, device=device)


@dataclass
class Ctx:
    """Everything a micro-batch step reads besides the policy."""

    cfg: OfflineConfig
    data: Rollouts
    signal: Tensor  # (M,)
    scope: list[list[float]] | None
    old_lp: list[list[float]] | None
    ref_lp: Sequence[list[float]] | None
    pad: int
    device: torch.device
    dtype: torch.dtype
    ref_model: nn.Module | None = None
    rm: nn.Module | None = None
    behaviour: str = ""  # where the behaviour log-probs come from (the summary says it)


def micro_loss(ctx: Ctx, policy: nn.Module, rows: list[list[int]], norm: Norm, scale: float
               ) -> training.MicroOut:
    """Forward + backward of one micro-batch's share of the global loss (times `scale`)."""
    data, device = ctx.data, ctx.device
    index = [i for r in rows for i in r]
    b = _collate(data, rows, ctx.cfg, ctx.pad).to(device)
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
    loss, metrics = OBJECTIVES[ctx.cfg.objective.name](logp, m, ctx.cfg.objective, norm)
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


def rm_step(ctx: Ctx, rm_opt: torch.optim.Optimizer, dist) -> None:
    training.sum_over_processes(ctx.rm, dist)
    rm_opt.step()
    rm_opt.zero_grad(set_to_none=True)


def rm_warmup(ctx: Ctx, run: training.Run, rm_opt: torch.optim.Optimizer, train_idx: list[int],
              steps: int) -> list[float]:
    """OREAL's frozen-actor start: `steps` global batches (the first ones of the schedule)
    that train only the token RM; the policy, its optimiser and its schedule are untouched.
    Returns the mean BCE per step."""
    cfg = ctx.cfg
    bces: list[float] = []
    with progress_bar(cfg.run.progress and run.dist.is_main) as bar:
        task = bar.add_task("token RM warm-up", total=steps, info="")
        for step in range(steps):
            bces.append(_rm_warmup_step(ctx, run, rm_opt, train_idx, step))
            bar.update(task, advance=1, info=f"bce {bces[-1]:.4f}")
    return bces


def _rm_warmup_step(ctx: Ctx, run: training.Run, rm_opt: torch.optim.Optimizer,
                    train_idx: list[int], step: int) -> float:
    cfg, data = ctx.cfg, ctx.data
    batch_idx = [train_idx[i] for i in schedule.global_batch_rows(
        len(train_idx), cfg.run.global_batch, cfg.run.seed, step)]
    norm = Norm(samples=len(batch_idx), tokens=0, pos_tokens=0)

    def one(rows: list[list[int]], scale: float) -> training.MicroOut:
        index = [i for r in rows for i in r]
        b = _collate(data, rows, cfg, ctx.pad).to(ctx.device)
        _, bce = rm_pass(ctx, b, b.sample_index[b.labels >= 0],
                         data.rewards[index].to(ctx.device), norm, scale)
        return training.MicroOut({}, {"rm_bce": bce}, len(index) / norm.samples)

    mbs = micro_batches(batch_idx[run.dist.rank::run.dist.world_size], data, cfg)
    bce = training.accumulate(run, mbs, one, dummy=[[batch_idx[0]]])["rm_bce"]
    rm_step(ctx, rm_opt, run.dist)
    return bce


def prepare(cfg: OfflineConfig, env, tokenizer, data: Rollouts
            ) -> tuple[Ctx, tuple[nn.Module, nn.Module], Path | None]:
    """The objective's inputs (signal, scopes, reference and behaviour log-probs), the
    (model, policy) to train (the starting model, or the checkpoint resumed from) and that
    checkpoint. With several processes every model here is sharded as it loads."""
    device, dist, dtype = env
    obj = cfg.objective
    need_ref, need_old, ctx_note = needs(obj, data, sampling_of(cfg.input_dir))
    temperature = obj.logprob_temperature
    start = training.load_policy(cfg, cfg.model.name_or_path, env, temperature)
    start[1].eval()
    start_lp = None
    if need_old or (need_ref and cfg.reference is None):
        start_lp = reference.starting_logprobs(Path(cfg.output_dir) / "ref_logprobs",
                                               str(cfg.input_dir), start[1], data,
                                               tokenizer.pad_token_id, device, dtype, dist)
    ref_lp = start_lp
    if need_ref and cfg.reference is not None:  # a fixed anchor other than the starting model
        anchor = training.load_policy(cfg, cfg.reference, env, temperature)[1].eval()
        ref_lp = reference.starting_logprobs(Path(cfg.output_dir) / "anchor_logprobs",
                                             f"{cfg.input_dir} scored by {cfg.reference}", anchor,
                                             data, tokenizer.pad_token_id, device, dtype, dist)
        del anchor
    moving = (getattr(obj, "ref_update_every", None) or getattr(obj, "reset_every", None)
              or getattr(obj, "reset_patience", None)) and getattr(obj, "kl_coef", 0.0) > 0
    ref_model = start[1] if moving else None
    ckpt = training.resume_point(cfg)
    if ckpt is not None:
        loaded = training.load_policy(cfg, ckpt, env, temperature)
    elif moving:  # a second copy, loaded (and sharded) like the first
        loaded = training.load_policy(cfg, cfg.model.name_or_path, env, temperature)
    else:
        loaded = start
    ctx = Ctx(cfg, data, sample_signal(obj, data), token_scope(data, obj),
              start_lp if need_old else data.old_logp, ref_lp, tokenizer.pad_token_id, device, dtype,
              ref_model, behaviour=ctx_note)
    return ctx, loaded, ckpt


def token_reward_model(cfg: OfflineConfig, env, model: nn.Module) -> nn.Module:
    """OREAL's token RM: a copy of the starting policy with a zero head (sharded as it loads
    with several processes)."""
    device, dist, dtype = env
    if dist.world_size == 1:
        return TokenRewardModel(model).to(device)
    rm = sharded.load_sharded(cfg.model, cfg.model.name_or_path, device, dist,
                              lambda m: TokenRewardModel(m, copy=False), skip=("head.",))
    rm.reset_head()
    return rm


def run(cfg: OfflineConfig) -> Path:
    """Train; return the final HF model folder (`output_dir/final`)."""
    out, obj = Path(cfg.output_dir), cfg.objective
    if shards.finished(out, dump(cfg)):
        return out / "final"
    env = device, dist, dtype = training.setup(cfg)
    tokenizer = models.load_tokenizer(cfg.model.name_or_path, cfg.model.trust_remote_code)
    data = load_rollouts(cfg, tokenizer, dist)
    ctx, loaded, ckpt = prepare(cfg, env, tokenizer, data)
    train_idx, val_idx = reference.split_validation(data, obj, cfg.run.seed)
    plateau = reference.Plateau(obj.reset_patience) if val_idx else None
    run = training.start(cfg, "train-offline", env, tokenizer, loaded,
                         schedule.total_steps(len(train_idx), cfg.run), ckpt,
                         {"model": cfg.model.name_or_path, "verified": str(cfg.input_dir)})
    rm_opt = None
    if isinstance(obj, OREALObjective) and obj.token_weights == "rm":
        ctx.rm = token_reward_model(cfg, env, run.model)
        rm_opt = torch.optim.AdamW(ctx.rm.parameters(), lr=obj.rm_lr)
    restore_aux(run.saved, ctx.rm, rm_opt, ctx.ref_model, plateau)
    warmup_bce: list[float] = []
    if rm_opt is not None and run.start == 0 and obj.rm_warmup_steps:
        warmup_bce = rm_warmup(ctx, run, rm_opt, train_idx, obj.rm_warmup_steps)
    state = lambda: aux_state(ctx.rm, rm_opt, ctx.ref_model, plateau)  # noqa: E731
    last: dict[str, float] = {}
    with training.progress(run, f"train-offline ({obj.name})"):
        for step in range(run.start, run.total):
            batch_idx = [train_idx[i] for i in schedule.global_batch_rows(
                len(train_idx), cfg.run.global_batch, cfg.run.seed, step)]
            norm = Norm(samples=len(batch_idx), tokens=sum(data.resp_len(i) for i in batch_idx),
                        pos_tokens=sum(data.resp_len(i) for i in batch_idx if data.rewards[i] > 0))
            mbs = micro_batches(batch_idx[dist.rank::dist.world_size], data, cfg)
            m = training.accumulate(run, mbs, lambda mb, scale, norm=norm: micro_loss(
                ctx, run.policy, mb, norm, scale), dummy=[[batch_idx[0]]])
            last = {**m, **training.optimizer_step(run, m["loss"], step)}
            if rm_opt is not None:
                rm_step(ctx, rm_opt, dist)
            reference.move_reference(obj, step + 1, run.policy, ctx.ref_model, run.optimizer)
            if plateau is not None and (step + 1) % obj.val_every == 0:
                margin = reference.validation_margin(run.policy, data, val_idx, ctx.pad, device, dtype)
                if plateau.update(margin):
                    reference.reset(run.policy, ctx.ref_model, run.optimizer)
                last.update(val_margin=margin, resets=plateau.resets)
            run.tokens += last.pop("tokens")
            last = training.end_step(run, step, last, f"loss {last['loss']:.4f}", state)
    pos = int((data.rewards > 0).sum())
    return training.finish(run, {
        "objective": obj.name, "samples": len(data.ids), "positives": pos,
        "negatives": len(data.ids) - pos, "behaviour_logprobs": ctx.behaviour,
        **({"validation_samples": len(val_idx), "plateau_resets": plateau.resets}
           if plateau is not None else {}),
        **({"rm_warmup_bce": [round(x, 4) for x in warmup_bce]} if warmup_bce else {}),
        "dropped_over_max_tokens": data.dropped, "final_loss": last.get("loss")}, state)


def aux_state(rm: nn.Module | None, rm_opt: torch.optim.Optimizer | None,
              ref_model: nn.Module | None, plateau: reference.Plateau | None) -> dict:
    """What a resumed run needs beyond the policy: the token RM and its optimiser (oreal), the
    reference when it moves (ProRL resets, discounted's moving reference), the plateau tracker."""
    from reasoner.checkpoints import full_state

    state = {}
    if rm is not None:
        state["token_rm"], state["token_rm_optim"] = full_state(rm, rm_opt)
    if ref_model is not None:  # gathered whole (a collective: every process calls it)
        state["reference"] = reference.plain_state(ref_model)
    if plateau is not None:
        state["plateau"] = dict(vars(plateau))
    return state


def restore_aux(saved: dict, rm: nn.Module | None, rm_opt: torch.optim.Optimizer | None,
                ref_model: nn.Module | None, plateau: reference.Plateau | None) -> None:
    from reasoner.checkpoints import restore_state

    if plateau is not None and "plateau" in saved:
        vars(plateau).update(saved["plateau"])
    if rm is not None and "token_rm" in saved:
        restore_state(rm, rm_opt, saved["token_rm"], saved["token_rm_optim"])
    if ref_model is not None and "reference" in saved:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(ref_model, saved["reference"],
                             options=StateDictOptions(full_state_dict=True))
