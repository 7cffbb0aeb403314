"""`reasoner train-offline`: offline policy training on a fixed, verified rollout set.

Infer once, train many: the Verified shard is tokenized once and every objective of
losses.py trains on it through one loop. A step takes `global_batch` samples; each process
packs its share into rows of `seq_len` tokens (or pads them) and scales each micro-batch's
loss by its share of the global normaliser (samples, tokens or positive tokens, whichever
the objective averages over), so the loss and its gradient do not depend on how samples are
split into micro-batches, packs or processes. (The published PCL code needed micro-batch 1
and could not pack.)

Reference log-probs (KL anchors, OREAL, recomputed behaviour log-probs) come from the starting
model, computed once into `ref_logprobs/`; a second model stays resident only when the
reference moves (ProRL resets, the discounted objective's moving reference).
"""

from __future__ import annotations

import copy
import math
import random
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from reasoner import device as dev
from reasoner import losses, shards, training
from reasoner.config import ObjectiveConfig, OfflineConfig, dump
from reasoner.data import packing
from reasoner.logprobs import PolicyLogprobs
from reasoner.rollouts import (  # noqa: F401
    Rollouts,
    divergence,
    load_rollouts,
    sample_signal,
    token_scope,
)
from reasoner.sft import TrainingError
from reasoner.token_rm import TokenRewardModel, running_mean, token_weights  # noqa: F401

CLIPPED = ("dapo", "prorl", "discounted")


@dataclass
class Micro:
    """One micro-batch's per-sample and per-token inputs to an objective."""

    index: list[int]  # rollout indices of its samples
    sample_index: Tensor  # (N,) 0..b-1
    signal: Tensor  # (b,)
    rewards: Tensor  # (b,)
    group_acc: Tensor  # (b,)
    old_logp: Tensor | None  # (N,)
    ref_logp: Tensor | None  # (N,)
    weights: Tensor | None  # (N,) token weights (oreal)


@dataclass
class Norm:
    """Global-batch normalisers: every micro-batch loss is scaled to its share of these."""

    samples: float
    tokens: float
    pos_tokens: float


def pcl_step(logp: Tensor, m: Micro, obj: ObjectiveConfig, n: Norm) -> tuple[Tensor, dict]:
    scale = torch.full_like(m.signal, obj.neg_weight)
    if obj.balance:  # each group's negatives weigh as much, together, as its positives
        p = m.group_acc.clamp(0.0, 1 - 1e-6)
        scale = scale * p / (1 - p)
    r = torch.where(m.signal < 0, m.signal * scale, m.signal)
    if m.weights is not None:  # neg_scope=divergent: score negatives on their own tokens only
        keep = m.weights > 0
        loss, metrics = losses.pcl_loss(logp[keep], m.sample_index[keep], r)
    else:
        loss, metrics = losses.pcl_loss(logp, m.sample_index, r)
    loss = loss * len(m.index) / n.samples
    if obj.kl_coef:
        kl = losses.segment_mean(losses.kl_penalty(logp, m.ref_logp), m.sample_index, len(m.index))
        loss = loss + obj.kl_coef * kl.sum() / n.samples
        metrics["kl"] = float(kl.mean().detach())
    return loss, metrics


def rft_step(logp: Tensor, m: Micro, obj: ObjectiveConfig, n: Norm) -> tuple[Tensor, dict]:
    loss, metrics = losses.rft_loss(logp, m.sample_index, m.rewards)
    return loss * metrics["pos_tokens"] / max(n.pos_tokens, 1.0), metrics


def clipped_step(logp: Tensor, m: Micro, obj: ObjectiveConfig, n: Norm) -> tuple[Tensor, dict]:
    loss, metrics = losses.clipped_pg_loss(logp, m.old_logp, m.signal, m.sample_index,
                                           obj.eps_low, obj.eps_high, obj.agg)
    scale = logp.numel() / n.tokens if obj.agg == "token-mean" else len(m.index) / n.samples
    loss = loss * scale
    if obj.kl_coef:
        kl = losses.kl_penalty(logp, m.ref_logp)
        loss = loss + obj.kl_coef * kl.sum() / n.tokens
        metrics["kl"] = float(kl.mean().detach())
    return loss, metrics


def oreal_step(logp: Tensor, m: Micro, obj: ObjectiveConfig, n: Norm) -> tuple[Tensor, dict]:
    weights = m.weights if m.weights is not None else torch.ones_like(logp)
    loss, metrics = losses.oreal_loss(logp, m.ref_logp, m.sample_index, m.rewards, m.group_acc,
                                      weights, obj.eta, obj.beta)
    return loss * len(m.index) / n.samples, metrics


