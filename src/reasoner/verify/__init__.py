"""`reasoner verify`: Sample shard -> Verified shard.

1. decontamination drops problems close to benchmark problems;
2. each sample gets a verdict (rule: math-verify in a process pool; judge: an LLM), written to
   `verdicts/` as it goes, so a killed run resumes without re-judging finished samples;
3. rewards R = +1 (correct) / -1 (otherwise); `invalid` and `timeout` become -1 or are dropped;
4. the filters (verify/filters.py) run in their documented order;
5. the Verified shard is written with group stats and reasoning-token counts.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from reasoner import outputs, shards
from reasoner.config import VerifyConfig
from reasoner.data.template import think_span
from reasoner.errors import ShardError
from reasoner.records import Sample, Verified
from reasoner.runlog import progress_bar
from reasoner.verify import decontam, filters
from reasoner.verify.extract import extract

VERDICTS = "verdicts"
CHUNK = 512  # samples checked by the rule verifier between two flushes of the verdict shard


def _rule_verdict(extracted: str | None, ok: bool | None) -> str:
    if extracted is None:
        return "no_answer"
    return "timeout" if ok is None else "correct" if ok else "incorrect"


def _judge_verdict(v: int | None) -> str:
    return "invalid" if v is None else "correct" if v == 1 else "incorrect"


def compute_verdicts(cfg: VerifyConfig, samples: list[dict], out: Path, progress: bool) -> int:
    """Append a verdict row per sample not yet in `out/verdicts` (resumable); return how many."""
    from reasoner.verify.rules import VerifierPool

    folder = out / VERDICTS
    done = {(r["id"], r["sample_idx"]) for r in shards.iter_rows(folder)} if folder.exists() else set()
    todo = [s for s in samples if (s["id"], s["sample_idx"]) not in done]
    if not todo:
        return 0
    need_rule = cfg.mode in ("rule", "rule_then_judge", "both")
    need_judge = cfg.mode in ("judge", "rule_then_judge", "both")
    pool = VerifierPool(cfg.workers, cfg.timeout_s, cfg.memory_mb) if need_rule else None
    judge: Any = None
    if need_judge:
        from reasoner.verify.judge import Judge

        judge = Judge(cfg.judge)
    t = cfg.template
    try:
        with shards.PartWriter(folder, 0) as writer, progress_bar(progress) as bar:
            task = bar.add_task("verify", total=len(todo), info="")
            held: list[tuple[dict, dict]] = []  # (sample, verdict row) waiting for the judge
            for start in range(0, len(todo), CHUNK):
                chunk = todo[start:start + CHUNK]
                rows = [{"id": s["id"], "sample_idx": s["sample_idx"],
                         **extract(s["response"], t, cfg.extraction)} for s in chunk]
                if pool is not None:
                    checks = [(s["answer"], r["extracted"]) for s, r in zip(chunk, rows, strict=True)
                              if r["extracted"] is not None]
                    verdicts = iter(pool.map(checks))
                    for r in rows:
                        ok = next(verdicts) if r["extracted"] is not None else False
                        r["rule_verdict"] = _rule_verdict(r["extracted"], ok)
                for s, r in zip(chunk, rows, strict=True):
                    if judge is not None and (cfg.mode != "rule_then_judge"
                                              or r["rule_verdict"] != "correct"):
                        held.append((s, r))
                    else:
                        writer.write(r)
                        bar.update(task, advance=1)
            if held:  # every judge prompt at once; each verdict written as it arrives
                asks = [{**s, "extracted": r["extracted"]} for s, r in held]
                for i, v, reply in judge.stream(asks):
                    writer.write({**held[i][1], "judge_verdict": _judge_verdict(v),
                                  "judge_output": reply})
                    bar.update(task, advance=1)
    finally:
        if pool is not None:
            pool.close()
        if judge is not None:
            judge.close()
    return len(todo)


def final_verdict(mode: str, v: dict) -> tuple[str, str]:
    """(verdict, verifier) of one verdict row under `mode`."""
    if mode == "rule":
        return v["rule_verdict"], "rule"
    if mode == "rule_then_judge" and v["rule_verdict"] == "correct":
        return "correct", "rule"
    if v.get("judge_verdict") is None:  # judge skipped (no answer and rule-only verdict)
        return v["rule_verdict"], "rule"
    return v["judge_verdict"], "judge"


def agreement(verdicts: list[dict]) -> dict[str, int]:
    """rule verdict x judge verdict counts (mode `both`)."""
    c = Counter(f"rule={v['rule_verdict']},judge={v['judge_verdict']}" for v in verdicts
                if "judge_verdict" in v and "rule_verdict" in v)
    return dict(sorted(c.items()))


def _write_disagreements(path: Path, samples: list[dict], verdicts: dict) -> None:
    """Samples where the rule verifier and the judge disagree (mode both), for a person to read."""
    lines = []
    for s in samples:
        v = verdicts[(s["id"], s["sample_idx"])]
        if v.get("judge_verdict") is not None and v["judge_verdict"] != v.get("rule_verdict"):
            lines.append(json.dumps({"id": s["id"], "sample_idx": s["sample_idx"],
                                     "reference": s["answer"], "extracted": v["extracted"],
                                     "rule": v["rule_verdict"], "judge": v["judge_verdict"],
                                     "judge_output": (v.get("judge_output") or "")[-600:]}))
    shards.atomic_write_text(path, "".join(line + "\n" for line in lines))


def _reasoning_counter(cfg: VerifyConfig, model: str) -> Any:
    from reasoner.models import load_tokenizer

    tok = load_tokenizer(cfg.tokenizer or model)
    return lambda text: len(tok(think_span(text, cfg.template), add_special_tokens=False)["input_ids"])




def run(cfg: VerifyConfig) -> Path:
    """Verify `cfg.input_dir` into `cfg.output_dir` (see the module docstring); return it.
    Verdicts are reused across runs whose verdict settings agree: a filter change re-judges
    nothing."""
    started = time.perf_counter()
    out = Path(cfg.output_dir)
    outputs.check_not_an_input(out, cfg.inputs())
    if not shards.is_complete(cfg.input_dir):
        raise ShardError(f"{cfg.input_dir} is not a complete Sample shard (its manifest does not "
                         "say complete: true); finish `reasoner infer` first")
    identity = outputs.Identity.of("verify", cfg.result_config(), cfg.inputs())
    action = outputs.decide(out, identity, cfg.overwrite)
    if action == "complete":
        print(outputs.said_complete("verify", out), file=sys.stderr)
        return out
    with outputs.writing(out, identity, action, keep=(VERDICTS,)):
        return _verify(cfg, out, identity.config, started)


def _verify(cfg: VerifyConfig, out: Path, config: dict, started: float) -> Path:
    if (shards.read_manifest(out / VERDICTS) or {}).get("config") != _verdict_key(config):
        shards.reset(out / VERDICTS, "verify verdicts", _verdict_key(config))
    samples = list(shards.iter_rows(cfg.input_dir, Sample))
    if not samples:
        raise ShardError(f"{cfg.input_dir}: no samples to verify")
    problems = {s["id"]: {"id": s["id"], "problem": s["problem"]} for s in samples}
    kept, removed = decontam.decontaminate(list(problems.values()), cfg.decontam)
    keep_ids = {p["id"] for p in kept}
    samples = [s for s in samples if s["id"] in keep_ids]
    no_reference = sorted({s["id"] for s in samples if not str(s["answer"]).strip()})
    if no_reference:  # every sample of such a problem would be judged wrong: say it now
        print(f"reasoner verify: warning: {len(no_reference)} problems have an empty reference "
              f"answer ({', '.join(no_reference[:5])}{', ...' if len(no_reference) > 5 else ''}):"
              " every sample of theirs is rewarded -1; fix the problems' answer field",
              file=sys.stderr)
    verified_at = time.perf_counter()
    newly = compute_verdicts(cfg, samples, out, cfg.progress)
    verify_seconds = time.perf_counter() - verified_at
    verdicts = {(v["id"], v["sample_idx"]): v for v in shards.iter_rows(out / VERDICTS)}
    rows, dropped = rewarded(cfg, samples, verdicts)
    verdict_counts = Counter(r["verdict"] for r in rows)
    rows, report = filters.apply(rows, cfg.filters)
    shards.reset_parts(out)
    shards.write_rows(out, (Verified.model_validate(r) for r in rows))
    pos = sum(r["reward"] > 0 for r in rows)
    counts = {
        "samples_in": len(verdicts), "problems_in": len(problems),
        "decontaminated_problems": len(removed), "dropped": dict(dropped),
        "verdicts": dict(verdict_counts), "problems": len({r["id"] for r in rows}),
        "samples": len(rows), "positives": pos, "negatives": len(rows) - pos,
        "verified_this_run": newly, "empty_references": len(no_reference),
        "samples_per_s": round(newly / verify_seconds, 1) if newly else None,
    }
    extra = {"filters": report, "decontaminated": removed[:100],
             "agreement": agreement(list(verdicts.values())),
             "seconds": round(time.perf_counter() - started, 2)}
    if cfg.mode == "both":
        _write_disagreements(out / "disagreements.jsonl", samples, verdicts)
    shards.atomic_write_text(out / "stats.json",
                             json.dumps({"counts": counts, **extra}, indent=2) + "\n")
    shards.finish(out, counts, **extra)
    return out


def _verdict_key(config: dict) -> dict:
    """The settings a verdict depends on: verdicts made under the same ones are reused."""
    from reasoner.infer import without_engine_settings  # imports torch: not at module import

    key = {k: config[k] for k in ("input_dir", "mode", "template", "timeout_s")}
    if config["extraction"] != "strict":  # keyed only when set: older strict folders stay valid
        key["extraction"] = config["extraction"]
    key["judge"] = without_engine_settings(config["judge"])  # speed never changes a verdict
    return key


def rewarded(cfg: VerifyConfig, samples: list[dict], verdicts: dict
             ) -> tuple[list[dict], Counter]:
    """Each sample with its final verdict and reward R = +1 / -1 (and its reasoning tokens),
    and the count, by verdict, of the samples dropped for an `invalid` or `timeout` verdict."""
    count = _reasoning_counter(cfg, samples[0]["model"]) if samples else None
    rows, dropped = [], Counter()
    for s in samples:
        v = verdicts[(s["id"], s["sample_idx"])]
        verdict, verifier = final_verdict(cfg.mode, v)
        if (verdict == "invalid" and cfg.invalid == "drop") or (
                verdict == "timeout" and cfg.timeout == "drop"):
            dropped[verdict] += 1
            continue
        rows.append({**s, "extracted": v["extracted"], "extracted_by": v.get("extracted_by"),
                     "verdict": verdict, "verifier": verifier,
                     "reward": 1.0 if verdict == "correct" else -1.0,
                     "judge_output": v.get("judge_output"), "rule_verdict": v.get("rule_verdict"),
                     "reasoning_tokens": count(s["response"])})
    return rows, dropped
