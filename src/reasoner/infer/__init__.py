"""`reasoner infer`: n candidate answers per problem, written as a resumable Sample shard.

Every sample has a key (id, sample_idx) and a seed derived from (run seed, id, sample_idx).
`--shard i --num-shards n` gives worker i every n-th problem; each worker writes its own part
of one folder, skips keys already written (resume), and the folder is marked complete only
when every key of every shard is present.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from reasoner import outputs, shards
from reasoner.config import InferConfig, ModelConfig, RayConfig, ServerConfig, VLLMConfig
from reasoner.config.generation import SERVER_TRANSPORT
from reasoner.data import sources
from reasoner.data.template import render_prompt
from reasoner.errors import DataError
from reasoner.infer.base import Completion, Generator, Request, sample_seed
from reasoner.infer.engines import local_generator
from reasoner.records import Problem, Sample
from reasoner.runlog import progress_bar


def make_generator(model: ModelConfig, backend: str, engine: VLLMConfig,
                   max_model_len: int | None = None, seed: int = 0, logprobs: bool = False,
                   batch_size: int = 64, ray: RayConfig | None = None,
                   server: ServerConfig | None = None) -> Generator:
    """A generator for `model` on `backend` (auto resolved where the engine runs); infer, eval
    and the judge each build theirs from their own config. With `ray.workers`, the engines live
    on Ray actors and this is the driver's handle to them; with backend openai, the model is
    a server's (`server`)."""
    if backend == "openai":
        from reasoner.infer.server import ServerGenerator

        return ServerGenerator(model, server or ServerConfig(), max_model_len, logprobs)
    if ray is not None and ray.workers > 0:
        from reasoner.infer.raygen import RayGenerator

        return RayGenerator(ray, model, backend, engine, max_model_len, seed, logprobs, batch_size)
    return local_generator(model, backend, engine, max_model_len, seed, logprobs, batch_size)


def load_problems(cfg: InferConfig) -> list[dict]:
    rows = sources.read_rows(cfg.data, Problem)
    if not rows:
        raise DataError(f"{cfg.data.path}: no problems to generate for")
    dupes = [k for k, v in Counter(r["id"] for r in rows).items() if v > 1]
    if dupes:
        raise DataError(f"{cfg.data.path}: duplicate problem ids {dupes[:5]} "
                         f"({len(dupes)} in all); ids must be unique")
    return rows


# settings that change how fast and where samples are drawn, never which ones
# Settings that change how fast results come, or which worker writes them, never which results:
# not part of a folder's identity.
ENGINE_SETTINGS = ("batch_size", "vllm", "ray", "progress", "shard", "num_shards")


def without_engine_settings(config: dict) -> dict:
    """A dumped infer / judge config without its ENGINE_SETTINGS (and how its server is
    reached): what decides the results."""
    kept = {k: v for k, v in config.items() if k not in ENGINE_SETTINGS}
    if isinstance(kept.get("server"), dict):
        kept["server"] = {k: v for k, v in kept["server"].items() if k not in SERVER_TRANSPORT}
    return kept


def run(cfg: InferConfig) -> Path:
    """Generate this worker's samples (`cfg.shard` of `cfg.num_shards`) into `cfg.output_dir`;
    return the folder. Each worker holds the lock of its own part for the whole run."""
    from reasoner.models.load import check_reachable

    out = Path(cfg.output_dir)
    outputs.check_not_an_input(out, cfg.inputs())
    problems = load_problems(cfg)
    identity = outputs.Identity.of("infer", cfg.result_config(), cfg.inputs())
    action = outputs.decide(out, identity, cfg.overwrite)
    if action == "complete":
        print(outputs.said_complete("infer", out), file=sys.stderr)
        return out
    check_reachable(cfg.model.name_or_path)  # before the folder is claimed: a rerun just runs
    # overwrite=true with several workers: each redoes its own part, never another's
    own_part = (shards.part_path(out, cfg.shard).name,) if cfg.num_shards > 1 else None
    with outputs.writing(out, identity, action, lock=f"writer-{cfg.shard}", mine=own_part):
        mine = problems[cfg.shard::cfg.num_shards]
        done = shards.present_keys(out, Sample)
        todo = [(p, k) for p in mine for k in range(cfg.sampling.n) if (p["id"], k) not in done]
        stats = {"generated": 0, "tokens": 0, "prompt_too_long": 0}
        started = time.perf_counter()
        if todo:
            gen = make_generator(cfg.model, cfg.backend, cfg.vllm, cfg.max_model_len,
                                 cfg.sampling.seed, cfg.sampling.logprobs, cfg.batch_size, cfg.ray,
                                 cfg.server)
            stats["load_seconds"] = time.perf_counter() - started  # model load / engine start
            started = time.perf_counter()
            try:
                shards.update_manifest(out, engine=gen.engine_info())  # what a report names
                _generate(cfg, gen, todo, out, stats)
            finally:
                gen.close()
        stats["seconds"] = time.perf_counter() - started  # generation alone
        _finish_if_complete(out, problems, cfg.sampling.n, stats)
    return out


