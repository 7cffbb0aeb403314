"""`reasoner eval aime` / `eval bench`: sample k answers per problem, verify, report.

Generation goes through `reasoner infer` into `OUT/samples` and verification through `reasoner
verify` (no filters) into `OUT/verified`, so a crashed eval resumes where it stopped and never
regenerates a finished sample. The report (`report.json`, `report.md`, PNG plots) is written
from the verified rows.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from reasoner import outputs, shards
from reasoner.config import (
    DataConfig,
    EvalConfig,
    FilterConfig,
    InferConfig,
    TemplateConfig,
    VerifyConfig,
    dump,
)
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


PROMPT_FIELDS = ("system_prompt", "instruction", "use_chat_template")


def with_trained_template(cfg: EvalConfig) -> EvalConfig:
    """A model trained by reasoner records its prompt template (`final/reasoner.json`): an eval
    that sets none prompts as the model was trained; one that sets another is warned about
    (0% and 56% were measured on the same 50 problems with the default and the trained one).
    A trained model whose record holds no template cannot be checked: that is said too."""
    recorded = Path(cfg.model.name_or_path) / "reasoner.json"
    if not recorded.exists():
        return cfg
    record = json.loads(recorded.read_text())
    trained = record.get("template")
    if not trained:
        if "trained_by" in record:  # built or imported models record no template, and need none
            print(f"reasoner eval: warning: {recorded} records no prompt template, so this eval "
                  "cannot check that it prompts as the model was trained; set template."
                  f"{', template.'.join(PROMPT_FIELDS[:2])} as in training", file=sys.stderr)
        return cfg
    if "template" not in cfg.model_fields_set:
        print(f"reasoner eval: prompting as {cfg.model.name_or_path} was trained (the template "
              "in its reasoner.json)", file=sys.stderr)
        return cfg.model_copy(update={"template": TemplateConfig.model_validate(trained)})
    as_trained = TemplateConfig.model_validate(trained)  # a partial record: the rest as default
    differ = [f for f in PROMPT_FIELDS if getattr(cfg.template, f) != getattr(as_trained, f)]
    if differ:
        print(f"reasoner eval: warning: template.{', template.'.join(differ)} differ from what "
              f"{cfg.model.name_or_path} was trained with "
              f"({', '.join(repr(getattr(as_trained, f)) for f in differ)}); the scores measure "
              "the model on a prompt it was not trained on", file=sys.stderr)
    return cfg


def run(cfg: EvalConfig) -> Path:
    """Evaluate; return the folder holding report.json / report.md / plots. The folder's
    identity is the eval's config and inputs: its inner infer and verify are never reused
    for another eval (another model, data, k, template, ...)."""
    from reasoner.models.load import check_reachable

    check_reachable(cfg.model.name_or_path)  # before anything is written
    check_sinks(cfg.tracking)
    cfg = with_trained_template(cfg)
    out = Path(cfg.output_dir)
    outputs.check_not_an_input(out, cfg.inputs())
    identity = outputs.Identity.of("eval", cfg.result_config(), cfg.inputs())
    action = outputs.decide(out, identity, cfg.overwrite)
    if action == "complete":
        print(outputs.said_complete("eval", out), file=sys.stderr)
        return out
    with outputs.writing(out, identity, action):
        result = _evaluate(cfg, out)
        shards.finish(out, {k: v for k, v in result.items() if k in SUMMARY_KEYS})
    return out


def _evaluate(cfg: EvalConfig, out: Path) -> dict:
    """Problems, samples, verdicts and the report of one eval, in `out`."""
    from reasoner import infer, verify
    from reasoner.verify.rules import VerifierPool

    _write_problems(cfg, out / "problems")
    samples = infer.run(InferConfig(
        model=cfg.model, data=DataConfig(path=str(out / "problems")), output_dir=out / "samples",
        template=cfg.template, sampling=cfg.sampling, backend=cfg.backend,
        batch_size=cfg.batch_size, max_model_len=cfg.max_model_len, vllm=cfg.vllm, ray=cfg.ray,
        server=cfg.server, progress=cfg.progress))
    verified = verify.run(VerifyConfig(
        input_dir=samples, output_dir=out / "verified", mode=cfg.mode, template=cfg.template,
        extraction=cfg.extraction, workers=cfg.workers, timeout_s=cfg.timeout_s, judge=cfg.judge,
        filters=FilterConfig(truncated="negative", dedupe=False, drop_zero_variance=False),
        progress=cfg.progress))
    rows = list(shards.iter_rows(verified, Verified))
    edges = cfg.length_buckets or metrics.quartile_edges([r["response_tokens"] for r in rows])
    with VerifierPool(workers=1, timeout_s=cfg.timeout_s) as pool:
        def same(a: str, b: str) -> bool:
            return pool.map([(a, b)])[0] is True

        scores = metrics.summarize(rows, same, edges, cfg.bootstrap, cfg.seed)
        if cfg.extraction == "flexible":  # the same samples read strictly, for comparison
            strict = metrics.summarize(metrics.strict_only(rows), same, edges, cfg.bootstrap,
                                       cfg.seed)
            scores["strict"] = {k: strict[k] for k in ("pass@1", "pass@1_ci95", "maj@k",
                                                       "no_answer_rate")}
            for p, q in zip(scores["per_problem"], strict["per_problem"], strict=True):
                p["accuracy_strict"] = q["accuracy"]
    engine = (shards.read_manifest(samples) or {}).get("engine", {})
    result = {"benchmark": cfg.benchmark, "model": cfg.model.name_or_path, **scores,
              "generation": {**engine, "max_tokens": cfg.sampling.max_tokens,
                             "max_model_len": cfg.max_model_len,
                             "temperature": cfg.sampling.temperature},
              "config": dump(cfg)}
    result["plots"] = report.plots(result, rows, out)
    report.write_markdown(result, out / "report.md")
    (out / "report.json").write_text(json.dumps(result, indent=2) + "\n")
    if cfg.tracking:
        log = MetricsLog(out / "metrics.jsonl", cfg.tracking, dump(cfg), True, cfg.project,
                         cfg.run_name)
        log.summary({k: v for k, v in result.items() if k in SUMMARY_KEYS})
        log.close()
    return result
