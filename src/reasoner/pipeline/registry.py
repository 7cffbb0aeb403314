"""The registry of stage kinds: for each command, its config model, its runner, what it produces.

The CLI (config models of every command) and `reasoner run` (resolving, running, the end table)
both read this one table. Adding a stage: its module with a `run(cfg)`, its config model in
config/stages.py, one entry here, its docs. Runners are named as "module:function" and imported
only when the stage runs, so `reasoner --help` never loads torch-heavy modules (a test imports
every runner named here, since a moved module would fail only when its stage runs).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from reasoner import shards
from reasoner.config import (
    EvalConfig,
    InferConfig,
    OfflineConfig,
    SFTConfig,
    SynthConfig,
    TinyConfig,
    VerifyConfig,
)


@dataclass(frozen=True)
class StageKind:
    """One kind of stage: what a recipe's `command:` names."""

    command: str  # its name in a recipe's `command:`
    config: type[BaseModel] | None  # None: the stage takes no config file (compare)
    runner: str  # "module:function" taking the validated config (compare: a dict)
    headline: Callable[[Path], tuple[str, dict]]  # the numbers worth a glance, from its folder
    cli: tuple[str, ...] = ()  # CLI commands that read this config model
    artifact: str = ""  # what to open first in its folder
    checkpoint: bool = False  # writes a model: {policy} points at its `final/` afterwards
    identified: bool = False  # its manifest records outputs.Identity (previous.py reuses it)

    def run(self, config: Any) -> Any:
        module, function = self.runner.split(":")
        return getattr(importlib.import_module(module), function)(config)


def _counts(out: Path) -> dict:
    return (shards.read_manifest(out) or {}).get("counts", {})


def _synth(out: Path) -> tuple[str, dict]:
    parts = {p.name: _counts(p) for p in sorted(out.iterdir()) if p.is_dir()}
    return ", ".join(f"{k} {next(iter(v.values()), '?')}" for k, v in parts.items()), {}


def _tiny(out: Path) -> tuple[str, dict]:
    from reasoner.models.load import describe

    params = describe(out)["parameters"]
    return f"{params:,} parameters", {"parameters": params}


def _trained(out: Path) -> tuple[str, dict]:
    c = _counts(out)
    loss = c.get("final_loss")
    return (f"{c.get('steps')} steps, final loss {loss:.4f}" if loss is not None
            else f"{c.get('steps')} steps"), c


def _infer(out: Path) -> tuple[str, dict]:
    c = _counts(out)
    return (f"{c.get('samples')} samples, {c.get('mean_response_tokens', 0):.0f} tokens mean, "
            f"{100 * c.get('truncation_rate', 0):.1f}% truncated"), c


def _verify(out: Path) -> tuple[str, dict]:
    c = _counts(out)
    return (f"{c.get('problems_in')} -> {c.get('problems')} problems, {c.get('samples')} samples "
            f"({c.get('positives')}+ / {c.get('negatives')}-)"), c


def _eval(out: Path) -> tuple[str, dict]:
    r = json.loads((out / "report.json").read_text())
    lo, hi = r["pass@1_ci95"]
    m = {"pass@1": r["pass@1"], "ci95": [lo, hi], "mean_tokens": r["mean_response_tokens"]}
    return (f"pass@1 {100 * r['pass@1']:.1f}% (CI {100 * lo:.1f}-{100 * hi:.1f}), "
            f"{r['mean_response_tokens']:.0f} tokens"), m


def _compare(out: Path) -> tuple[str, dict]:
    r = json.loads((out / "compare.json").read_text())
    last = r["runs"][-1]
    if last["diff"] is None:  # the two reports share no problem: no paired difference
        return (f"{Path(last['name']).name} vs {Path(r['runs'][0]['name']).name}: no shared "
                "problems", {"diff": None, "diff_ci95": None, "significant": False})
    lo, hi = last["diff_ci95"]
    m = {"diff": last["diff"], "diff_ci95": [lo, hi], "significant": last["significant"]}
    return (f"{Path(last['name']).name} vs {Path(r['runs'][0]['name']).name}: "
            f"{100 * last['diff']:+.1f} points (paired CI {100 * lo:+.1f} to {100 * hi:+.1f})"), m


def run_compare(config: dict) -> Path:
    """The recipe stage `compare`: every listed eval report against the first."""
    from reasoner.eval.report import compare

    out = Path(config["output_dir"])
    compare([Path(r) for r in config["reports"]], out)
    return out


STAGES: dict[str, StageKind] = {s.command: s for s in [
    StageKind("data synth", SynthConfig, "reasoner.data.synthetic:run", _synth, ("data synth",)),
    StageKind("model tiny", TinyConfig, "reasoner.models.tiny:build_tiny", _tiny, ("model tiny",)),
    StageKind("sft", SFTConfig, "reasoner.sft:run", _trained, ("sft",), "final", checkpoint=True,
              identified=True),
    StageKind("infer", InferConfig, "reasoner.infer:run", _infer, ("infer",), identified=True),
    StageKind("verify", VerifyConfig, "reasoner.verify:run", _verify, ("verify",),
              identified=True),
    StageKind("train-offline", OfflineConfig, "reasoner.train_offline:run", _trained,
             ("train-offline",), "final", checkpoint=True, identified=True),
    StageKind("eval", EvalConfig, "reasoner.eval:run", _eval, ("eval aime", "eval bench"),
             "report.md", identified=True),
    StageKind("compare", None, "reasoner.pipeline.registry:run_compare", _compare, (), "compare.md"),
]}


def command_configs() -> dict[str, type[BaseModel]]:
    """CLI command -> the config model it reads, for the commands that run one stage."""
    return {cli: s.config for s in STAGES.values() for cli in s.cli if s.config is not None}
