"""`reasoner sft`: supervised fine-tuning with sequence packing (PCL-Reasoner-V1.5, stage 1).

Loss: next-token NLL on response tokens only, summed and divided by the number of response
tokens in the whole global batch. Each micro-batch contributes its share of that sum, so the
gradient of a step does not depend on how the global batch is cut into micro-batches, packed
rows or processes. Packed rows keep samples apart (see data/packing.py).

Examples are rendered by the template module and tokenized once, streamed into a memory-mapped
Arrow file (data/token_cache.py; under torchrun one process writes it, the others map it)
keyed by (data content, tokenizer, template, code version), so ranks, epochs, reruns and
resumes never tokenize again. Examples longer than `max_tokens` are dropped and counted.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from reasoner import __version__, models, outputs, training
from reasoner import device as dev
from reasoner.config import SFTConfig
from reasoner.data import packing, sources, token_cache
from reasoner.data.template import render_sft
from reasoner.errors import TrainingError
from reasoner.models import attention, lora
from reasoner.models.sequence_parallel import SequenceGroup
from reasoner.models.vocab_layout import vocab_split
from reasoner.records import SFTExample
from reasoner.runlog import check_sinks, progress_bar
from reasoner.training import schedule


@dataclass
class Tokenized:
    """The examples kept for training: ids (memory-mapped, see data/token_cache.py) and where
    each prompt ends."""

    table: token_cache.TokenTable
    keep: np.ndarray  # indices into the table of examples within max_tokens
    dropped: int  # examples over max_tokens or with an empty response
    cache_hit: bool

    @property
    def ids(self) -> _Kept:
        return _Kept(self)

    @property
    def lengths(self) -> list[int]:
        return self.table.lengths[self.keep].tolist()

    @property
    def prompt_lens(self) -> list[int]:
        return self.table.prompt_lens[self.keep].tolist()

    def length(self, i: int) -> int:
        return int(self.table.lengths[self.keep[i]])

    def loss_mask(self, i: int) -> list[bool]:
        p = int(self.table.prompt_lens[self.keep[i]])
        return [False] * p + [True] * (self.length(i) - p)

    def targets(self, i: int) -> int:
        """Tokens with a loss: response tokens that have a token before them."""
        return self.length(i) - max(int(self.table.prompt_lens[self.keep[i]]), 1)


class _Kept:
    """`data.ids[i]`: the ids of the i-th kept example (read from the memory map)."""

    def __init__(self, data: Tokenized):
        self.data = data

    def __len__(self) -> int:
        return len(self.data.keep)

    def __getitem__(self, i: int) -> list[int]:
        return self.data.table[int(self.data.keep[i])]

    def __iter__(self) -> Iterator[list[int]]:
        return (self[i] for i in range(len(self)))


def cache_path(cfg: SFTConfig, tokenizer: Any) -> Path:
    """The token cache of (data content, tokenizer, template, code version)."""
    key = hashlib.sha256("|".join([
        sources.fingerprint(cfg.data), token_cache.tokenizer_fingerprint(tokenizer),
        json.dumps(cfg.template.model_dump(), sort_keys=True), __version__,
    ]).encode()).hexdigest()[:20]
    return Path(cfg.cache_dir or Path(cfg.output_dir) / "token_cache") / f"sft-{key}.arrow"


def tokenize(cfg: SFTConfig, tokenizer: Any, dist: dev.DistInfo | None = None,
             progress: bool = False, shared: bool = True) -> Tokenized:
    """Render + tokenize every example once into the Arrow cache (streamed: memory stays flat
    however large the data); later calls and the other ranks map the file (`shared`: every
    process sees the cache folder, so one process builds it for all)."""

    def build(path: Path) -> None:
        pairs = (render_sft(r, cfg.template, tokenizer)
                 for r in sources.iter_rows(cfg.data, SFTExample))
        with progress_bar(progress) as bar:
            task = bar.add_task("tokenize", total=cfg.data.limit, info="")
            count = token_cache.write(
                path, pairs, lambda texts: tokenizer(texts, add_special_tokens=False)["input_ids"],
                lambda n: bar.update(task, advance=n))
        if not count:
            path.unlink()
            raise TrainingError(f"{cfg.data.path}: the SFT data holds no examples")

    path = cache_path(cfg, tokenizer)
    hit = token_cache.build_once(path, build, dist, shared)
    table = token_cache.TokenTable(path)
    lengths, plens = table.lengths, table.prompt_lens
    keep = np.flatnonzero((lengths <= cfg.max_tokens) & (lengths > plens))
    if not len(keep):
        raise TrainingError(
            f"all {len(table)} examples are longer than max_tokens={cfg.max_tokens} (the shortest "
            f"has {int(lengths.min())} tokens) or have an empty response; raise max_tokens"
        )
    return Tokenized(table, keep, len(table) - len(keep), hit)


def plan_rows(data: Tokenized, cfg: SFTConfig) -> list[list[int]]:
    """Training rows: packed bins of examples, or one example per row (padded mode; each
    process's micro-batches are length-grouped by `micro_batches`)."""
    if cfg.packing:
        return packing.pack(data.lengths, cfg.seq_len)
    return [[i] for i in range(len(data.ids))]


def collate(data: Tokenized, rows: list[list[int]], cfg: SFTConfig, pad_id: int,
            varlen: bool) -> packing.Batch:
    """A micro-batch's rows as tensors: packed rows seq_len wide (one flat row, as wide as its
    samples, for a varlen kernel) or padded."""
    return packing.collate(data, rows, cfg.packing, None if varlen else cfg.seq_len, pad_id,
                           varlen)


def micro_batches(rows: list[int], cfg: SFTConfig, dist: dev.DistInfo,
                  lengths: list[int]) -> list[list[list[int]]]:
    """Every data-parallel group's micro-batches of a global batch, by group (this process's:
    `[dist.dp_rank]`): its token-balanced share (a sequence-parallel group shares its rows; the
    trainer evens out the count), as every process computes them."""
    every = []
    for share in packing.balanced_shares(rows, lengths, dist.dp_size):
        if not cfg.packing:  # length-grouped: little padding inside each micro-batch
            share = sorted(share, key=lambda r: lengths[r])
        mb = cfg.run.micro_batch
        every.append([share[i:i + mb] for i in range(0, len(share), mb)])
    return every


def step_loss(policy: torch.nn.Module, batch: packing.Batch, denom: float, scale: float,
              device: torch.device, dtype: torch.dtype) -> training.MicroOut:
    """Backward of one micro-batch's share of the global-batch NLL (times `scale`)."""
    batch = batch.to(device)
    with dev.autocast(device, dtype):
        logp = policy(batch.input_ids, batch.position_ids, batch.attention_mask, batch.labels,
                      batch.layout)  # (N,): targets where the collator's host layout says
    nll = -logp.sum()
    (nll / denom * scale).backward()
    return training.MicroOut({"nll": nll.detach(), "real": batch.real_tokens,  # read once a step
                              "slots": batch.input_ids.numel()})


def run(cfg: SFTConfig) -> Path:
    """Train; return the folder of the final HF model (`output_dir/final`)."""
    out = Path(cfg.output_dir)
    identity, action = training.claim(cfg, "sft")
    if action == "complete":
        return out / "final"
    models.check_reachable(cfg.model.name_or_path)
    check_sinks(cfg.run.tracking)
    env = training.setup(cfg.model, cfg.run, out)
    device, dist, dtype = env.device, env.dist, env.dtype
    with outputs.writing(out, identity, action, dist):
        attn = attention.plan_attention(cfg.model.attn_implementation, device, dtype, cfg.packing,
                              SequenceGroup.of(dist), cfg.run.micro_batch, cfg.row_tokens)
        attention.warn(attn, dist.is_main)
        tokenizer = models.load_tokenizer(cfg.model.name_or_path, cfg.model.trust_remote_code)
        # the run folder is shared by every process (training.setup checks); a cache_dir of
        # its own may be a node's local disk
        shared = cfg.cache_dir is None or dev.sees_same_folder(Path(cfg.cache_dir), dist, device)
        data = tokenize(cfg, tokenizer, dist, cfg.run.progress and dist.is_main, shared)
        training.warn_dropped("sft", data.dropped, len(data.table), cfg.max_tokens, dist,
                              "examples")
        rows = plan_rows(data, cfg)
        lengths = [sum(data.length(i) for i in row) for row in rows]
        ckpt = training.resume_point(out, cfg.run, identity.digest)
        source = ckpt or cfg.model.name_or_path
        loaded = training.load_policy(cfg.model, source, env, cfg.run.logprob_chunk,
                                      attn=attn.implementation, vocab=vocab_split(cfg, env),
                                      adapters=lora.Adapters.of(cfg.model.lora, source,
                                                                cfg.run.seed))
        state = training.start(cfg, env, tokenizer, loaded,
                               schedule.total_steps(len(rows), cfg.run), ckpt, identity.digest)
        pad = tokenizer.pad_token_id
        per_epoch = schedule.steps_per_epoch(len(rows), cfg.run.global_batch)
        last: dict[str, float] = {}
        with training.progress(state, "sft"):
            for step in range(state.first_step, state.total_steps):
                step_rows = schedule.global_batch_rows(len(rows), cfg.run.global_batch,
                                                       cfg.run.seed, step)
                denom = sum(data.targets(i) for r in step_rows for i in rows[r])
                every = micro_batches(step_rows, cfg, dist, lengths)
                mbs = every[dist.dp_rank]
                peers = packing.pass_peers(every, lambda mb: packing.layout_of(
                    data, [rows[r] for r in mb], cfg.packing, None if attn.varlen else
                    cfg.seq_len), dist.sp_size) if training.exchanges_counts(state) else None

                def one(j: int, scale: float, denom=denom, mbs=mbs, peers=peers
                        ) -> training.MicroOut:
                    b = collate(data, [rows[r] for r in mbs[j]] if j < len(mbs) else [], cfg,
                                pad, attn.varlen)
                    b.layout = b.layout.with_peers(peers and peers[j])
                    return step_loss(state.policy, b, denom, scale, device, dtype)

                m = training.accumulate(state, len(mbs), one, busiest=max(map(len, every)))
                loss = m["nll"] / denom
                last = {"loss": loss, **training.optimizer_step(state, loss, step)}
                state.tokens += m["real"]
                speed = state.tokens / max(state.timer.elapsed(), 1e-9)
                last = training.end_step(state, step, {
                    **last, "packing_efficiency": m["real"] / m["slots"],
                    "epoch": (step + 1) / per_epoch, "response_tokens": denom},
                    info=f"loss {loss:.4f}  {speed:,.0f} tok/s")
        return training.finish(state, {
            "examples": len(data.ids), "dropped_over_max_tokens": data.dropped, "rows": len(rows),
            "packing_efficiency": packing.efficiency(data.lengths, rows, cfg.seq_len)
            if cfg.packing else None,
            "tokens_this_run": int(state.tokens), "final_loss": last.get("loss"),
            "token_cache_hit": data.cache_hit},
            trained_with={"template": cfg.template.model_dump(mode="json")})
