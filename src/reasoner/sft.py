"""`reasoner sft`: supervised fine-tuning with sequence packing (PCL-Reasoner-V1.5, stage 1).

Loss: next-token NLL on response tokens only, summed and divided by the number of response
tokens in the whole global batch. Each micro-batch contributes its share of that sum, so the
gradient of a step does not depend on how the global batch is cut into micro-batches, packed
rows or processes. Packed rows keep samples apart (see data/packing.py).

Examples are rendered by the template module and tokenized once; the token ids are cached
under a key of (data content, tokenizer, template, code version), so epochs, reruns and
resumes never tokenize again. Examples longer than `max_tokens` are dropped and counted.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from reasoner import __version__, models, shards, training
from reasoner import device as dev
from reasoner.config import SFTConfig, dump
from reasoner.data import packing, sources
from reasoner.data.template import render_sft
from reasoner.errors import TrainingError
from reasoner.records import SFTExample


@dataclass
class Tokenized:
    ids: list[list[int]]  # prompt + response token ids per example
    prompt_lens: list[int]
    dropped: int  # examples over max_tokens
    cache_hit: bool

    def loss_mask(self, i: int) -> list[bool]:
        p = self.prompt_lens[i]
        return [False] * p + [True] * (len(self.ids[i]) - p)

    def targets(self, i: int) -> int:
        """Tokens with a loss: response tokens that have a token before them."""
        return len(self.ids[i]) - max(self.prompt_lens[i], 1)


def _tokenizer_fingerprint(tokenizer: Any) -> str:
    h = hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode())
    h.update(str(getattr(tokenizer, "chat_template", "")).encode())
    h.update(str(tokenizer.eos_token).encode())
    return h.hexdigest()[:16]


def tokenize(cfg: SFTConfig, tokenizer: Any) -> Tokenized:
    """Render + tokenize every example once; later calls read the cache."""
    key = hashlib.sha256("|".join([
        sources.fingerprint(cfg.data), _tokenizer_fingerprint(tokenizer),
        json.dumps(cfg.template.model_dump(), sort_keys=True), __version__,
    ]).encode()).hexdigest()[:20]
    cache = Path(cfg.cache_dir or Path(cfg.output_dir) / "token_cache") / f"sft-{key}.pt"
    if cache.exists():
        blob = torch.load(cache, weights_only=True)
        ids, prompt_lens, hit = blob["ids"], blob["prompt_lens"], True
    else:
        rows = sources.read_rows(cfg.data, SFTExample)
        if not rows:
            raise TrainingError(f"{cfg.data.path}: the SFT data holds no examples")
        pairs = [render_sft(r, cfg.template, tokenizer) for r in rows]
        p_ids = tokenizer([p for p, _ in pairs], add_special_tokens=False)["input_ids"]
        r_ids = tokenizer([r for _, r in pairs], add_special_tokens=False)["input_ids"]
        ids = [p + r for p, r in zip(p_ids, r_ids, strict=True)]
        prompt_lens = [len(p) for p in p_ids]
        cache.parent.mkdir(parents=True, exist_ok=True)
        # every torchrun rank may get here at once: each writes its own temporary file and
        # os.replace swaps it in atomically (they are identical), so no rank loses a race
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        torch.save({"ids": ids, "prompt_lens": prompt_lens}, tmp)
        os.replace(tmp, cache)
        hit = False
    keep = [i for i, x in enumerate(ids) if len(x) <= cfg.max_tokens and len(x) > prompt_lens[i]]
    if not keep:
        longest = min(len(x) for x in ids)
        raise TrainingError(
            f"all {len(ids)} examples are longer than max_tokens={cfg.max_tokens} (the shortest "
            f"has {longest} tokens) or have an empty response; raise max_tokens"
        )
    return Tokenized([ids[i] for i in keep], [prompt_lens[i] for i in keep], len(ids) - len(keep),
                     hit)


def plan_rows(data: Tokenized, cfg: SFTConfig) -> list[list[int]]:
    """Training rows: packed bins of examples, or one example per row (padded mode)."""
    if cfg.packing:
        return packing.pack([len(x) for x in data.ids], cfg.seq_len)
    # Padded mode: rows sorted by length so that micro-batches cut from the (shuffled) global
    # batch are length-grouped inside `collate` below.
    return [[i] for i in range(len(data.ids))]


def collate(data: Tokenized, rows: list[list[int]], cfg: SFTConfig, pad_id: int,
            varlen: bool) -> packing.Batch:
    if cfg.packing:
        samples = [[(data.ids[i], data.loss_mask(i)) for i in row] for row in rows]
        width = max(sum(len(data.ids[i]) for i in row) for row in rows) if varlen else cfg.seq_len
        batch = packing.collate_packed(samples, width, pad_id, block_mask=not varlen)
        if varlen:  # one flat row: flash-attention finds the samples from the position ids
            flat = lambda t: t.reshape(1, -1)  # noqa: E731
            batch = packing.Batch(flat(batch.input_ids), flat(batch.labels),
                                  flat(batch.position_ids), None, flat(batch.sample_index),
                                  batch.num_samples, batch.real_tokens)
        return batch
    return packing.collate_padded([(data.ids[r[0]], data.loss_mask(r[0])) for r in rows], pad_id)


def micro_batches(rows: list[int], cfg: SFTConfig, dist: dev.DistInfo,
                  lengths: list[int]) -> list[list[int]]:
    """This process's micro-batches of a global batch (the trainer evens out the count)."""
    mine = rows[dist.rank::dist.world_size]
    if not cfg.packing:  # length-grouped: little padding inside each micro-batch
        mine = sorted(mine, key=lambda r: lengths[r])
    mb = cfg.run.micro_batch
    return [mine[i:i + mb] for i in range(0, len(mine), mb)]


