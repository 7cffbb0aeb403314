"""`reasoner train-offline`: offline policy training on a fixed, verified rollout set.

Infer once, train many: the Verified shard is tokenized once (rollouts.py) and every objective
trains on it through the training loop sft uses (training/). A step takes `global_batch`
samples; each process packs its share into rows of `seq_len` tokens (or pads them), and each
loss is given the global count it averages over (samples, tokens or positive tokens of the
whole batch), so the loss and its gradient do not depend on how samples are split into
micro-batches, packs or processes. (The published PCL code needed micro-batch 1 and could not
pack.)

What an objective reads beside the policy is computed once, before the first step (`prepare`,
`PerSample`): its per-sample signal and token scope (objectives.py), the behaviour log-probs of
the objectives with a ratio (behaviour.py decides where they come from; the others read them
for the off-policy diagnostics alone) and the KL reference's log-probs (kl_reference.py). Every
step also says how far the policy has moved from the behaviour policy, and how many steps since
the samples' model (offpolicy.py). What trains or moves beside the policy (OREAL's token RM,
token_rm.py; a moving reference; ProRL's plateau tracker) is auxiliary.py's. The losses are
pure tensor functions (losses.py).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from reasoner import device as dev
from reasoner import models, outputs, training
from reasoner.config import ObjectiveConfig, OfflineConfig
from reasoner.data import packing
from reasoner.device import Env
from reasoner.models import attention, lora
from reasoner.models.sequence_parallel import SequenceGroup
from reasoner.models.vocab_layout import VocabSplit, vocab_split
from reasoner.runlog import check_sinks
from reasoner.train_offline import behaviour, kl_reference, objectives, offpolicy, token_rm
from reasoner.train_offline.auxiliary import Auxiliary
from reasoner.train_offline.objectives import GlobalCounts, Micro
from reasoner.train_offline.rollouts import Batching, Rollouts, load_rollouts
from reasoner.training import schedule


def run(cfg: OfflineConfig) -> Path:
    """Train; return the final HF model folder (`output_dir/final`)."""
    out, obj = Path(cfg.output_dir), cfg.objective
    identity, action = training.claim(cfg, "train-offline")
    if action == "complete":
        return out / "final"
    check_inputs(cfg)
    env = training.setup(cfg.model, cfg.run, out)
    with outputs.writing(out, identity, action, env.dist):
        tokenizer = models.load_tokenizer(cfg.model.name_or_path, cfg.model.trust_remote_code)
        data = load_rollouts(cfg, tokenizer, env.dist)
        training.warn_dropped("train-offline", data.dropped, len(data.ids) + data.dropped,
                              cfg.max_tokens, env.dist)
        offpolicy.warn_unbounded(obj, env.dist.is_main)
        train_idx, val_idx = kl_reference.split_validation(data, obj, cfg.run.seed)
        ckpt = training.resume_point(out, cfg.run, identity.digest)
        ready = prepare(cfg, env, tokenizer.pad_token_id, data, ckpt)
        state = training.start(cfg, env, tokenizer, ready.trained,
                               schedule.total_steps(len(train_idx), cfg.run), ckpt,
                               identity.digest)
        aux = Auxiliary(token_rm.load_token_rm(cfg, env, ready.attn, ready.vocab,
                                               state.total_steps)
                        if obj.uses_token_rm else None, ready.moving_ref,
                        kl_reference.Plateau(obj.reset_patience) if val_idx else None)
        aux.restore(ckpt, state.saved)
        state.aux = aux.shards if aux.models()[0] else None
        warm = []
        if aux.token_rm is not None and state.first_step == 0 and obj.rm_warmup_steps:
            warm = token_rm.warm_up(aux.token_rm, state, data, train_idx, ready.batching,
                                    obj.rm_warmup_steps)
        micro = MicroStep(obj, data, ready.per_sample, ready.batching, env, aux.moving_ref,
                          aux.token_rm)
        lag = offpolicy.lag_of(cfg.model.name_or_path, Path(cfg.input_dir))
        last: dict[str, float] = {}
        with training.progress(state, f"train-offline ({obj.name})"):
            for step in range(state.first_step, state.total_steps):
                last = {**train_step(state, step, micro, train_idx, aux), **lag.at(step)}
                if aux.plateau is not None and (step + 1) % obj.val_every == 0:
                    last.update(validate(state, data, val_idx, aux, ready.batching, env))
                state.tokens += last.pop("tokens")
                last = training.end_step(state, step, last, f"loss {last['loss']:.4f}",
                                         aux.trainer_state)
        return training.finish(state, summary(obj, data, ready.per_sample, aux, val_idx, warm, last,
                                              lag), aux.trainer_state,
                               {"template": trained_template(cfg)})


def trained_template(cfg: OfflineConfig) -> dict:
    """The template the model was trained to answer: the one its training prompts were rendered
    with (the samples' infer config, reached through the Verified shard's manifest), else its
    starting model's record (sft or an earlier train-offline), else this config's; this config's
    fields where it sets them. (A model imported with `reasoner model import` records none: its
    template used to be recorded as {} whatever the samples were prompted with.)"""
    from reasoner import shards
    from reasoner.config import TemplateConfig

    template = cfg.template.model_dump(mode="json")
    verified = shards.read_manifest(Path(cfg.input_dir)) or {}
    samples = (verified.get("inputs") or {}).get("input_dir") or \
        (verified.get("config") or {}).get("input_dir")
    used = None
    if samples and Path(samples).is_dir():
        used = ((shards.read_manifest(Path(samples)) or {}).get("config") or {}).get("template")
    recorded = Path(cfg.model.name_or_path) / "reasoner.json"
    before = used or (json.loads(recorded.read_text()).get("template")
                      if recorded.exists() else None)
    if before:
        template = {**TemplateConfig.model_validate(before).model_dump(mode="json"),
                    **{k: template[k] for k in cfg.template.model_fields_set}}
    return template


def check_inputs(cfg: OfflineConfig) -> None:
    """What can be checked before any work: the models exist, the metric sinks are installed
    (before the rollouts are tokenized and cached)."""
    models.check_reachable(cfg.model.name_or_path)
    check_sinks(cfg.run.tracking)
    if cfg.reference is not None:
        models.check_reachable(cfg.reference, "reference")


@dataclass(frozen=True)
class PerSample:
    """What the objective reads beside the policy's log-probs, computed once for every sample."""

    signal: Tensor  # (M,) the reward or advantage each sample trains with
    scope: Sequence[list[float]] | None  # per token, 1 where the loss sees it (None: everywhere)
    old_logp: Sequence[list[float]] | None  # behaviour log-probs (a ratio, the diagnostics)
    ref_logp: Sequence[list[float]] | None  # reference log-probs (KL terms, OREAL)
    behaviour: str  # where old_logp comes from, in words (the summary says it)
    behaviour_gap: dict[str, float]  # stored vs the trainer's, when they were checked


