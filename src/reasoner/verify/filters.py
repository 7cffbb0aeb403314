"""The recipe's filters over verified groups (a group = the samples of one problem).

Order, each optional and each reporting the problems and samples it removed:
  1. truncated  responses cut at max_tokens: dropped, or kept as negatives (reward -1)
  2. dedupe     exact duplicate responses within a group (the first is kept)
  3. difficulty groups whose mean response tokens reach a threshold and that are not all
                correct (recipe: >= 32K tokens)
  4. zero-variance  groups all correct or all wrong (no learning signal for group baselines)
  5. long positives  correct responses longer than a cap (recipe: 48K tokens)
Group statistics (`group_size`, `group_accuracy`) are computed after steps 1-2, on the group the
later filters judge, and are not recomputed when step 5 removes a long positive.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from reasoner.config import FilterConfig


def groups_of(rows: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        out[r["id"]].append(r)
    return out


def _count(rows: list[dict]) -> tuple[int, int]:
    return len({r["id"] for r in rows}), len(rows)


def _step(report: list[dict], name: str, rows: list[dict], keep: Callable[[dict], bool]
          ) -> list[dict]:
    kept = [r for r in rows if keep(r)]
    (p0, s0), (p1, s1) = _count(rows), _count(kept)
    report.append({"filter": name, "problems_removed": p0 - p1, "samples_removed": s0 - s1,
                   "problems_left": p1, "samples_left": s1})
    return kept


def apply(rows: list[dict], cfg: FilterConfig) -> tuple[list[dict], list[dict]]:
    """(kept rows with group stats, report) for rows carrying `reward`, `finish_reason`, ..."""
    report: list[dict] = []
    if cfg.truncated == "drop":
        rows = _step(report, "truncated (dropped)", rows, lambda r: r["finish_reason"] == "stop")
    else:  # cut off (length), aborted or failed: not an answer the model finished
        for r in rows:
            if r["finish_reason"] != "stop" and r["reward"] > 0:
                r["reward"], r["verdict"] = -1.0, "no_answer"
        rows = _step(report, "truncated (kept as negatives)", rows, lambda r: True)
    if cfg.dedupe:
        seen: set[tuple[str, str]] = set()

        def first(r: dict) -> bool:
            key = (r["id"], r["response"])
            if key in seen:
                return False
            seen.add(key)
            return True

        rows = _step(report, "duplicate responses", rows, first)
    for group in groups_of(rows).values():
        accuracy = sum(r["reward"] > 0 for r in group) / len(group)
        for r in group:
            r["group_size"], r["group_accuracy"] = len(group), accuracy
    if cfg.min_group_mean_tokens is not None:
        mean = {pid: sum(r["response_tokens"] for r in g) / len(g)
                for pid, g in groups_of(rows).items()}
        rows = _step(report, f"difficulty (mean tokens >= {cfg.min_group_mean_tokens}, "
                             "not all correct)", rows,
                     lambda r: mean[r["id"]] >= cfg.min_group_mean_tokens
                     and r["group_accuracy"] < 1.0)
    if cfg.drop_zero_variance:
        rows = _step(report, "zero variance (all correct or all wrong)", rows,
                     lambda r: 0.0 < r["group_accuracy"] < 1.0)
    if cfg.max_positive_tokens is not None:
        rows = _step(report, f"positives longer than {cfg.max_positive_tokens} tokens", rows,
                     lambda r: not (r["reward"] > 0 and r["response_tokens"] > cfg.max_positive_tokens))
    return rows, report