OBJECTIVES = {"pcl": pcl_step, "rft": rft_step, "dapo": clipped_step, "prorl": clipped_step,
              "discounted": clipped_step, "oreal": oreal_step}


def needs(obj: ObjectiveConfig, data: Rollouts) -> tuple[bool, bool]:
    """(needs reference log-probs, needs behaviour log-probs)."""
    clipped = obj.name in CLIPPED
    ref = obj.kl_coef > 0 or obj.name == "oreal"
    old = clipped and (obj.old_logprobs == "recompute" or data.old_logp is None)
    if clipped and data.old_logp is None and obj.old_logprobs == "samples" and not obj.allow_recompute:
        raise TrainingError(
            f"objective {obj.name} needs the behaviour log-probs of the samples, and "
            f"{data.keys[0]} has none: rerun `reasoner infer` with sampling.logprobs=true, or "
            "set objective.allow_recompute=true to use the starting model's log-probs")
    return ref, old


# --------------------------------------------------------------------------------------------
# Reference and token weights


@torch.no_grad()
def starting_logprobs(cfg: OfflineConfig, policy: nn.Module, data: Rollouts, pad_id: int,
                      device: torch.device, dtype: torch.dtype) -> list[list[float]]:
    """The starting model's log-probs of every response token, cached in `ref_logprobs/`."""
    folder = Path(cfg.output_dir) / "ref_logprobs"
    if shards.is_complete(folder):
        cached = {(r["id"], r["sample_idx"]): r["logprobs"] for r in shards.iter_rows(folder)}
        if all(k in cached for k in data.keys):
            return [cached[k] for k in data.keys]
    out = response_logprobs(policy, data, list(range(len(data.ids))), pad_id, device, dtype)
    shards.reset(folder, "train-offline reference log-probs", {"input": str(cfg.input_dir)})
    shards.write_rows(folder, ({"id": k[0], "sample_idx": k[1], "logprobs": lp}
                               for k, lp in zip(data.keys, out, strict=True)))
    shards.finish(folder, {"samples": len(out)})
    return out


@torch.no_grad()
def response_logprobs(policy: nn.Module, data: Rollouts, samples: list[int], pad_id: int,
                      device: torch.device, dtype: torch.dtype) -> list[list[float]]:
    """Log-prob of every response token of `samples` under `policy` (no gradient)."""
    out: list[list[float]] = []
    for start in range(0, len(samples), 16):
        idx = samples[start:start + 16]
        b = packing.collate_padded([(data.ids[i], _mask(data, i)) for i in idx], pad_id).to(device)
        with dev.autocast(device, dtype):
            logp = policy(b.input_ids, b.position_ids, b.attention_mask, b.labels).float().cpu()
        out += [x.tolist() for x in logp.split([data.resp_len(i) for i in idx])]
    return out


def split_validation(data: Rollouts, obj: ObjectiveConfig, seed: int) -> tuple[list[int], list[int]]:
    """Train and held-out sample indices: whole groups held out, only when reset_patience is set."""
    everything = list(range(len(data.ids)))
    if not obj.reset_patience:
        return everything, []
    groups = sorted(set(data.groups.tolist()))
    rng = random.Random(seed)
    held = set(rng.sample(groups, max(1, round(obj.val_fraction * len(groups)))))
    if len(held) == len(groups):
        raise TrainingError("reset_patience needs more groups than the validation share holds out")
    val = [i for i in everything if int(data.groups[i]) in held]
    return [i for i in everything if int(data.groups[i]) not in held], val


class Plateau:
    """ProRL's validation-triggered reset: True once the margin has not improved (by more than
    `min_delta`) for `patience` checks in a row."""

    def __init__(self, patience: int, min_delta: float = 1e-4):
        self.patience, self.min_delta = patience, min_delta
        self.best, self.bad, self.resets = -math.inf, 0, 0

    def update(self, value: float) -> bool:
        if value > self.best + self.min_delta:
            self.best, self.bad = value, 0
            return False
        self.bad += 1
        if self.bad < self.patience:
            return False
        self.best, self.bad, self.resets = -math.inf, 0, self.resets + 1  # re-baseline after it
        return True


def validation_margin(policy: nn.Module, data: Rollouts, samples: list[int], pad_id: int,
                      device: torch.device, dtype: torch.dtype) -> float:
    """Held-out positives' mean geometric-mean probability minus the negatives'."""
    lps = response_logprobs(policy, data, samples, pad_id, device, dtype)
    gm = torch.tensor([math.exp(sum(lp) / max(len(lp), 1)) for lp in lps])
    r = data.rewards[samples]
    pos, neg = gm[r > 0], gm[r <= 0]
    return float((pos.mean() if len(pos) else 0.0) - (neg.mean() if len(neg) else 0.0))