@dataclass(frozen=True)
class Ready:
    """A run prepared: the model to train, the objective's inputs, and how batches are cut."""

    trained: training.Loaded  # the starting model, or the checkpoint resumed from
    per_sample: PerSample
    batching: Batching
    moving_ref: nn.Module | None  # a second, resident model when the reference moves
    attn: str  # the attention implementation every model of the run uses
    vocab: VocabSplit  # how every model's embedding and lm-head split


def prepare(cfg: OfflineConfig, env: Env, pad: int, data: Rollouts, ckpt: Path | None) -> Ready:
    """Load the starting model, compute what the objective needs from it (behaviour and
    reference log-probs, cached in the output folder), and load what training continues from.
    With several processes every model here is sharded as it loads."""
    obj, out = cfg.objective, Path(cfg.output_dir)
    attn = attention.plan_attention(cfg.model.attn_implementation, env.device, env.dtype, cfg.packing,
                          SequenceGroup.of(env.dist), cfg.run.micro_batch, cfg.row_tokens)
    attention.warn(attn, env.dist.is_main)
    vocab = vocab_split(cfg, env, obj.resident_bytes_per_param)

    sets = (lora.TRAINED, lora.REFERENCE) if obj.resident_reference else (lora.TRAINED,)

    def load(source: str | Path, adapters: bool = True, frozen: bool = False
             ) -> training.Loaded:
        return training.load_policy(cfg.model, source, env, cfg.run.logprob_chunk,
                                    obj.logprob_temperature, attn.implementation, vocab,
                                    lora.Adapters.of(cfg.model.lora if adapters else None,
                                                     source, cfg.run.seed, sets), frozen=frozen)

    batching = Batching.of(cfg, pad, attn.varlen)
    starting = load(cfg.model.name_or_path)
    starting.policy.eval()
    recompute, said = behaviour.behaviour_logprobs(obj, data, cfg.input_dir)
    gap: dict[str, float] = {}
    if obj.needs_old_logprobs and not recompute:  # the stored ones will be pi_old: check them
        recompute, said, gap = behaviour.check_behaviour(obj, data, starting.policy, batching,
                                                         env, said)
    start_lp = None
    if recompute or (obj.needs_reference and cfg.reference is None):
        start_lp = kl_reference.starting_logprobs(out / "ref_logprobs", str(cfg.input_dir),
                                               starting.policy, data, batching, env)
    ref_lp = start_lp
    if obj.needs_reference and cfg.reference is not None:  # a fixed anchor, not the start
        anchor = load(cfg.reference, adapters=False, frozen=True).policy.eval()  # no fp32 copy
        ref_lp = kl_reference.starting_logprobs(out / "anchor_logprobs",
                                             f"{cfg.input_dir} scored by {cfg.reference}", anchor,
                                             data, batching, env)
        del anchor
    shared = cfg.model.lora is not None  # LoRA: a moving reference is a second adapter set
    if ckpt is not None:
        trained = load(ckpt)
    elif obj.resident_reference and not shared:  # a second copy, loaded (and sharded) alike
        trained = load(cfg.model.name_or_path)
    else:
        trained = starting
    resident = None
    if obj.resident_reference:
        resident = lora.AdapterView(trained.policy) if shared else starting.policy
    behaving = (start_lp if recompute else data.old_logp) if obj.reads_behaviour else None
    per_sample = PerSample(objectives.sample_signal(obj, data), objectives.token_scope(obj, data),
                    behaving, ref_lp, said, gap)
    return Ready(trained, per_sample, batching, resident, attn.implementation, vocab)


