"""Resolving a recipe: every stage's config (references to earlier stages' folders, per-round
seeds, its output folder) and its chain digest, the `repeat` block written out `rounds` times.

A value may refer to an earlier stage's folder ({sft}, {data}/test_problems), to the newest
checkpoint ({policy}) and to {run_dir}; round r > 1 writes into <name>-r<r> and shifts every
seed by 1000 x (r - 1). A stage's chain digest covers its own resolved config and those of every
stage before it: what `reasoner run` compares to decide what has to run again (run.py).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from reasoner.config import ConfigError, dump, load
from reasoner.pipeline.recipe import RecipeConfig, StageSpec
from reasoner.pipeline.registry import STAGES

_REF = re.compile(r"\{([A-Za-z0-9_.-]+)\}")


@dataclass
class StageRun:
    """One stage spec of a recipe resolved for one round: config, output folder, status."""

    name: str
    spec: StageSpec
    out: Path
    config: Any                      # the validated stage config (compare: its report folders)
    chain: str                       # digest of this config and of every stage before it
    digest: str = ""                 # digest of this stage's own command and config
    source: Path | None = None       # the recipe's config file for this stage
    overrides: list[str] = field(default_factory=list)  # key=value the recipe puts on top of it
    status: str = "run"              # skip | run | rerun | resume | keep | restore (previous.py)
    reason: str = ""
    seconds: float = 0.0
    headline: str = ""
    metrics: dict = field(default_factory=dict)

    @property
    def command(self) -> str:
        return self.spec.command

    @property
    def works(self) -> bool:
        """This invocation computes the stage (not: skipped, kept as it is, brought back)."""
        return self.status in ("run", "rerun", "resume")

    @property
    def artifact(self) -> str:
        """What to open first in this stage's folder, relative to the run folder."""
        return f"{self.name}/{STAGES[self.command].artifact}"


# --------------------------------------------------------------------------------------------
# Resolving


def _resolve_refs(value: Any, names: dict[str, str], run_dir: Path, policy: str | None,
                  where: str) -> Any:
    """Replace {stage}, {policy} and {run_dir} inside strings (recursively in lists and dicts)."""
    if isinstance(value, dict):
        return {k: _resolve_refs(v, names, run_dir, policy, where) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve_refs(v, names, run_dir, policy, where) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match) -> str:
        ref = m.group(1)
        if ref == "run_dir":
            return str(run_dir)
        if ref == "policy":
            if policy is None:
                raise ConfigError(f"{where}: {{policy}} needs an sft or train-offline stage before "
                                  "it, or the recipe's start_model")
            return policy
        if ref not in names:
            known = ", ".join(sorted(names)) or "none"
            raise ConfigError(f"{where}: {{{ref}}} names no earlier stage (earlier stages: {known})")
        return str(run_dir / names[ref])

    return _REF.sub(sub, value)


def _shift_seeds(data: Any, offset: int) -> Any:
    """Add `offset` to every `seed` key at any depth (recipe seed and per-round seeds)."""
    if isinstance(data, dict):
        return {k: (v + offset if k == "seed" and isinstance(v, int) else _shift_seeds(v, offset))
                for k, v in data.items()}
    if isinstance(data, list):
        return [_shift_seeds(v, offset) for v in data]
    return data


def _seed_paths(data: Any, prefix: str = "") -> list[tuple[str, int]]:
    if not isinstance(data, dict):
        return []
    found = []
    for k, v in data.items():
        if k == "seed" and isinstance(v, int):
            found.append((prefix + k, v))
        found += _seed_paths(v, f"{prefix}{k}.")
    return found


def _inline(value: Any) -> str:
    """A value as a YAML scalar or flow collection, as an override on the command line takes it."""
    if isinstance(value, str):
        return value
    if value is None or isinstance(value, (bool, int, float)):
        return json.dumps(value)
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()


