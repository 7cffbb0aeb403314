"""`reasoner explain SHARD ID`: why a sample got its verdict.

For each sample of one problem in a Sample or Verified shard: the reference, the extracted
final answer, what each side was read as, the rule verifier's verdict and its reason, and, for
a Verified shard, the verdict recorded there (with the judge's reply when a judge ran).
"""

from __future__ import annotations

from pathlib import Path

from reasoner import shards
from reasoner.config import TemplateConfig
from reasoner.errors import InputError
from reasoner.verify.extract import extract_answer


def explain(folder: Path, problem_id: str, sample_idx: int | None = None,
            timeout_s: float = 10.0) -> list[dict]:
    """One dict per matching sample: reference, extracted answer, parses, verdict, reason."""
    from reasoner.verify.rules import VerifierPool

    folder = Path(folder)
    rows = [r for r in shards.iter_rows(folder) if str(r.get("id")) == str(problem_id)
            and (sample_idx is None or r.get("sample_idx") == sample_idx)]
    if not rows:
        which = f" sample {sample_idx}" if sample_idx is not None else ""
        raise InputError(f"{folder}: no row with id {problem_id!r}{which}; ids look like "
                         f"{next(iter(shards.iter_rows(folder)), {}).get('id')!r}")
    config = (shards.read_manifest(folder) or {}).get("config", {})
    t = TemplateConfig.model_validate(config.get("template", {}))
    extracted = [extract_answer(r["response"], t.answer_open, t.answer_close) for r in rows]
    with VerifierPool(workers=1, timeout_s=timeout_s) as pool:
        details = iter(pool.explain([(r["answer"], e) for r, e in zip(rows, extracted, strict=True)
                                     if e is not None]))
        out = []
        for r, e in zip(rows, extracted, strict=True):
            d = next(details) if e is not None else {"correct": False, "reason": "no final answer"}
            if d is None:
                d = {"correct": None, "reason": f"no decision within {timeout_s:g}s (verdict timeout)"}
            out.append({"id": r["id"], "sample_idx": r["sample_idx"], "reference": r["answer"],
                        "extracted": e, "reference_read_as": d.get("gold"),
                        "answer_read_as": d.get("pred"),
                        "rule": {True: "correct", False: "incorrect", None: "timeout"}[d["correct"]],
                        "reason": d["reason"], "recorded": r.get("verdict"),
                        "verifier": r.get("verifier"),
                        "judge_output": (r.get("judge_output") or "")[-400:] or None,
                        "response_tail": r["response"][-300:]})
    return out
