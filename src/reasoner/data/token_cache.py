"""Token ids of a whole data set in one memory-mapped Arrow file, written once, read by every rank.

SFT data runs to millions of rows of up to 32K tokens: held as Python lists that is tens of
GB per process, times eight processes per node. Here the ids live in an Arrow IPC file of
`ids: list<int32>` and `prompt_len: int32` columns, written in batches while the rows stream
in, and opened with a memory map: a rank pays for the pages it touches, and the page cache
is shared between the ranks of a node. `TokenTable[i]` is example i's ids as a list.

Under torchrun the first process of each node (local rank 0) writes the file, under a
temporary name swapped in with os.replace, while the other ranks wait at a barrier; then every
rank maps it. Nodes that share a file system race harmlessly (the files are identical); nodes
that do not each get their own copy.
"""

from __future__ import annotations

import hashlib
import os
import socket
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from reasoner import device as dev

BATCH = 512  # examples rendered and tokenized per call of the (fast, batched) tokenizer


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """What makes a tokenizer's ids: its vocabulary and rules, chat template and end of text (a
    cache keyed by it is rebuilt when any of them changes)."""
    h = hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode())
    h.update(str(getattr(tokenizer, "chat_template", "")).encode())
    h.update(str(tokenizer.eos_token).encode())
    return h.hexdigest()[:16]


def open_table(path: Path):
    """The Arrow IPC file at `path`, memory-mapped (columns are views of the file's pages)."""
    import pyarrow as pa

    return pa.ipc.open_file(pa.memory_map(str(path))).read_all()


class ListColumn:
    """Read-only, list-like view of a `list<...>` column: `len(c)`, `c[i]` (a Python list of
    that one row), `c.lengths`; zero-copy over the memory map, chunk by chunk."""

    def __init__(self, table, name: str):
        self._chunks = []  # (values, offsets) per record batch
        for chunk in table.column(name).chunks:
            self._chunks.append((chunk.values.to_numpy(zero_copy_only=True),
                                 chunk.offsets.to_numpy(zero_copy_only=True)))
        sizes = [len(offsets) - 1 for _, offsets in self._chunks]
        self._starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.lengths = np.concatenate(
            [np.diff(offsets) for _, offsets in self._chunks] or [np.zeros(0)]).astype(np.int64)

    def __len__(self) -> int:
        return int(self._starts[-1])

    def __getitem__(self, i: int) -> list:
        if not 0 <= i < len(self):
            raise IndexError(i)
        c = int(np.searchsorted(self._starts, i, side="right")) - 1
        values, offsets = self._chunks[c]
        j = i - int(self._starts[c])
        return values[offsets[j]:offsets[j + 1]].tolist()

    def __iter__(self) -> Iterator[list]:
        return (self[i] for i in range(len(self)))


class TokenTable(ListColumn):
    """The token cache: `t[i]` is example i's ids, `t.prompt_lens`, `t.lengths`."""

    def __init__(self, path: Path):
        self.path = Path(path)
        table = open_table(path)
        super().__init__(table, "ids")
        self.prompt_lens = table.column("prompt_len").to_numpy().astype(np.int64)


def write_rows(path: Path, schema, rows: Iterable[dict],
               on_batch: Callable[[int], None] = lambda n: None) -> int:
    """Rows (dicts of the schema's columns) into an Arrow IPC file at `path`, BATCH at a time,
    under a temporary name swapped in when complete; returns the number of rows."""
    import pyarrow as pa

    tmp = path.with_name(f"{path.name}.{socket.gethostname()}-{os.getpid()}.tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    try:
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
            for batch in _batches(rows):
                writer.write_batch(pa.RecordBatch.from_pylist(batch, schema=schema))
                count += len(batch)
                on_batch(len(batch))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return count


def write(path: Path, pairs: Iterable[tuple[str, str]], tokenize: Callable[[list[str]], list],
          on_batch: Callable[[int], None] = lambda n: None) -> int:
    """Tokenize (prompt, response) text pairs in batches into an Arrow file at `path`
    (atomically); return the number of examples. `tokenize` maps texts to id lists."""
    import pyarrow as pa

    schema = pa.schema([("ids", pa.list_(pa.int32())), ("prompt_len", pa.int32())])

    def rows() -> Iterator[dict]:
        for batch in _batches(pairs):
            p_ids = tokenize([p for p, _ in batch])
            r_ids = tokenize([r for _, r in batch])
            for p, r in zip(p_ids, r_ids, strict=True):
                yield {"ids": p + r, "prompt_len": len(p)}

    return write_rows(path, schema, rows(), on_batch)


def _batches(pairs: Iterable[tuple[str, str]]) -> Iterator[list[tuple[str, str]]]:
    batch: list[tuple[str, str]] = []
    for pair in pairs:
        batch.append(pair)
        if len(batch) == BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


def build_once(path: Path, build: Callable[[Path], None], dist: dev.DistInfo | None,
               shared: bool = True) -> bool:
    """Make sure `path` exists: one process runs `build(path)`, the others wait at a barrier
    and then read it. True when the file was already there. `shared`: every process sees
    `path`'s folder (a file system all nodes share: the run folder always is), so rank 0 alone
    builds it; otherwise the first process of each node builds its node's copy."""
    hit = path.exists()
    builder = dist is None or (dist.rank == 0 if shared else dist.local_rank == 0)
    if not hit and builder:
        build(path)
    if dist is not None:
        dev.barrier(dist)
    return hit
