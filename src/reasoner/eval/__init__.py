"""`reasoner eval aime` / `eval bench`: sample k answers per problem, verify, report.

Generation goes through `reasoner infer` into `OUT/samples` and verification through `reasoner
verify` (no filters) into `OUT/verified`, so a crashed eval resumes where it stopped and never
regenerates a finished sample. The report (`report.json`, `report.md`, PNG plots) is written
from the verified rows.
"""

from __future__ import annotations

import json
from pathlib import Path

from reasoner import shards
from reasoner.config import DataConfig, EvalConfig, FilterConfig, InferConfig, VerifyConfig, dump
from reasoner.errors import DataError
from reasoner.eval import metrics, report
from reasoner.eval.benchmarks import load_problems
from reasoner.records import Problem, Verified
from reasoner.runlog import MetricsLog, check_sinks

SUMMARY_KEYS = ("problems", "k", "pass@1", "maj@k", "mean_response_tokens", "truncation_rate",
                "no_answer_rate")


def _write_problems(cfg: EvalConfig, folder: Path) -> None:
    if not cfg.data:
        raise DataError("no benchmark data: give --data FILE or data: [...] in the config")
    problems = load_problems(cfg.data)
    if not problems:
        raise DataError(f"{', '.join(d.path for d in cfg.data)}: no problems")
    config = {"data": [d.model_dump(mode="json") for d in cfg.data]}
    if shards.finished(folder, config):
        return
    shards.reset(folder, "eval problems", config)
    shards.write_rows(folder, (Problem.model_validate(p) for p in problems))
    shards.finish(folder, {"problems": len(problems)})


def run(cfg: EvalConfig) -> Path:
    """Evaluate; return the folder holding report.json / report.md / plots."""
    from reasoner import infer, verify
    from reasoner.models.load import check_model
    from reasoner.verify.rules import VerifierPool

    check_model(cfg.model.name_or_path)  # before anything is written
    check_sinks(cfg.tracking)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    _write_problems(cfg, out / "problems")
    samples = infer.run(InferConfig(
        model=cfg.model, data=DataConfig(path=str(out / "problems")), output_dir=out / "samples",
        template=cfg.template, sampling=cfg.sampling, backend=cfg.backend,
        batch_size=cfg.batch_size, max_model_len=cfg.max_model_len, vllm=cfg.vllm, ray=cfg.ray,
        overwrite=True, progress=cfg.progress))
    verified = verify.run(VerifyConfig(
        input_dir=samples, output_dir=out / "verified", mode=cfg.mode, template=cfg.template,
        extraction=cfg.extraction, workers=cfg.workers, timeout_s=cfg.timeout_s, judge=cfg.judge,
        filters=FilterConfig(truncated="negative", dedupe=False, drop_zero_variance=False),
        progress=cfg.progress))
    rows = list(shards.iter_rows(verified, Verified))
    with VerifierPool(workers=1, timeout_s=cfg.timeout_s) as pool:
        def same(a: str, b: str) -> bool:
            return pool.map([(a, b)])[0] is True

        scores = metrics.summarize(rows, same, cfg.length_buckets, cfg.bootstrap, cfg.seed)
        if cfg.extraction == "flexible":  # the same samples read strictly, for comparison
            strict = metrics.summarize(metrics.strict_only(rows), same, cfg.length_buckets,
                                       cfg.bootstrap, cfg.seed)
            scores["strict"] = {k: strict[k] for k in ("pass@1", "pass@1_ci95", "maj@k",
                                                       "no_answer_rate")}
            for p, q in zip(scores["per_problem"], strict["per_problem"], strict=True):
                p["accuracy_strict"] = q["accuracy"]
    result = {"benchmark": cfg.benchmark, "model": cfg.model.name_or_path, **scores,
              "config": dump(cfg)}
    result["plots"] = report.plots(result, rows, out)
    report.write_markdown(result, out / "report.md")
    (out / "report.json").write_text(json.dumps(result, indent=2) + "\n")
    if cfg.tracking:
        log = MetricsLog(out / "metrics.jsonl", cfg.tracking, dump(cfg), True, cfg.project,
                         cfg.run_name)
        log.summary({k: v for k, v in result.items() if k in SUMMARY_KEYS})
        log.close()
    return out
