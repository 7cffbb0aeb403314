"""Verified rollouts as training data: token ids, per-sample rewards, and how they are cut into
global batches, rows and micro-batches (`Batching`).

Loaded once per train-offline run: tokenized once into a memory-mapped Arrow file, keyed by the
Verified shard's files, the tokenizer and max_tokens, and mapped again on reruns and by every
process. What each objective trains with is computed from it in objectives.py.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from reasoner import shards
from reasoner.config import OfflineConfig
from reasoner.data import packing, token_cache
from reasoner.data.template import end_of_turn
from reasoner.errors import TrainingError
from reasoner.records import Verified
from reasoner.training import schedule


@dataclass
class Rollouts:
    """The verified samples as token ids plus per-sample tensors (M samples).

    Loaded by `load_rollouts`, `ids` and `old_logp` are memory-mapped Arrow columns (list-like:
    `ids[i]` is one sample's ids), not Python lists of every token."""

    keys: list[tuple[str, int]]
    ids: Sequence[list[int]]
    prompt_lens: list[int]
    rewards: Tensor  # (M,) +1 / -1
    groups: Tensor  # (M,) group index
    group_acc: Tensor  # (M,)
    reasoning: Tensor  # (M,) think-span tokens
    has_answer: Tensor  # (M,) bool
    old_logp: Sequence[list[float]] | None  # behaviour log-probs per response token
    dropped: int

    def length(self, i: int) -> int:
        """Sample i's tokens (read from the column's offsets, not by reading its ids)."""
        lengths = getattr(self.ids, "lengths", None)
        return int(lengths[i]) if lengths is not None else len(self.ids[i])

    def resp_len(self, i: int) -> int:
        return self.length(i) - self.prompt_lens[i]

    def loss_mask(self, i: int) -> list[bool]:
        """True on the response tokens of sample i (the tokens that are scored)."""
        p = self.prompt_lens[i]
        return [False] * p + [True] * (len(self.ids[i]) - p)


@dataclass(frozen=True)
class Batching:
    """How train-offline cuts its rollouts: a global batch of `global_batch` samples per step
    (the schedule's row order), each process's share packed into rows of `seq_len` tokens (or
    one sample per row, padded), `micro_batch` rows per forward."""

    global_batch: int
    seed: int
    packing: bool
    seq_len: int
    micro_batch: int
    pad: int  # the tokenizer's pad id
    varlen: bool = False  # packed rows go flat to a varlen kernel (models.attention)

    @classmethod
    def of(cls, cfg: OfflineConfig, pad: int, varlen: bool = False) -> Batching:
        return cls(cfg.run.global_batch, cfg.run.seed, cfg.packing, cfg.seq_len,
                   cfg.run.micro_batch, pad, varlen)

    def global_batch_at(self, samples: list[int], step: int) -> list[int]:
        """The samples (indices into `samples`' values) of optimiser step `step`."""
        return [samples[i] for i in schedule.global_batch_rows(len(samples), self.global_batch,
                                                               self.seed, step)]

    def share(self, samples: list[int], data: Rollouts, dist: Any) -> list[int]:
        """This process's data-parallel share of `samples`: token-balanced over the groups
        (`packing.balanced_shares`), the same for every member of a sequence-parallel group."""
        return self.shares(samples, data, dist.dp_size)[dist.dp_rank]

    def shares(self, samples: list[int], data: Rollouts, groups: int) -> list[list[int]]:
        """Every data-parallel group's share (`share`), as every process computes them."""
        lengths = {i: data.length(i) for i in samples}
        return packing.balanced_shares(samples, lengths, groups)

    def layout_of(self, data: Rollouts, rows: list[list[int]]) -> packing.Layout:
        """The layout `collate` gives `rows`, found on the host (another process's)."""
        return packing.layout_of(data, rows, self.packing, None)

    def micro_batches(self, samples: list[int], data: Rollouts) -> list[list[list[int]]]:
        """Micro-batches of rows of rollout indices: packed bins, or one sample per row."""
        if self.packing:
            bins = packing.pack([data.length(i) for i in samples], self.seq_len)
            rows = [[samples[j] for j in b] for b in bins]
        else:
            rows = [[i] for i in sorted(samples, key=data.length)]
        mb = self.micro_batch
        return [rows[k:k + mb] for k in range(0, len(rows), mb)]

    def collate(self, data: Rollouts, rows: list[list[int]]) -> packing.Batch:
        """A micro-batch's rows as tensors: packed as wide as its longest row, with no mask (one
        flat row for a varlen kernel; transformers derives the mask from the position ids
        otherwise), or padded; no rows: a one-token dummy pass."""
        return packing.collate(data, rows, self.packing, None, self.pad, self.varlen)


def _schema():
    import pyarrow as pa

    return pa.schema([("id", pa.string()), ("sample_idx", pa.int32()),
                      ("ids", pa.list_(pa.int32())), ("prompt_len", pa.int32()),
                      ("old_logp", pa.list_(pa.float32())), ("reward", pa.float32()),
                      ("group_accuracy", pa.float32()), ("reasoning_tokens", pa.int32()),
                      ("has_answer", pa.bool_())])


def cache_path(cfg: OfflineConfig, tokenizer: Any) -> Path:
    """Where the rollouts' Arrow file goes: keyed by the Verified shard's files (names, sizes,
    times), the tokenizer, max_tokens and the code version."""
    from reasoner import __version__

    h = hashlib.sha256(
        f"{__version__}|{cfg.max_tokens}|{token_cache.tokenizer_fingerprint(tokenizer)}".encode())
    folder = Path(cfg.input_dir)
    for f in [*shards.part_files(folder), folder / shards.MANIFEST]:
        if f.exists():
            st = f.stat()
            h.update(f"{f.name}|{st.st_size}|{st.st_mtime_ns}".encode())
    return Path(cfg.output_dir) / "rollouts" / f"rollouts-{h.hexdigest()[:20]}.arrow"


def load_rollouts(cfg: OfflineConfig, tokenizer: Any, dist: Any = None) -> Rollouts:
    """Stream the Verified shard into a memory-mapped Arrow file once (in the run folder, which
    every process sees: rank 0 writes it, the others wait and map it) and read the samples
    from it."""
    path = cache_path(cfg, tokenizer)
    # the .json (dropped count) is written last: its presence marks a complete cache
    token_cache.build_once(path.with_suffix(".json"), lambda _: _write(cfg, tokenizer, path), dist)
    table = token_cache.open_table(path)
    if not table.num_rows:
        raise TrainingError(f"every sample of {cfg.input_dir} is empty or longer than "
                            f"max_tokens={cfg.max_tokens}")
    dropped = json.loads(path.with_suffix(".json").read_text())["dropped"]
    ids = table.column("id").to_pylist()
    group_of = {pid: g for g, pid in enumerate(dict.fromkeys(ids))}
    col = lambda name, dt: torch.from_numpy(  # noqa: E731
        table.column(name).to_numpy(zero_copy_only=False).astype("float32")).to(dt)
    return Rollouts(
        keys=list(zip(ids, table.column("sample_idx").to_pylist(), strict=True)),
        ids=token_cache.ListColumn(table, "ids"),
        prompt_lens=table.column("prompt_len").to_pylist(),
        rewards=col("reward", torch.float32),
        groups=torch.tensor([group_of[i] for i in ids], dtype=torch.long),
        group_acc=col("group_accuracy", torch.float32),
        reasoning=col("reasoning_tokens", torch.float32),
        has_answer=col("has_answer", torch.bool),
        old_logp=(token_cache.ListColumn(table, "old_logp")
                  if table.column("old_logp").null_count == 0 else None),
        dropped=dropped)


def _write(cfg: OfflineConfig, tokenizer: Any, path: Path) -> None:
    prompts: dict[str, list[int]] = {}
    dropped = 0
    eot = end_of_turn(tokenizer)
    end_id = tokenizer.convert_tokens_to_ids(eot) if eot else tokenizer.eos_token_id

    def rows() -> Iterator[dict]:
        nonlocal dropped
        for r in shards.iter_rows(cfg.input_dir, Verified):
            if r["prompt"] not in prompts:
                prompts[r["prompt"]] = tokenizer(r["prompt"], add_special_tokens=False)["input_ids"]
            p = prompts[r["prompt"]]
            resp = r.get("token_ids")
            if resp is None:
                resp = tokenizer(r["response"], add_special_tokens=False)["input_ids"]
                if r["finish_reason"] == "stop":  # the token that ended it, as SFT trained it
                    resp = resp + [end_id]
            if not resp or len(p) + len(resp) > cfg.max_tokens:
                dropped += 1
                continue
            yield {"id": r["id"], "sample_idx": r["sample_idx"], "ids": p + list(resp),
                   "prompt_len": len(p), "old_logp": r.get("logprobs"), "reward": r["reward"],
                   "group_accuracy": r["group_accuracy"],
                   "reasoning_tokens": r["reasoning_tokens"],
                   "has_answer": r.get("extracted") is not None}

    count = token_cache.write_rows(path, _schema(), rows())
    if count == 0 and dropped == 0:
        path.unlink()
        raise TrainingError(f"{cfg.input_dir}: the Verified shard holds no samples")
    shards.atomic_write_text(path.with_suffix(".json"), json.dumps({"dropped": dropped}))