def _flat(values: Sequence[list[float]] | None, index: list[int], device: torch.device
          ) -> Tensor | None:
    """Per-token values of the samples `index`, back to back (N,)."""
    if values is None:
        return None
    return torch.tensor([x for i in index for x in values[i]], dtype=torch.float32, device=device)


def _where(holds: np.ndarray, device: torch.device) -> Tensor:
    """The indices where `holds` (host data) is true, as a tensor on `device`: selecting by
    them reads nothing back from the device."""
    return torch.from_numpy(np.flatnonzero(holds).astype(np.int64)).to(device, non_blocking=True)


def _scope(scope: Sequence[list[float]] | None, index: list[int], device: torch.device
           ) -> Tensor | None:
    """Which of the samples' tokens, back to back, the loss sees (n,); None: all of them."""
    if scope is None:
        return None
    return _where(np.array([x > 0 for i in index for x in scope[i]], dtype=bool), device)


@dataclass(frozen=True)
class MicroStep:
    """One micro-batch's forward and backward: everything it reads besides the policy."""

    obj: ObjectiveConfig
    data: Rollouts
    per_sample: PerSample
    batching: Batching
    env: Env
    moving_ref: nn.Module | None = None  # scored with the policy (a moving reference)
    token_rm: token_rm.TokenRM | None = None  # trained with the policy (OREAL)
    signal: np.ndarray = field(init=False, repr=False)  # (M,) per_sample.signal on the host

    def __post_init__(self) -> None:
        # read once, before any step: a step selects samples by it without reading a tensor
        # (under FakeTensorMode, `numpy()` of a real tensor gives garbage)
        object.__setattr__(self, "signal", self.per_sample.signal.numpy().copy())

    def __call__(self, policy: nn.Module, rows: list[list[int]], counts: GlobalCounts,
                 scale: float, peers: tuple | None = None) -> training.MicroOut:
        """Backward of this micro-batch's share of the global loss (times `scale`); no rows: a
        dummy pass, every forward and backward of a real one on one token, weighing nothing.
        `peers`: every process's counts of this pass (`packing.Layout.peers`), when needed."""
        data, device, per_sample = self.data, self.env.device, self.per_sample
        index = [i for r in rows for i in r]
        b = self.batching.collate(data, rows).to(device)
        b.layout = b.layout.with_peers(peers)
        if not index:
            return self.dummy(policy, b)
        sample_index = b.sample_index.reshape(-1).index_select(0, b.layout.index(device))  # (N,)
        signal = self.signal[index]  # (b,) on the host: which samples are which
        m = Micro(index, sample_index, per_sample.signal[index].to(device),
                  data.rewards[index].to(device), data.group_acc[index].to(device),
                  _flat(per_sample.old_logp, index, device),
                  _flat(per_sample.ref_logp, index, device),
                  _scope(per_sample.scope, index, device), positive=_where(signal > 0, device),
                  negative=_where(signal < 0, device))
        extra: dict[str, Tensor] = {}
        if self.moving_ref is not None:
            with torch.no_grad(), dev.autocast(device, self.env.dtype):
                m.ref_logp = self.moving_ref(b.input_ids, b.position_ids, b.attention_mask,
                                            b.labels, b.layout).float()  # (N,)
        if self.token_rm is not None:
            scores, extra["rm_bce"] = self.token_rm.train_pass(b, sample_index, m.rewards,
                                                               counts, scale)
            m.token_weights = token_rm.token_weights(scores, sample_index, m.rewards)
        with dev.autocast(device, self.env.dtype):
            logp = policy(b.input_ids, b.position_ids, b.attention_mask, b.labels,
                          b.layout).float()  # (N,)
        result = objectives.step(logp, m, self.obj, counts)
        (result.loss * scale).backward()
        return training.MicroOut({"loss": result.loss.detach(), "tokens": b.real_tokens,
                                  **result.sums}, {**result.means, **extra},
                                 len(index) / counts.samples, result.maxima, result.minima)


    def dummy(self, policy: nn.Module, b: packing.Batch) -> training.MicroOut:
        """The collectives of a micro-batch (reference, token RM, policy; forward and backward)
        on `b`, a batch of one token with no target."""
        with dev.autocast(self.env.device, self.env.dtype):
            if self.moving_ref is not None:
                with torch.no_grad():
                    self.moving_ref(b.input_ids, b.position_ids, b.attention_mask, b.labels,
                                   b.layout)
            if self.token_rm is not None:
                (self.token_rm.model(b).sum() * 0.0).backward()
            logp = policy(b.input_ids, b.position_ids, b.attention_mask, b.labels,
                          b.layout)  # (0,)
        (logp.sum() * 0.0).backward()
        return training.MicroOut({})