def step_loss(policy: torch.nn.Module, batch: packing.Batch, denom: float, scale: float,
              device: torch.device, dtype: torch.dtype) -> training.MicroOut:
    """Backward of one micro-batch's share of the global-batch NLL (times `scale`)."""
    batch = batch.to(device)
    with dev.autocast(device, dtype):
        logp = policy(batch.input_ids, batch.position_ids, batch.attention_mask, batch.labels)  # (N,)
    nll = -logp.sum()
    (nll / denom * scale).backward()
    return training.MicroOut({"nll": float(nll.detach()), "real": batch.real_tokens,
                              "slots": batch.input_ids.numel()})


def run(cfg: SFTConfig) -> Path:
    """Train; return the folder of the final HF model (`output_dir/final`)."""
    out = Path(cfg.output_dir)
    if shards.finished(out, dump(cfg)):
        return out / "final"
    env = device, dist, dtype = training.setup(cfg)
    tokenizer = models.load_tokenizer(cfg.model.name_or_path, cfg.model.trust_remote_code)
    data = tokenize(cfg, tokenizer)
    rows = plan_rows(data, cfg)
    lengths = [sum(len(data.ids[i]) for i in row) for row in rows]
    attn = cfg.model.attn_implementation or (
        "flash_attention_2" if dev.flash_attention_available(device) and cfg.packing else "sdpa")
    varlen = attn == "flash_attention_2"
    ckpt = training.resume_point(cfg)
    model = training.load_weights(cfg, ckpt or cfg.model.name_or_path, device, attn)
    run = training.start(cfg, "sft", env, tokenizer, model, training.total_steps(len(rows), cfg.run),
                         ckpt, {"model": cfg.model.name_or_path, "data": cfg.data.path})
    pad = tokenizer.pad_token_id
    per_epoch = math.ceil(len(rows) / cfg.run.global_batch)
    last: dict[str, float] = {}
    with training.progress(run, "sft"):
        for step in range(run.start, run.total):
            step_rows = training.global_batch_rows(len(rows), cfg.run.global_batch, cfg.run.seed, step)
            denom = sum(data.targets(i) for r in step_rows for i in rows[r])
            mbs = micro_batches(step_rows, cfg, dist, lengths)
            m = training.accumulate(
                run, mbs, lambda mb, scale, denom=denom: step_loss(
                    run.policy, collate(data, [rows[r] for r in mb], cfg, pad, varlen), denom,
                    scale, device, dtype),
                dummy=step_rows[:1])
            loss = m["nll"] / denom
            last = {"loss": loss, **training.optimizer_step(run, loss, step)}
            run.tokens += m["real"]
            last = training.end_step(run, step, {
                **last, "packing_efficiency": m["real"] / m["slots"],
                "epoch": (step + 1) / per_epoch, "response_tokens": denom},
                info=f"loss {loss:.4f}  {run.tokens / max(run.timer.elapsed(), 1e-9):,.0f} tok/s")
    return training.finish(run, {
        "examples": len(data.ids), "dropped_over_max_tokens": data.dropped, "rows": len(rows),
        "packing_efficiency": packing.efficiency(
            [len(x) for x in data.ids], rows, cfg.seq_len) if cfg.packing else None,
        "tokens_this_run": int(run.tokens), "final_loss": last.get("loss"),
        "token_cache_hit": data.cache_hit})