def _mask(data: Rollouts, i: int) -> list[bool]:
    p = data.prompt_lens[i]
    return [False] * p + [True] * (len(data.ids[i]) - p)


# --------------------------------------------------------------------------------------------
# The loop


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
        return packing.collate_packed([[(data.ids[i], _mask(data, i)) for i in r] for r in rows],
                                      max(sum(len(data.ids[i]) for i in r) for r in rows), pad)
    return packing.collate_padded([(data.ids[r[0]], _mask(data, r[0])) for r in rows], pad)


def _flat(values: list[list[float]] | None, index: list[int]) -> Tensor | None:
    if values is None:
        return None
    return torch.tensor([x for i in index for x in values[i]], dtype=torch.float32)


@dataclass
class Ctx:
    """Everything a micro-batch step reads besides the policy."""

    cfg: OfflineConfig
    data: Rollouts
    signal: Tensor  # (M,)
    scope: list[list[float]] | None
    old_lp: list[list[float]] | None
    ref_lp: list[list[float]] | None
    pad: int
    device: torch.device
    dtype: torch.dtype
    ref_model: nn.Module | None = None
    rm: nn.Module | None = None


def micro_loss(ctx: Ctx, policy: nn.Module, rows: list[list[int]], norm: Norm, scale: float
               ) -> tuple[float, dict[str, float], int]:
    """Forward + backward of one micro-batch's share of the global loss (times `scale`).

    Returns (its loss share, its metrics weighted by its share of samples, real tokens).
    """
    obj, data, device = ctx.cfg.objective, ctx.data, ctx.device
    index = [i for r in rows for i in r]
    b = _collate(data, rows, ctx.cfg, ctx.pad).to(device)
    sample_index = b.sample_index[b.labels >= 0]  # (N,)
    m = Micro(index, sample_index, ctx.signal[index].to(device), data.rewards[index].to(device),
              data.group_acc[index].to(device), _to(_flat(ctx.old_lp, index), device),
              _to(_flat(ctx.ref_lp, index), device), _to(_flat(ctx.scope, index), device))
    share = len(index) / norm.samples
    parts: dict[str, float] = {}
    if ctx.ref_model is not None:
        with torch.no_grad(), dev.autocast(device, ctx.dtype):
            m.ref_logp = ctx.ref_model(b.input_ids, b.position_ids, b.attention_mask,
                                       b.labels).float()
    if ctx.rm is not None:
        with dev.autocast(device, ctx.dtype):
            scores = ctx.rm(b)  # (N,)
        seq = losses.segment_mean(scores, sample_index, len(index))  # (b,)
        bce = nn.functional.binary_cross_entropy_with_logits(seq, (m.rewards > 0).float(),
                                                             reduction="sum")
        (bce / norm.samples * scale).backward()
        m.weights = token_weights(scores, sample_index, m.rewards)
        parts["rm_bce"] = float(bce) / norm.samples
    with dev.autocast(device, ctx.dtype):
        logp = policy(b.input_ids, b.position_ids, b.attention_mask, b.labels).float()  # (N,)
    loss, metrics = OBJECTIVES[obj.name](logp, m, obj, norm)
    (loss * scale).backward()
    parts.update({k: v * share for k, v in metrics.items() if k != "loss"})
    return float(loss.detach()), parts, b.real_tokens


