"""Benchmark: rule-verification throughput, reasoner's worker pool vs a plain math-verify loop.

    python scripts/bench_verify.py [--pairs 3000]

Pairs are built from the reference answers of the benchmark files in shared/data/eval/ beside the
checkout (AIME, AMC, GSM8K, Minerva): each reference against itself, a LaTeX rewrite, and a
perturbed value. Prints answers/s for
the plain in-process loop and the pool with 1 and 2 workers, their ratios, verdict agreement
and the slowest item. Ratios matter, not absolute numbers: the machines are shared.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import time
from pathlib import Path

from reasoner.verify.extract import extract_answer
from reasoner.verify.rules import VerifierPool, check

EVAL = Path(__file__).resolve().parents[2] / "shared" / "data" / "eval"


def references() -> list[str]:
    refs: list[str] = []
    for name, field in (("aime24.jsonl", "answer"), ("aime25.jsonl", "answer"),
                        ("amc23.jsonl", "answer"), ("gsm8k.jsonl", "answer"),
                        ("minerva_math.jsonl", "solution")):
        path = EVAL / name
        if not path.exists():
            raise SystemExit(f"{path} is missing: the benchmark needs shared/data/eval/ beside the checkout")
        for line in path.read_text().splitlines():
            value = json.loads(line)[field]
            if name == "gsm8k.jsonl":
                value = value.split("####")[-1].strip()
            elif name == "minerva_math.jsonl":
                value = extract_answer(value)
            if value is not None:
                refs.append(str(value).removesuffix(".0") if isinstance(value, float) else str(value))
    return refs


def variants(ref: str, rng: random.Random) -> list[str]:
    out = [ref]
    if re.fullmatch(r"-?\d+", ref):
        n = int(ref)
        out += [f"\\frac{{{2 * n}}}{{2}}", str(n + rng.choice([-2, -1, 1, 3]))]
    else:
        out += [f"\\left({ref}\\right)", ref + "+1"]
    return out


def plain_loop(pairs: list[tuple[str, str]]) -> tuple[list[bool | None], float]:
    from math_verify import parse, verify

    out: list[bool | None] = []
    slowest = 0.0
    for ref, cand in pairs:
        t = time.perf_counter()
        try:
            out.append(bool(verify(parse(f"${ref}$"), parse(f"${cand}$"))))
        except Exception:  # noqa: BLE001  math-verify's own timeouts and parse failures
            out.append(None)
        slowest = max(slowest, time.perf_counter() - t)
    return out, slowest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=3000)
    ap.add_argument("--timeout", type=float, default=5.0)
    args = ap.parse_args()
    rng = random.Random(0)
    pairs = [(r, v) for r in references() for v in variants(r, rng)]
    rng.shuffle(pairs)
    pairs = pairs[:args.pairs]
    results = {}
    t = time.perf_counter()
    plain, slowest = plain_loop(pairs)
    results["plain math-verify loop"] = (len(pairs) / (time.perf_counter() - t), plain, slowest)
    for workers in (1, 2):
        with VerifierPool(workers=workers, timeout_s=args.timeout) as pool:
            pool.map(pairs[:8])  # workers started
            t = time.perf_counter()
            got = pool.map(pairs)
            results[f"reasoner pool, {workers} worker{'s' * (workers > 1)}"] = (
                len(pairs) / (time.perf_counter() - t), got, None)
    base = results["plain math-verify loop"][0]
    print(f"\n{len(pairs)} pairs, limit {args.timeout}s per item\n")
    print("| verifier | answers/s | vs plain loop | same verdict as plain (where it answered) |")
    print("|---|---|---|---|")
    for name, (rate, got, _) in results.items():
        both = [(a, b) for a, b in zip(plain, got, strict=True) if a is not None]
        agree = sum(a == b for a, b in both) / len(both)
        print(f"| {name} | {rate:,.0f} | {rate / base:.2f}x | {agree:.4f} |")
    print(f"\nslowest plain item: {slowest:.2f}s; pool timeouts: "
          f"{sum(g is None for g in results['reasoner pool, 2 workers'][1])}")
    assert check("1/2", "0.5")


if __name__ == "__main__":
    main()