def train_step(state: training.TrainState, step: int, micro: MicroStep, samples: list[int],
               aux: Auxiliary) -> dict[str, float]:
    """One optimiser step over the global batch of `step`: each process's share, micro-batch by
    micro-batch; then the token RM's step and the reference's move, if any."""
    data, dist = micro.data, state.dist
    batch_idx = micro.batching.global_batch_at(samples, step)
    counts = GlobalCounts(samples=len(batch_idx),
                          tokens=sum(data.resp_len(i) for i in batch_idx),
                          pos_tokens=sum(data.resp_len(i) for i in batch_idx
                                         if data.rewards[i] > 0))
    batching = micro.batching  # every group's micro-batches: known here, never gathered
    every = [batching.micro_batches(s, data) for s in batching.shares(batch_idx, data,
                                                                     dist.dp_size)]
    mbs = every[dist.dp_rank]
    peers = packing.pass_peers(every, lambda rows: batching.layout_of(data, rows), dist.sp_size) \
        if training.exchanges_counts(state) else None
    m = training.accumulate(state, len(mbs), lambda j, scale: micro(
        state.policy, mbs[j] if j < len(mbs) else [], counts, scale, peers and peers[j]),
        busiest=max(map(len, every)))
    last = {**offpolicy.spread(m), **training.optimizer_step(state, m["loss"], step)}
    if aux.token_rm is not None:
        aux.token_rm.step(micro.obj.rm_warmup_steps + step)
    kl_reference.move_reference(micro.obj, step + 1, state.policy, aux.moving_ref, state.optimizer)
    return last


def validate(state: training.TrainState, data: Rollouts, samples: list[int], aux: Auxiliary,
             batching: Batching, env: Env) -> dict[str, float]:
    """ProRL's held-out check: the validation margin, and a reset when it has stalled."""
    margin = kl_reference.validation_margin(state.policy, data, samples, batching, env)
    if aux.plateau.update(margin):
        kl_reference.reset(state.policy, aux.moving_ref, state.optimizer)
    return {"val_margin": margin, "resets": aux.plateau.resets}


def summary(obj: ObjectiveConfig, data: Rollouts, per_sample: PerSample, aux: Auxiliary,
            val_idx: list[int], warm: list[float], last: dict[str, float],
            lag: offpolicy.Lag) -> dict:
    """The counts the manifest and the command's summary show; the off-policy diagnostics of
    the last step, and the lag, when they were measured."""
    pos = int((data.rewards > 0).sum())
    diagnosed = {k: round(v, 6) for k, v in last.items() if k.startswith("offpolicy_")}
    return {
        "objective": obj.name, "samples": len(data.ids), "positives": pos,
        "negatives": len(data.ids) - pos, "behaviour_logprobs": per_sample.behaviour,
        **{f"behaviour_{k}": round(v, 6) for k, v in per_sample.behaviour_gap.items()},
        **({"validation_samples": len(val_idx), "plateau_resets": aux.plateau.resets}
           if aux.plateau is not None else {}),
        **({"rm_warmup_bce": [round(x, 4) for x in warm]} if warm else {}),
        "dropped_over_max_tokens": data.dropped, "final_loss": last.get("loss"),
        "lag": lag.said, "lag_rounds": lag.rounds, "lag_steps_before": lag.steps, **diagnosed}
