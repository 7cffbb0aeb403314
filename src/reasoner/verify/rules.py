"""Rule verification: math-verify decides equivalence, inside a pool of worker processes.

math-verify (sympy underneath) can run away on adversarial input, e.g. a tower of exponents.
Every item therefore runs in a worker process with a hard wall-clock limit and an address-space
cap: a worker past its deadline is killed and replaced, and the item's verdict is None
(`timeout`). The pool never hangs and never raises on odd input.
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import os
import time
from collections.abc import Iterable
from multiprocessing.connection import Connection, wait

SENTINEL = None


def _parse(text: str):
    from math_verify import parse

    # Wrapping in $...$ lets the LaTeX extractor read bare LaTeX (\frac12, \{1,2\}); the plain
    # expression extractor in math-verify's defaults covers the rest.
    parsed = parse(f"${text}$", parsing_timeout=None)
    return parsed if parsed else parse(text, parsing_timeout=None)


def check(reference: str, candidate: str) -> bool:
    """math-verify's verdict, in this process, with no time limit (workers call this)."""
    from math_verify import verify

    gold, pred = _parse(str(reference)), _parse(str(candidate))
    if not gold or not pred:
        return False
    return bool(verify(gold, pred, timeout_seconds=None))


def _worker(conn: Connection, memory_mb: int) -> None:
    import logging

    # math-verify warns that its own timeouts are off: the pool enforces them instead.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    try:
        import resource

        limit = memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (ImportError, ValueError, OSError):
        pass  # no cap on this platform: the wall-clock limit still holds
    while True:
        item = conn.recv()
        if item is SENTINEL:
            return
        ref, cand = item
        try:
            result: bool | None = check(ref, cand)
        except MemoryError:
            result = None
        except Exception:  # noqa: BLE001  a parse failure of odd input means "not equivalent"
            result = False
        conn.send(result)


class VerifierPool:
    """N worker processes answering (reference, candidate) -> True / False / None (timeout)."""

    def __init__(self, workers: int = 1, timeout_s: float = 5.0, memory_mb: int = 2048):
        self.size, self.timeout_s, self.memory_mb = max(1, workers), timeout_s, memory_mb
        # fork: replacements start at once, with math-verify already imported in the parent
        self._ctx = mp.get_context("fork" if os.name == "posix" else "spawn")
        import math_verify  # noqa: F401
        self._workers: list[tuple[mp.Process, Connection]] = []
        self.replaced = 0

    def _spawn(self) -> tuple[mp.Process, Connection]:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_worker, args=(child, self.memory_mb), daemon=True)
        proc.start()
        child.close()
        return proc, parent

    def _ensure(self) -> None:
        while len(self._workers) < self.size:
            self._workers.append(self._spawn())

    def map(self, pairs: Iterable[tuple[str, str]]) -> list[bool | None]:
        """Verdicts in input order; each item has its own deadline."""
        items = list(pairs)
        results: list[bool | None] = [None] * len(items)
        self._ensure()
        pending = iter(range(len(items)))
        busy: dict[Connection, tuple[int, float, int]] = {}  # conn -> (item, deadline, slot)
        free = list(range(len(self._workers)))

        def submit(slot: int) -> bool:
            i = next(pending, None)
            if i is None:
                return False
            _, conn = self._workers[slot]
            conn.send(items[i])
            busy[conn] = (i, time.monotonic() + self.timeout_s, slot)
            return True

        while free and submit(free[-1]):
            free.pop()
        while busy:
            nearest = min(d for _, d, _ in busy.values())
            ready = wait(list(busy), timeout=max(0.0, nearest - time.monotonic()))
            for conn in ready:
                i, _, slot = busy.pop(conn)
                try:
                    results[i] = conn.recv()
                except (EOFError, OSError):  # the worker died (e.g. hit its memory cap)
                    results[i] = None
                    self._replace(slot)
                submit(slot)
            now = time.monotonic()
            for conn, (i, deadline, slot) in list(busy.items()):
                if now >= deadline and conn not in ready:
                    busy.pop(conn)
                    results[i] = None
                    self._replace(slot)
                    submit(slot)
        return results

    def _replace(self, slot: int) -> None:
        proc, conn = self._workers[slot]
        proc.kill()
        proc.join()
        conn.close()
        self._workers[slot] = self._spawn()
        self.replaced += 1

    def close(self) -> None:
        for proc, conn in self._workers:
            try:
                conn.send(SENTINEL)
            except (BrokenPipeError, OSError):
                pass  # already gone
            proc.join(timeout=1)
            if proc.is_alive():
                proc.kill()
        self._workers = []

    def __enter__(self) -> VerifierPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_DEFAULT: VerifierPool | None = None  # the pool behind is_equivalent, closed at exit


@atexit.register
def _close_default() -> None:
    if _DEFAULT is not None:
        _DEFAULT.close()


def is_equivalent(reference: str, candidate: str, timeout_s: float = 5.0) -> bool | None:
    """Mathematical equivalence by math-verify; None when it cannot decide in time (DESIGN 5b)."""
    global _DEFAULT
    if _DEFAULT is None or _DEFAULT.timeout_s != timeout_s:
        if _DEFAULT is not None:
            _DEFAULT.close()
        _DEFAULT = VerifierPool(workers=1, timeout_s=timeout_s)
    return _DEFAULT.map([(str(reference), str(candidate))])[0]
