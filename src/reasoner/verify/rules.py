"""Rule verification: math-verify decides equivalence, inside a pool of worker processes.

math-verify (sympy underneath) can run away on adversarial input, e.g. a tower of exponents.
Every item therefore runs in a worker process with a hard wall-clock limit and an address-space
cap: a worker past its deadline is killed and replaced, and the item's verdict is None
(`timeout`). The pool never hangs and never raises on odd input.
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import sys
import time
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection, wait
from typing import Any

from reasoner.verify.normalize import (
    letters,
    plain_number,
    primes,
    read_as_number,
    same_number,
    strip_assignment,
    strip_fonts,
    strip_unit,
)

SENTINEL = None
READY = "ready"  # a worker's hello once it can take items
STARTUP_TIMEOUT_S = 300.0


def _is_prose(text: str) -> bool:
    """Text with math delimiters in it (an escaped dollar sign `\\$` is not one)."""
    return "$" in text.replace("\\$", "") or "\\(" in text or "\\[" in text


def _parse(text: str):
    from math_verify import parse

    if _is_prose(text):  # prose with math in it: math-verify's own extraction finds the math
        return parse(text, parsing_timeout=None)
    # Wrapping in $...$ lets the LaTeX extractor read bare LaTeX (\frac12, \{1,2\}); the plain
    # expression extractor in math-verify's defaults covers the rest.
    parsed = parse(f"${text}$", parsing_timeout=None)
    return parsed if parsed else parse(text, parsing_timeout=None)


def _imaginary(gold, pred) -> bool | None:
    """With `i` the only symbol on either side, compare with i as the imaginary unit
    (i(2-i) = 1+2i, i^2 = -1); None when that reading does not apply."""
    import sympy

    if not (isinstance(gold, sympy.Expr) and isinstance(pred, sympy.Expr)):
        return None
    symbols = gold.free_symbols | pred.free_symbols
    if not symbols or {s.name for s in symbols} != {"i"}:
        return None
    unit = {s: sympy.I for s in symbols}
    return bool(sympy.simplify(gold.subs(unit) - pred.subs(unit)) == 0)


def compare(reference: str, candidate: str) -> dict[str, Any]:
    """math-verify's verdict on two final answers, with what each side was read as and why.

    Before math-verify (see normalize.py): fonts dropped; a prime on one side only is a
    mismatch; a reference that is a plain number (unit words from a closed list removed) is
    compared as a number with a candidate that is one too (thousands separators, decimal
    comma, fractions, mixed numbers); a comma list against an ordered tuple is read as a tuple.
    """
    from math_verify import verify

    from reasoner.verify.extract import extract_answer

    ref, cand = str(reference), str(candidate)
    if "\\boxed" in ref or "\\fbox" in ref:  # a worked solution as reference: its boxed answer
        ref = extract_answer(ref) or ref
    ref, cand = strip_fonts(ref), strip_fonts(cand)
    if "".join(ref.split()) == "".join(cand.split()):
        return {"correct": True, "reason": "the same text", "gold": ref, "pred": cand}
    if not (_is_prose(ref) or _is_prose(cand)) and primes(ref) != primes(cand):
        return {"correct": False, "reason": "a prime on one side only (E' is not E)",
                "gold": ref, "pred": cand}
    ref_value = plain_number(strip_unit(ref))
    if ref_value is not None:
        cand = strip_unit(strip_assignment(cand))
        cand_value = plain_number(cand)
        if cand_value is not None:
            same = same_number(ref_value, cand_value)
            return {"correct": same, "reason": f"plain numbers {'equal' if same else 'differ'}",
                    "gold": str(ref_value), "pred": str(cand_value)}
        ref = str(ref_value)  # the reference's value, written plainly
    gold = _parse(ref)
    if gold and type(gold[0]).__name__ == "Tuple" and "," in cand and cand.lstrip()[:1] not in "([{\\":
        cand = f"({cand})"  # several boxes against an ordered reference: order counts
    pred = _parse(cand)
    detail = {"gold": str(gold[0]) if gold else None, "pred": str(pred[0]) if pred else None}
    if not gold or not pred:
        return {**detail, "correct": False,
                "reason": f"math-verify could not parse the {'reference' if not gold else 'answer'}"}
    if not (_is_prose(ref) or _is_prose(cand)):  # prose: math-verify's own extraction reads it
        # math-verify reads "12 ab" as 12 and "\\hbar\\omega(v+1/2)-..." as 2: letters gone, a
        # number left. Then what it dropped may be the whole difference: only the same text
        # (checked above) counts.
        ref_letters, cand_letters = letters(ref), letters(cand)
        ref_lost = ref_letters and read_as_number(gold[0])
        cand_lost = cand_letters and read_as_number(pred[0]) and cand_letters != ref_letters
        if ref_lost or cand_lost:
            return {**detail, "correct": False, "reason": "math-verify dropped the letters of the "
                    f"{'reference' if ref_lost else 'answer'}; the texts differ"}
    imaginary = _imaginary(gold[0], pred[0])
    if imaginary is not None:
        return {**detail, "correct": imaginary, "reason": "compared with i as the imaginary unit"}
    same = bool(verify(gold, pred, timeout_seconds=None))
    return {**detail, "correct": same, "reason": f"math-verify: {'equivalent' if same else 'not equivalent'}"}


def check(reference: str, candidate: str) -> bool:
    """The verdict of `compare`, in this process, with no time limit (workers call this)."""
    return compare(reference, candidate)["correct"]


# Comparisons whose first run imports what math-verify and sympy load lazily (the LaTeX parser,
# sympy's units, combinatorics and tensor modules for `simplify`): 5 s here the first time,
# 0.03 s after.
WARM_UP = [("73", "None"), ("\\{1,2\\}", "\\{2,1\\}")]


def warm_up() -> None:
    """Run WARM_UP once, so that cost is paid before a worker says it is ready, not inside the
    deadline of its first item: there it turned "73" vs "None" into a timeout (None) on a
    loaded CI machine. The fork server runs it too (module `warm`), so forked workers start warm."""
    import logging

    # math-verify warns that its own timeouts are off: the pool enforces them instead.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    for ref, cand in WARM_UP:
        compare(ref, cand)


def _worker(conn: Connection, memory_mb: int) -> None:
    warm_up()  # at once where the fork server ran it; seconds under spawn
    try:
        import resource

        limit = memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (ImportError, ValueError, OSError):
        pass  # no cap on this platform: the wall-clock limit still holds
    conn.send(READY)  # deadlines count from here, never from the process start
    while True:
        item = conn.recv()
        if item is SENTINEL:
            return
        ref, cand = item
        try:
            result: dict | None = compare(ref, cand)
        except MemoryError:
            result = None
        except Exception as exc:  # noqa: BLE001  a parse failure of odd input: not equivalent
            result = {"correct": False, "reason": f"math-verify raised {type(exc).__name__}: {exc}"}
        conn.send(result)


def _by_reference(items: list[tuple[str, str]], workers: int) -> list[deque[int]]:
    """Item indices split into one queue per worker, all pairs of a reference in one queue
    (the samples of a problem share its reference), queues balanced by item count."""
    groups: dict[str, list[int]] = {}
    for i, (ref, _) in enumerate(items):
        groups.setdefault(str(ref), []).append(i)
    queues: list[deque[int]] = [deque() for _ in range(workers)]
    for group in sorted(groups.values(), key=len, reverse=True):
        min(queues, key=len).extend(group)
    return queues


@contextmanager
def _without_main() -> Iterator[None]:
    """Start a worker without the caller's main module. A spawn or forkserver child re-runs the
    parent's main script (by its `__file__`) before its target; the workers need nothing from
    it, and re-running it breaks them: a plain script calling `is_equivalent` without an
    `if __name__ == "__main__":` guard starts a pool inside the worker (EOFError in the caller),
    and an entry point edited since the run began no longer imports. Hidden for the moment of
    `start()` (the child reads it then), restored after."""
    main = sys.modules.get("__main__")
    hide = main is not None and getattr(main, "__file__", None) is not None
    saved = (main.__dict__.pop("__file__"), main.__dict__.get("__spec__")) if hide else None
    if hide:
        main.__spec__ = None
    try:
        yield
    finally:
        if hide:
            main.__file__, main.__spec__ = saved


class VerifierPool:
    """N worker processes answering (reference, candidate) -> True / False / None (timeout)."""

    def __init__(self, workers: int = 1, timeout_s: float = 5.0, memory_mb: int = 2048):
        self.size, self.timeout_s, self.memory_mb = max(1, workers), timeout_s, memory_mb
        # forkserver: workers fork from a clean single-threaded server that has math-verify
        # imported and warmed up (`warm_up`), so replacements start at once. Forking the caller
        # itself is unsafe: after torch or pyarrow started their thread pools (eval runs a
        # model, then verifies), a forked child can segfault inside the LaTeX parser. Workers
        # are started without the caller's main module (see _without_main).
        if "forkserver" in mp.get_all_start_methods():
            self._ctx = mp.get_context("forkserver")
            self._ctx.set_forkserver_preload(["math_verify", "reasoner.verify.warm"])
        else:
            self._ctx = mp.get_context("spawn")
        import math_verify  # noqa: F401
        self._workers: list[tuple[mp.Process, Connection]] = []
        self.replaced = 0

    def _start(self) -> tuple[mp.Process, Connection]:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_worker, args=(child, self.memory_mb), daemon=True)
        with _without_main():
            proc.start()
        child.close()
        return proc, parent

    @staticmethod
    def _ready(worker: tuple[mp.Process, Connection]) -> tuple[mp.Process, Connection]:
        """Wait for a started worker's hello. A worker's start (the fork server's first start,
        a script's imports re-run in the child on a busy machine) can take seconds: counted
        against the first item's deadline it turned correct answers into timeouts."""
        proc, conn = worker
        if not conn.poll(STARTUP_TIMEOUT_S) or conn.recv() != READY:
            proc.kill()
            raise RuntimeError(f"a math-verify worker did not start within {STARTUP_TIMEOUT_S} s")
        return worker

    def _spawn(self) -> tuple[mp.Process, Connection]:
        return self._ready(self._start())

    def _ensure(self) -> None:
        started = [self._start() for _ in range(self.size - len(self._workers))]
        self._workers += [self._ready(w) for w in started]  # all start at once

    def map(self, pairs: Iterable[tuple[str, str]]) -> list[bool | None]:
        """Verdicts in input order (None: past its deadline); each item has its own deadline."""
        return [None if d is None else d["correct"] for d in self.explain(pairs)]

    def explain(self, pairs: Iterable[tuple[str, str]]) -> list[dict | None]:
        """`compare`'s answer per pair, in input order; None for a pair past its deadline."""
        items = list(pairs)
        results: list[dict | None] = [None] * len(items)
        self._ensure()
        queues = _by_reference(items, len(self._workers))
        busy: dict[Connection, tuple[int, float, int]] = {}  # conn -> (item, deadline, slot)
        free = list(range(len(self._workers)))

        def submit(slot: int) -> bool:
            # its own queue first (pairs that share a reference share math-verify's parse
            # cache in one worker), else the tail of the longest queue
            queue = queues[slot] or max(queues, key=len)
            if not queue:
                return False
            i = queue.popleft() if queue is queues[slot] else queue.pop()
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
    """Mathematical equivalence by math-verify; None when it cannot decide in time (docs/design.md)."""
    global _DEFAULT
    if _DEFAULT is None or _DEFAULT.timeout_s != timeout_s:
        if _DEFAULT is not None:
            _DEFAULT.close()
        _DEFAULT = VerifierPool(workers=1, timeout_s=timeout_s)
    return _DEFAULT.map([(str(reference), str(candidate))])[0]