def run(cfg: OfflineConfig) -> Path:
    """Train; return the final HF model folder (`output_dir/final`)."""
    from reasoner import models

    out, obj = Path(cfg.output_dir), cfg.objective
    config = dump(cfg)
    if shards.finished(out, config):
        return out / "final"
    device, dist, dtype = training.setup(cfg.model.device, cfg.model.dtype, cfg.run.seed)
    tokenizer = models.load_tokenizer(cfg.model.name_or_path, cfg.model.trust_remote_code)
    data = load_rollouts(cfg, tokenizer)
    signal = sample_signal(obj, data)
    scope = token_scope(data, obj)
    need_ref, need_old = needs(obj, data)
    train_idx, val_idx = split_validation(data, obj, cfg.run.seed)
    plateau = Plateau(obj.reset_patience) if val_idx else None
    total = training.total_steps(len(train_idx), cfg.run)
    ckpt = training.latest_checkpoint(out) if cfg.run.resume == "auto" else None
    mcfg = cfg.model.model_copy(update={"dtype": "float32",
                                        "attn_implementation": cfg.model.attn_implementation or "sdpa"})
    start_model, _ = models.load_model(mcfg, device)
    start_policy = PolicyLogprobs(start_model, cfg.run.logprob_chunk, obj.logprob_temperature).eval()
    ref_lp = old_lp = None
    if need_ref or need_old:
        ref_lp = starting_logprobs(cfg, start_policy, data, tokenizer.pad_token_id, device, dtype)
    old_lp = ref_lp if need_old else data.old_logp
    moving_ref = obj.ref_update_every or ((obj.reset_every or plateau) and obj.kl_coef > 0)
    ref_model = start_policy if moving_ref else None
    if ckpt is not None:
        model, _ = models.load_model(mcfg.model_copy(update={"name_or_path": str(ckpt)}), device)
    else:
        model = start_model if ref_model is None else copy.deepcopy(start_model)
    if ref_model is None:
        del start_policy
    if cfg.run.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    policy = training.shard_model(PolicyLogprobs(model, cfg.run.logprob_chunk, obj.logprob_temperature), dist)
    optimizer = training.build_optimizer(policy, cfg.optim)
    scheduler = training.build_scheduler(optimizer, total, cfg.optim)
    rm = rm_opt = None
    if obj.name == "oreal" and obj.token_weights == "rm":
        rm = training.shard_model(TokenRewardModel(model).to(device), dist)
        rm_opt = torch.optim.AdamW(rm.parameters(), lr=obj.rm_lr)
    metrics = training.MetricsLog(out / "metrics.jsonl", cfg.run.tracking, config, dist.is_main)
    first = 0
    if ckpt is not None:
        saved = training.load_checkpoint_state(ckpt, policy, optimizer, scheduler)
        first = saved["step"]
        _restore_aux(saved, rm, rm_opt, ref_model, plateau)
        metrics.truncate_after(first)
    if dist.is_main:
        shards.update_manifest(out, stage="train-offline", config=config, complete=False,
                               inputs={"model": cfg.model.name_or_path, "verified": str(cfg.input_dir)})
    ctx = Ctx(cfg, data, signal, scope, old_lp, ref_lp, tokenizer.pad_token_id, device, dtype,
              ref_model, rm)
    timer, seen, last = training.Timer(), 0, {}
    with training.progress_bar(cfg.run.progress and dist.is_main) as bar:
        task = bar.add_task(f"train-offline ({obj.name})", total=total, completed=first, info="")
        for step in range(first, total):
            batch_idx = [train_idx[i] for i in training.global_batch_rows(
                len(train_idx), cfg.run.global_batch, cfg.run.seed, step)]
            norm = Norm(samples=len(batch_idx), tokens=sum(data.resp_len(i) for i in batch_idx),
                        pos_tokens=sum(data.resp_len(i) for i in batch_idx if data.rewards[i] > 0))
            mine = batch_idx[dist.rank::dist.world_size]
            mbs = micro_batches(mine, data, cfg)
            n_mb = len(mbs) if dist.world_size == 1 else _max_count(len(mbs))
            sums: dict[str, float] = {}
            for j in range(n_mb):
                rows = mbs[j] if j < len(mbs) else [[batch_idx[0]]]
                weight = 1.0 if j < len(mbs) else 0.0  # a dummy pass keeps collectives in step
                training.set_grad_sync(policy, j == n_mb - 1)
                loss, parts, real = micro_loss(ctx, policy, rows, norm, dist.world_size * weight)
                sums["loss"] = sums.get("loss", 0.0) + loss * weight
                for k, v in parts.items():  # same keys on every process: the reduce needs them
                    sums[k] = sums.get(k, 0.0) + (v * weight if math.isfinite(v) else 0.0)
                seen += real * weight
            keys = sorted(sums)
            reduced = dict(zip(keys, training.all_reduce_sum([sums[k] for k in keys], dist), strict=True))
            if not math.isfinite(reduced["loss"]):
                optimizer.zero_grad(set_to_none=True)
                raise TrainingError(
                    f"non-finite loss ({reduced['loss']}) at step {step + 1}; no update was applied. "
                    f"Last good checkpoint: {training.latest_checkpoint(out) or 'none'}. "
                    "Lower optim.lr, then rerun to resume from it.")
            grad_norm = training.clip_grad_norm(policy, cfg.optim.grad_clip)
            lr = scheduler.get_last_lr()[0]
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            if rm_opt is not None:
                rm_opt.step()
                rm_opt.zero_grad(set_to_none=True)
            _move_reference(obj, step + 1, policy, ref_model, optimizer)
            last = {**reduced, "lr": lr, "grad_norm": grad_norm,
                    "tokens_per_s": seen / max(timer.elapsed(), 1e-9)}
            if plateau is not None and (step + 1) % obj.val_every == 0:
                margin = validation_margin(policy, data, val_idx, tokenizer.pad_token_id, device, dtype)
                if plateau.update(margin):
                    _reset(policy, ref_model, optimizer)
                last.update(val_margin=margin, resets=plateau.resets)
            if (step + 1) % cfg.run.log_every == 0 or step + 1 == total:
                metrics.log(step + 1, last)
            bar.update(task, advance=1, info=f"loss {reduced['loss']:.4f}")
            if cfg.run.save_every and (step + 1) % cfg.run.save_every == 0 and step + 1 < total:
                training.save_checkpoint(out, step + 1, policy, model, tokenizer, optimizer,
                                         scheduler, _aux_state(rm, rm_opt, ref_model, plateau),
                                         cfg.run.keep_last, dist)
    final = training.save_checkpoint(out, total, policy, model, tokenizer, optimizer, scheduler,
                                     _aux_state(rm, rm_opt, ref_model, plateau), cfg.run.keep_last, dist)
    metrics.close()
    if dist.is_main:
        training.publish_final(out, final)
        pos = int((data.rewards > 0).sum())
        shards.update_manifest(out, complete=True, counts={
            "objective": obj.name, "steps": total, "resumed_from": first,
            "samples": len(data.ids), "positives": pos, "negatives": len(data.ids) - pos,
            **({"validation_samples": len(val_idx), "plateau_resets": plateau.resets}
               if plateau is not None else {}),
            "dropped_over_max_tokens": data.dropped, "seconds": round(timer.elapsed(), 2),
            "final_loss": last.get("loss"), "final_model": str(out / "final")})
    training.barrier(dist)
    return out / "final"