def _generate(cfg: InferConfig, gen: Generator, todo: list[tuple[dict, int]], out: Path,
              stats: dict) -> None:
    """Every sample of `todo` into this shard's part, each written as soon as it is finished
    (the backend streams them), so a crash loses only the samples still being decoded."""

    tok = gen.tokenizer
    window = cfg.max_model_len or gen.context_window
    prompts: dict[str, tuple[str, list[int]]] = {}
    requests, rows = [], []
    began = time.perf_counter()
    with shards.PartWriter(out, cfg.shard) as writer, progress_bar(cfg.progress) as bar:
        task = bar.add_task("infer", total=len(todo), info="")
        for problem, k in todo:
            if problem["id"] not in prompts:
                text = render_prompt(problem["problem"], cfg.template, tok)
                prompts[problem["id"]] = (text, tok(text, add_special_tokens=False)["input_ids"])
            text, ids = prompts[problem["id"]]
            room = window - len(ids)
            seed = sample_seed(cfg.sampling.seed, problem["id"], k)
            if room < 1:  # recorded and counted, never a crash of the whole run
                writer.write(_row(cfg, problem, k, text, ids, seed, None, "prompt_too_long"))
                stats["prompt_too_long"] += 1
                stats["generated"] += 1
                bar.update(task, advance=1)
                continue
            requests.append(Request(problem["id"], k, ids, seed, min(cfg.sampling.max_tokens, room)))
            rows.append((problem, k, text, ids, seed))
        for i, completion in gen.stream(requests, cfg.sampling):
            row = _row(cfg, *rows[i], completion)
            writer.write(row)
            stats["generated"] += 1
            stats["tokens"] += row.response_tokens
            rate = stats["tokens"] / max(time.perf_counter() - began, 1e-9)
            bar.update(task, advance=1, info=f"{rate:,.0f} tok/s")


def _row(cfg: InferConfig, problem: dict, k: int, prompt: str, ids: list[int], seed: int,
         c: Completion | None, error: str | None = None) -> Sample:
    extra: dict[str, Any] = {}
    if c is None:
        c = Completion([], "", "length", [] if cfg.sampling.logprobs else None)
        extra["error"] = error
    return Sample(
        id=problem["id"], sample_idx=k, problem=problem["problem"], answer=problem["answer"],
        prompt=prompt, response=c.text, prompt_tokens=len(ids), response_tokens=len(c.token_ids),
        finish_reason=c.finish_reason, seed=seed, model=cfg.model.name_or_path,
        token_ids=c.token_ids if cfg.sampling.logprobs else None,
        logprobs=c.logprobs if cfg.sampling.logprobs else None, **extra,
    )


def _finish_if_complete(out: Path, problems: list[dict], n: int, stats: dict) -> None:
    """Mark the folder complete once every key of every shard is present (any worker may).
    One pass over the samples, one at a time: what is kept is their keys and running sums
    (at the recipe's scale the samples themselves are tens of GB)."""
    seen = Tally()
    for row in shards.iter_rows(out, Sample):
        seen.add(row)
    if seen.duplicates:
        raise shards.ShardError(f"{out}: duplicate samples found; delete the folder and rerun")
    if seen.keys != {(p["id"], k) for p in problems for k in range(n)}:
        shards.update_manifest(out, counts={"samples": seen.samples, "expected": len(problems) * n})
        return
    shards.finish(out, {"problems": len(problems), **seen.counts()},
                  last_run={k: round(v, 3) if isinstance(v, float) else v for k, v in stats.items()})


class Tally:
    """What the manifest says of a folder's samples, summed one sample at a time."""

    def __init__(self) -> None:
        self.keys: set[tuple[str, int]] = set()
        self.duplicates = self.samples = self.tokens = self.longest = 0
        self.truncated = self.prompt_too_long = 0
        self.nll, self.scored, self.all_scored = 0.0, 0, True

    def add(self, row: dict) -> None:
        key = (row["id"], row["sample_idx"])
        self.duplicates += key in self.keys
        self.keys.add(key)
        self.samples += 1
        self.tokens += row["response_tokens"]
        self.longest = max(self.longest, row["response_tokens"])
        self.truncated += row["finish_reason"] == "length"
        self.prompt_too_long += row.get("error") == "prompt_too_long"
        lp = row.get("logprobs")
        if lp is None:
            self.all_scored = False
        else:
            self.nll -= sum(lp)
            self.scored += len(lp)

    def counts(self) -> dict:
        """{"token_entropy": mean -log p over every sampled token} is there when every sample
        carries its log-probs: a Monte Carlo estimate of the sampling distribution's entropy per
        token (after temperature, top-k and top-p), the number ProRL watches for collapse."""
        out = {"samples": self.samples, "mean_response_tokens": self.tokens / self.samples,
               "max_response_tokens": self.longest, "truncation_rate": self.truncated / self.samples,
               "prompt_too_long": self.prompt_too_long}
        if self.all_scored and self.scored:
            out["token_entropy"] = self.nll / self.scored
        return out
