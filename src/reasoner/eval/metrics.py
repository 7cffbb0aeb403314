"""The numbers a reasoning paper reports, from verified samples.

pass@1 is the mean over the k samples of each problem (avg@k), averaged over problems. pass@k
uses the unbiased estimator 1 - C(n-c, k) / C(n, k). maj@k takes the most frequent extracted
answer, counting equivalent answers together (math-verify); a tie goes to the answer that
appears first (lowest sample_idx). The 95% interval of pass@1 is a bootstrap over problems.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable
from math import comb

from reasoner.errors import DataError


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k: probability that at least one of k of the n samples is correct (5b)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def ks_for(n: int) -> list[int]:
    """1, 2, 4, ... up to n (and n itself)."""
    ks, k = [], 1
    while k <= n:
        ks.append(k)
        k *= 2
    return ks if ks[-1] == n else ks + [n]


def bootstrap_ci(values: list[float], resamples: int = 1000, seed: int = 0,
                 level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of the mean of `values`, resampling them with replacement."""
    if not values:
        return (0.0, 0.0)
    rng = random.Random(seed)
    n = len(values)
    means = sorted(sum(values[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples))
    lo = means[int((1 - level) / 2 * resamples)]
    hi = means[min(resamples - 1, int((1 + level) / 2 * resamples))]
    return lo, hi


def paired_bootstrap_diff(a: list[float], b: list[float], resamples: int = 1000, seed: int = 0,
                          level: float = 0.95) -> tuple[float, float]:
    """Interval of mean(b) - mean(a) over the same problems, resampled together."""
    if len(a) != len(b):
        raise DataError("paired bootstrap needs the same problems in both reports")
    return bootstrap_ci([y - x for x, y in zip(a, b, strict=True)], resamples, seed, level)


def majority(answers: list[str | None], same: Callable[[str, str], bool]) -> int | None:
    """Index of the answer chosen by majority vote; None when no sample gave an answer.

    Answers are grouped by equivalence (`same`, tried against each group's first answer); the
    largest group wins and a tie goes to the group whose first answer comes earliest.
    """
    groups: list[list[int]] = []
    for i, a in enumerate(answers):
        if a is None:
            continue
        for g in groups:
            rep = answers[g[0]]
            if rep == a or same(rep, a):
                g.append(i)
                break
        else:
            groups.append([i])
    if not groups:
        return None
    best = max(groups, key=lambda g: (len(g), -g[0]))
    return best[0]


def bucket_label(edges: list[int], tokens: int) -> str:
    def k(x: int) -> str:
        return f"{x // 1024}K" if x % 1024 == 0 and x >= 1024 else str(x)

    for i, edge in enumerate(edges):
        if tokens < edge:
            return f"<{k(edge)}" if i == 0 else f"{k(edges[i - 1])}-{k(edge)}"
    return f">={k(edges[-1])}"


def quartile_edges(lengths: list[int]) -> list[int]:
    """Bucket edges that follow the data: the quartiles of the response lengths, rounded to two
    significant digits, so each bucket holds about a quarter of the samples whether answers take
    64 tokens or 30K (fixed 4K-32K edges put every short answer in one bucket). Equal lengths
    give one edge.

    >>> quartile_edges([10, 20, 30, 40, 50])
    [20, 30, 40]
    """
    qs = statistics.quantiles(lengths, n=4, method="inclusive") if len(lengths) > 1 else lengths
    return sorted({max(1, int(float(f"{q:.2g}"))) for q in qs}) or [1]


def length_buckets(rows: list[dict], edges: list[int]) -> list[dict]:
    """Accuracy and count of samples per response-length bucket, in bucket order."""
    labels = [bucket_label(edges, e - 1) for e in edges] + [bucket_label(edges, edges[-1])]
    stats = {lab: [0, 0] for lab in labels}
    for r in rows:
        s = stats[bucket_label(edges, r["response_tokens"])]
        s[0] += 1
        s[1] += r["reward"] > 0
    return [{"bucket": lab, "samples": n, "accuracy": (c / n if n else None)}
            for lab, (n, c) in stats.items()]


def strict_only(rows: list[dict]) -> list[dict]:
    """The rows as strict extraction reads them: an answer found only as the last number
    (verify.extraction: flexible) is no answer."""
    return [{**r, "extracted": None, "reward": -1.0} if r.get("extracted_by") == "last_number"
            else r for r in rows]


def summarize(rows: list[dict], same: Callable[[str, str], bool], edges: list[int] | None,
              resamples: int = 1000, seed: int = 0) -> dict:
    """Every metric of the Eval report from verified rows (reward > 0 = correct); length
    buckets at `edges`, or (None) at the quartiles of the response lengths."""
    by_problem: dict[str, list[dict]] = {}
    for r in sorted(rows, key=lambda r: (r["id"], r["sample_idx"])):
        by_problem.setdefault(r["id"], []).append(r)
    if not by_problem:
        raise ValueError("no samples to score")
    ns = {len(g) for g in by_problem.values()}
    n = min(ns)
    problems = []
    for pid, group in by_problem.items():
        correct = sum(r["reward"] > 0 for r in group)
        answers = [r.get("extracted") for r in group]
        pick = majority(answers, same)
        problems.append({
            "id": pid, "samples": len(group), "correct": correct,
            "accuracy": correct / len(group),
            "mean_tokens": sum(r["response_tokens"] for r in group) / len(group),
            "majority_answer": answers[pick] if pick is not None else None,
            "majority_correct": bool(pick is not None and group[pick]["reward"] > 0),
            "reference": group[0]["answer"],
        })
    acc = [p["accuracy"] for p in problems]
    lengths = [r["response_tokens"] for r in rows]
    edges = edges or quartile_edges(lengths)
    lo, hi = bootstrap_ci(acc, resamples, seed)
    return {
        "problems": len(problems), "k": n,
        "pass@1": sum(acc) / len(acc), "pass@1_ci95": [lo, hi],
        "pass@k": {str(k): sum(pass_at_k(p["samples"], p["correct"], k) for p in problems)
                   / len(problems) for k in ks_for(n)},
        "maj@k": sum(p["majority_correct"] for p in problems) / len(problems),
        "mean_response_tokens": statistics.fmean(lengths),
        "median_response_tokens": statistics.median(lengths),
        "truncation_rate": sum(r["finish_reason"] == "length" for r in rows) / len(rows),
        "no_answer_rate": sum(r.get("extracted") is None for r in rows) / len(rows),
        "accuracy_by_length": length_buckets(rows, edges),
        "per_problem": problems,
    }
