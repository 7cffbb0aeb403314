"""`reasoner explain SHARD ID`: why a sample got its verdict.

For each sample of one problem in a Sample or Verified shard: the reference, the extracted
final answer, what each side was read as (the reference also when the sample gave no answer),
whether the response finished or was cut off at max_tokens, the rule verifier's verdict and its
reason, and, for a Verified shard, the verdict recorded there (with the judge's reply when a
judge ran). An id that a Verified shard lacks but its samples hold was removed by verify: the
error names the filter (or the decontamination) that removed it.
"""

from __future__ import annotations

from pathlib import Path

from reasoner import shards
from reasoner.config import FilterConfig, TemplateConfig
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
        removed = removed_by(folder, str(problem_id), sample_idx)
        if removed:
            raise InputError(f"{folder}: problem {problem_id!r}{which} is not in this Verified "
                             f"shard: {removed}")
        raise InputError(f"{folder}: no row with id {problem_id!r}{which}; ids look like "
                         f"{next(iter(shards.iter_rows(folder)), {}).get('id')!r}")
    config = (shards.read_manifest(folder) or {}).get("config", {})
    t = TemplateConfig.model_validate(config.get("template", {}))
    extracted = [extract_answer(r["response"], t.answer_open, t.answer_close) for r in rows]
    with VerifierPool(workers=1, timeout_s=timeout_s) as pool:
        # a sample without an answer is compared as an empty one: what the reference is read
        # as still shows (math-verify reads the reference alone; the verdict is no answer)
        details = pool.explain([(r["answer"], e or "") for r, e in zip(rows, extracted,
                                                                        strict=True)])
    out = []
    for r, e, d in zip(rows, extracted, details, strict=True):
        if d is None:
            d = {"correct": None, "reason": f"no decision within {timeout_s:g}s (verdict timeout)"}
        if e is None:
            d = {**d, "correct": False, "pred": None, "reason": "no final answer" + (
                f": {ending(r)}" if r.get("finish_reason") != "stop" else "")}
        out.append({"id": r["id"], "sample_idx": r["sample_idx"], "reference": r["answer"],
                    "extracted": e, "reference_read_as": d.get("gold"),
                    "answer_read_as": d.get("pred"),
                    "rule": {True: "correct", False: "incorrect", None: "timeout"}[d["correct"]],
                    "reason": d["reason"], "ended": ending(r), "recorded": r.get("verdict"),
                    "verifier": r.get("verifier"),
                    "judge_output": (r.get("judge_output") or "")[-400:] or None,
                    "response_tail": r["response"][-300:]})
    return out


def ending(row: dict) -> str:
    """How the response ended: by itself, or cut off (a cut-off answer is no finished answer:
    verify records it as no_answer under `filters.truncated: negative`, or drops it)."""
    reason = row.get("finish_reason")
    if reason == "stop":
        return "by itself"
    if reason == "length":
        return (f"cut off at the length limit (sampling.max_tokens) after "
                f"{row.get('response_tokens')} tokens")
    return f"by {reason}" + (f" ({row['error']})" if row.get("error") else "")


def removed_by(folder: Path, problem_id: str, sample_idx: int | None) -> str | None:
    """Why a Verified shard lacks samples that its Sample shard (`input_dir`) holds: the
    decontamination, a dropped verdict or the first filter that removed them, with the command
    that explains them in the Sample shard; None when the samples are not there either."""
    from reasoner.verify import VERDICTS, filters, final_verdict

    manifest = shards.read_manifest(folder) or {}
    config = manifest.get("config") or {}
    if manifest.get("stage") != "verify" or not config.get("input_dir"):
        return None
    source = Path(config["input_dir"])
    if not shards.part_files(source):
        return None
    samples = [s for s in shards.iter_rows(source) if str(s.get("id")) == problem_id]
    wanted = [s for s in samples if sample_idx is None or s["sample_idx"] == sample_idx]
    if not wanted:
        return None
    see = f"explain its samples with: reasoner explain {source} {problem_id}"
    near = next((d for d in manifest.get("decontaminated", []) if str(d["id"]) == problem_id),
                None)
    if near is not None:
        return (f"decontamination removed it (score {near['score']} against a benchmark problem "
                f"of decontam.benchmarks: {near['benchmark'][:80]!r}); {see}")
    verdicts = {v["sample_idx"]: v for v in shards.iter_rows(folder / VERDICTS)
                if str(v["id"]) == problem_id} if (folder / VERDICTS).exists() else {}
    rows, dropped = [], []
    for s in samples:
        v = verdicts.get(s["sample_idx"])
        verdict = final_verdict(config.get("mode", "rule"), v)[0] if v else None
        if verdict in ("invalid", "timeout") and config.get(verdict) == "drop":
            dropped.append(f"dropping sample {s['sample_idx']} ({verdict}: drop)")
            continue
        rows.append({**s, "verdict": verdict, "reward": 1.0 if verdict == "correct" else -1.0})
    _, report = filters.apply(rows, FilterConfig.model_validate(config.get("filters") or {}))
    steps = [f"the filter {f['filter']!r}{filter_key(f['filter'])}" for f in report
             if f["samples_removed"]]
    correct = sum(r["reward"] > 0 for r in rows)
    how = "; ".join(dropped + steps) or "a step its manifest names"
    return (f"verify removed it by {how}, with {correct} of its {len(samples)} samples "
            f"correct; {see}")


# verify/filters.py's step names, and the key of verify's config that turns each on
FILTER_KEYS = {"truncated": "truncated", "duplicate": "dedupe",
               "difficulty": "min_group_mean_tokens", "zero variance": "drop_zero_variance",
               "positives longer": "max_positive_tokens"}


def filter_key(step: str) -> str:
    key = next((k for name, k in FILTER_KEYS.items() if step.startswith(name)), None)
    return f" (filters.{key})" if key else ""