def _aux_state(rm: nn.Module | None, rm_opt: torch.optim.Optimizer | None,
               ref_model: nn.Module | None, plateau: Plateau | None) -> dict:
    """What a resumed run needs beyond the policy: the token RM and its optimiser (oreal), and
    the reference when it moves (ProRL resets, discounted's moving reference)."""
    state = {}
    if rm is not None:
        state["token_rm"], state["token_rm_optim"] = training.full_state(rm, rm_opt)
    if ref_model is not None:
        state["reference"] = {k: v.detach().cpu().clone() for k, v in ref_model.state_dict().items()}
    if plateau is not None:
        state["plateau"] = dict(vars(plateau))
    return state


def _restore_aux(saved: dict, rm: nn.Module | None, rm_opt: torch.optim.Optimizer | None,
                 ref_model: nn.Module | None, plateau: Plateau | None) -> None:
    if plateau is not None and "plateau" in saved:
        vars(plateau).update(saved["plateau"])
    if rm is not None and "token_rm" in saved:
        training.restore_state(rm, rm_opt, saved["token_rm"], saved["token_rm_optim"])
    if ref_model is not None and "reference" in saved:
        ref_model.load_state_dict(saved["reference"])


def _to(t: Tensor | None, device: torch.device) -> Tensor | None:
    return None if t is None else t.to(device)


def _max_count(n: int) -> int:
    import torch.distributed as tdist

    t = torch.tensor([n])
    tdist.all_reduce(t, op=tdist.ReduceOp.MAX)
    return int(t)


def _move_reference(obj: ObjectiveConfig, step: int, policy: nn.Module, ref: nn.Module | None,
                    optimizer: torch.optim.Optimizer) -> None:
    """ProRL hard reset (ref <- policy, optimiser state cleared) or the moving reference."""
    if obj.reset_every and step % obj.reset_every == 0:
        _reset(policy, ref, optimizer)
    if obj.ref_update_every and ref is not None and step % obj.ref_update_every == 0:
        with torch.no_grad():
            current = _plain_state(policy)
            for name, p in ref.state_dict().items():
                p.mul_(1 - obj.ref_alpha).add_(current[name].to(p.dtype), alpha=obj.ref_alpha)


def _reset(policy: nn.Module, ref: nn.Module | None, optimizer: torch.optim.Optimizer) -> None:
    """ProRL's hard reset: reference <- current policy, optimiser state cleared."""
    if ref is not None:
        ref.load_state_dict(_plain_state(policy))
    optimizer.state.clear()


def _plain_state(policy: nn.Module) -> dict:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(policy, options=StateDictOptions(full_state_dict=True))