def expand(recipe: RecipeConfig) -> list[tuple[StageSpec, int, str]]:
    """The recipe's stages in run order, the `repeat` block written out `rounds` times."""
    specs = recipe.stages
    names = [s.name for s in specs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"recipe: stage names must be unique; repeated: {', '.join(dupes)}")
    block = [i for i, s in enumerate(specs) if s.repeat]
    if block and block != list(range(block[0], block[-1] + 1)):
        raise ConfigError("recipe: the `repeat: true` stages must be consecutive")
    if recipe.rounds > 1 and not block:
        raise ConfigError("recipe: rounds > 1 needs stages marked `repeat: true`")
    out: list[tuple[StageSpec, int, str]] = []
    for i, spec in enumerate(specs):
        if block and i == block[0]:
            for r in range(1, recipe.rounds + 1):
                out += [(specs[j], r, specs[j].name if r == 1 else f"{specs[j].name}-r{r}")
                        for j in block]
        elif not spec.repeat:
            out.append((spec, 1, spec.name))
    return out


def resolve(recipe: RecipeConfig, base: Path) -> list[StageRun]:
    """Resolve every stage's config (refs, seeds, output folder) and its chain digest."""
    run_dir = Path(recipe.run_dir)
    latest: dict[str, str] = {}
    evals: list[str] = []
    policy: str | None = recipe.start_model
    chain = hashlib.sha256(b"reasoner-run").hexdigest()
    stages: list[StageRun] = []
    for spec, rnd, name in expand(recipe):
        where = f"recipe stage '{name}'"
        out = run_dir / name
        values = _resolve_refs(spec.set, latest, run_dir, policy, where)
        path, overrides = None, []
        if spec.command == "compare":
            if spec.config is not None or values:
                raise ConfigError(f"{where}: compare takes `reports:` only, no config or set")
            reports = [_resolve_refs(f"{{{r}}}" if not r.startswith("{") else r, latest, run_dir,
                                     policy, where) for r in spec.reports]
            config: Any = {"reports": reports or [str(run_dir / e) for e in evals],
                           "output_dir": str(out)}
            if len(config["reports"]) < 2:
                raise ConfigError(f"{where}: needs two eval stages before it to compare")
        else:
            path = (base / spec.config) if spec.config is not None else None
            try:
                cfg = load(STAGES[spec.command].config, path, values={**values, "output_dir": str(out)})
            except ConfigError as exc:
                raise ConfigError(f"{where}: {exc}") from None
            offset = recipe.seed + 1000 * (rnd - 1)
            config = type(cfg).model_validate(_shift_seeds(dump(cfg), offset)) if offset else cfg
            overrides = [f"{k}={_inline(v)}" for k, v in {**values, "output_dir": str(out)}.items()]
            overrides += [f"{k}={v}" for k, v in _seed_paths(dump(config)) if offset]
        digest = json.dumps({"command": spec.command,
                             "config": config if isinstance(config, dict) else dump(config)},
                            sort_keys=True, default=str)
        chain = hashlib.sha256((chain + digest).encode()).hexdigest()
        stages.append(StageRun(name, spec, out, config, chain, source=path, overrides=overrides,
                            digest=hashlib.sha256(digest.encode()).hexdigest()))
        latest[spec.name] = latest[name] = name
        if spec.command == "eval":
            evals.append(name)
        if STAGES[spec.command].checkpoint:
            policy = str(out / "final")
    _same_prompt(stages)
    return stages


PROMPT_STAGES = ("sft", "infer", "eval")  # the stages that render prompts for the model
PROMPT_FIELDS = ("system_prompt", "instruction", "use_chat_template")


def _same_prompt(stages: list[StageRun]) -> None:
    """Every stage that renders prompts renders them alike: a model sampled or evaluated with a
    prompt it was not trained on is a silent, expensive mistake."""
    first: StageRun | None = None
    for stage in stages:
        if stage.spec.command not in PROMPT_STAGES:
            continue
        if first is None:
            first = stage
            continue
        a, b = first.config.template, stage.config.template
        differ = [f for f in PROMPT_FIELDS if getattr(a, f) != getattr(b, f)]
        if differ:
            raise ConfigError(
                f"recipe stages '{first.name}' and '{stage.name}' render prompts differently "
                f"(template.{', template.'.join(differ)}: {getattr(a, differ[0])!r} vs "
                f"{getattr(b, differ[0])!r}); give every sft/infer/eval stage the same template, "
                "e.g. the same template.preset")
