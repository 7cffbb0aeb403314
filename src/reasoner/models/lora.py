"""LoRA through PEFT (`model.lora`): adapters injected into the HF model in place, the base
frozen in the training dtype, and the ways a LoRA model is saved.

PEFT's `inject_adapter_in_model` wraps each targeted linear layer (`q_proj` becomes a
`lora.Linear` holding `q_proj.base_layer`, `q_proj.lora_A.<adapter>` and
`q_proj.lora_B.<adapter>`), so the model keeps its class and forward and the trainers, FSDP2
and the log-prob path see an ordinary module. Adapters start as PEFT starts them (A Kaiming-
uniform, B zero: the model starts as its base), drawn from a generator seeded per parameter
name so that one process and any number of sharded ones start from the same values.

Two adapter sets at most: `default`, the one trained, and `reference`, a moving or reset
reference (ProRL, discounted) kept as a second adapter set on the same base instead of a
second model (`AdapterView`). A fixed reference is the base itself: the starting model's
log-probs, taken before training with B = 0.

Saved (training/checkpoints.py): the HF weights merged, W + (alpha / r) B A under the base's
plain names, so `final/` is an ordinary model folder that infer and vLLM read with no PEFT;
the adapters in PEFT's own format in `adapter/` (`PeftModel.from_pretrained(base, folder)`
reads it) and the reference set in `reference-adapter/`, which only a resume reads.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from reasoner.config import LoraSettings
from reasoner.errors import DependencyError, InputError

TRAINED, REFERENCE = "default", "reference"  # the two adapter sets' names
ADAPTER_DIR, REFERENCE_DIR = "adapter", "reference-adapter"
WEIGHTS = "adapter_model.safetensors"


@dataclass(frozen=True)
class Adapters:
    """The adapters a trainer loads a model with: its settings, the sets, and where their
    values come from (a checkpoint's adapter folders, else fresh from `seed`)."""

    settings: LoraSettings
    sets: tuple[str, ...] = (TRAINED,)
    saved: Path | None = None  # a checkpoint holding adapter/ (and reference-adapter/)
    seed: int = 0

    @staticmethod
    def of(settings: LoraSettings | None, source: str | Path, seed: int,
           sets: tuple[str, ...] = (TRAINED,)) -> Adapters | None:
        """The adapters of a model loaded from `source`: a checkpoint of a LoRA run holds them
        (its base is the configured model), any other folder gets fresh ones: a LoRA run's
        `final/` too, whose weights are already merged (its `adapter/` is for PEFT users)."""
        if settings is None:
            return None
        folder = Path(source)
        resumable = (folder / ADAPTER_DIR).is_dir() and (folder / "trainer_state.pt").exists()
        saved = folder if resumable else None
        return Adapters(settings, sets, saved, seed)

    def values(self, shapes: dict[str, torch.Size]) -> dict[str, Tensor]:
        """Whole starting values of the adapter parameters (HF model name: shape): the saved
        ones, or fresh. The reference set of a checkpoint saved without one starts as the
        trained set."""
        if self.saved is None:
            return {n: initial_values(n, shape, self.seed) for n, shape in shapes.items()}
        out = read_adapter(self.saved / ADAPTER_DIR, list(shapes), TRAINED)
        ref = self.saved / REFERENCE_DIR
        if ref.is_dir():
            out.update(read_adapter(ref, list(shapes), REFERENCE))
        else:
            out.update({n: out[n.replace(f".{REFERENCE}.", f".{TRAINED}.")]
                        for n in shapes if f".{REFERENCE}." in n})
        for n, shape in shapes.items():
            if tuple(out[n].shape) != tuple(shape):
                raise InputError(f"{self.saved}: adapter {n} is {tuple(out[n].shape)}, the "
                                 f"model's is {tuple(shape)}; it was saved with another "
                                 "model.lora.r")
        return out


def is_adapter(name: str) -> bool:
    """Whether a parameter name is one of an adapter's (lora_A / lora_B of any set)."""
    return ".lora_A." in name or ".lora_B." in name


def base_name(name: str) -> str:
    """The base model's name of a wrapped layer's parameter (`q_proj.base_layer.weight` ->
    `q_proj.weight`): what a plain checkpoint calls it."""
    return name.replace(".base_layer.", ".")


def _peft() -> Any:
    try:
        import peft
    except ImportError as exc:
        raise DependencyError("model.lora needs PEFT: pip install 'reasoner[lora]'") from exc
    return peft


def linear_names(model: nn.Module) -> list[str]:
    """The last name component of every linear layer of `model` (what target_modules match)."""
    return sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules()
                   if isinstance(m, nn.Linear) and n})


def check_targets(model: nn.Module, lora: LoraSettings) -> None:
    """Refuse, before anything is built, target modules the model does not have."""
    have = set(linear_names(model))
    unknown = [t for t in lora.target_modules if t not in have]
    if unknown:
        raise InputError(f"model.lora.target_modules: {', '.join(unknown)} "
                         f"{'is' if len(unknown) == 1 else 'are'} not a linear layer of this model;"
                         f" its linear layers are {', '.join(sorted(have))}")


def check_model_targets(name_or_path: str, lora: LoraSettings | None,
                        trust_remote_code: bool = False) -> None:
    """`check_targets` before any work, on the model built from its config on the meta device
    (no weights read); PEFT is checked to be installed too."""
    if lora is None:
        return
    _peft()
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    check_targets(model, lora)


def inject(model: nn.Module, lora: LoraSettings, sets: tuple[str, ...] = (TRAINED,),
           meta: bool = False, base_dtype: torch.dtype | None = None) -> nn.Module:
    """Wrap `model`'s target layers with the adapter `sets` in place (`meta`: adapters on the
    meta device, for a model built there); freeze everything but the trained set and hold the
    frozen base in `base_dtype`. Adapters are fp32 at least, whatever the base was loaded in
    (PEFT makes them in the base's dtype: bf16 on a base read in bf16). Returns `model`."""
    peft = _peft()
    check_targets(model, lora)
    config = peft.LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                             target_modules=list(lora.target_modules), bias="none")
    for name in sets:
        peft.inject_adapter_in_model(config, model, adapter_name=name, low_cpu_mem_usage=meta)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.requires_grad_(is_adapter(name) and f".{TRAINED}." in name)
            if not p.is_floating_point():
                continue
            if is_adapter(name):
                p.data = p.data.to(torch.promote_types(p.dtype, torch.float32))
            elif base_dtype is not None:
                p.data = p.data.to(base_dtype)
    _activate(model, TRAINED)
    return model


def _lora_layers(model: nn.Module) -> Iterator[nn.Module]:
    from peft.tuners.lora import LoraLayer

    return (m for m in model.modules() if isinstance(m, LoraLayer))


def _activate(model: nn.Module, name: str) -> None:
    """Make `name` the adapter set every LoRA layer computes with. PEFT's own `set_adapter`
    also turns on the gradients of the set it activates (and off the others'), which would
    make the reference trainable; only which set computes changes here."""
    for layer in _lora_layers(model):
        layer._active_adapter = [name]


@contextmanager
def computing_with(model: nn.Module, name: str) -> Iterator[None]:
    """Compute with adapter set `name` for the block, then with the trained one again."""
    _activate(model, name)
    try:
        yield
    finally:
        _activate(model, TRAINED)


def scaling(lora: LoraSettings) -> float:
    return lora.alpha / lora.r


def initial_values(name: str, shape: torch.Size | tuple[int, ...], seed: int) -> Tensor:
    """A fresh adapter parameter as PEFT draws it (A: Kaiming-uniform with a = sqrt(5); B:
    zeros), from a generator seeded by `seed` and the name with its set removed: the same in
    every process, and the reference set starts equal to the trained one."""
    if ".lora_B." in name:
        return torch.zeros(shape)
    key = name.replace(f".{REFERENCE}.", f".{TRAINED}.")
    g = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(key.encode()))
    out = torch.empty(shape)
    nn.init.kaiming_uniform_(out, a=math.sqrt(5), generator=g)
    return out


def adapter_names(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """(name, parameter) of every adapter parameter, both sets, in module order."""
    return [(n, p) for n, p in model.named_parameters() if is_adapter(n)]


@torch.no_grad()
def initialise(model: nn.Module, adapters: Adapters) -> None:
    """Give one process's whole (unsharded) model its adapters' starting values."""
    params = adapter_names(model)
    values = adapters.values({_hf_key(n): p.shape for n, p in params})
    for name, p in params:
        p.copy_(values[_hf_key(name)].to(p.dtype))


def _hf_key(name: str) -> str:
    """A parameter's name in the HF model, without a wrapper's `model.` prefix (names inside
    a Qwen2 / Llama causal LM start with `model.` or `lm_head.` themselves)."""
    while not name.startswith(("model.layers.", "model.embed", "model.norm", "lm_head.")) \
            and name.startswith("model."):
        name = name.removeprefix("model.")
    return name


# --------------------------------------------------------------------------------------------
# Saving and reading adapters (PEFT's format)


def peft_key(name: str) -> str:
    """The key PEFT's `save_pretrained` writes for adapter parameter `name` (the set's name
    dropped: a folder holds one set)."""
    key = _hf_key(name)
    for s in (TRAINED, REFERENCE):
        key = key.replace(f".lora_A.{s}.", ".lora_A.").replace(f".lora_B.{s}.", ".lora_B.")
    return "base_model.model." + key


def save_adapter(folder: Path, tensors: dict[str, Tensor], lora: LoraSettings,
                 base: str) -> None:
    """One adapter set (`tensors`: parameter name -> whole tensor) as PEFT writes it:
    adapter_model.safetensors + adapter_config.json."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file({peft_key(n): t.detach().to("cpu", torch.float32).contiguous()
               for n, t in tensors.items()}, str(folder / WEIGHTS), metadata={"format": "pt"})
    config = _peft().LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                target_modules=list(lora.target_modules), bias="none",
                                base_model_name_or_path=base, task_type="CAUSAL_LM")
    config.save_pretrained(str(folder))


def read_adapter(folder: Path, names: list[str], set_name: str) -> dict[str, Tensor]:
    """The tensors of `folder` (PEFT's format) for the model's adapter parameters `names` of
    set `set_name`, by name; a folder that lacks one is refused."""
    from safetensors.torch import load_file

    stored = load_file(str(folder / WEIGHTS))
    out = {}
    for n in names:
        if f".{set_name}." not in n:
            continue
        key = peft_key(n)
        if key not in stored:
            raise InputError(f"{folder}: the adapter has no {key}; it was saved for another "
                             "model.lora (r or target_modules)")
        out[n] = stored[key]
    return out


def settings_of(folder: Path) -> dict:
    return json.loads((folder / "adapter_config.json").read_text())


def merged(base: Tensor, a: Tensor, b: Tensor, scale: float) -> Tensor:
    """W + scale * B A in fp32: a LoRA layer's weight as a plain linear layer holds it."""
    return base.float() + scale * (b.float() @ a.float())


class AdapterView(nn.Module):
    """A moving or reset reference that is the policy's base with the `reference` adapter set:
    called like the policy (its log-probs), moved and reset through `pairs`. The policy is
    held outside the module tree: its parameters are the policy's, saved with it."""

    def __init__(self, policy: nn.Module):
        super().__init__()
        self._held = [policy]

    @property
    def policy(self) -> nn.Module:
        return self._held[0]

    def forward(self, *args: Any) -> Tensor:
        with computing_with(self.policy, REFERENCE):
            return self.policy(*args)

    def pairs(self) -> list[tuple[nn.Parameter, nn.Parameter]]:
        """(reference parameter, trained parameter) of every adapter parameter: each process
        pairs its own shards."""
        params = dict(self.policy.named_parameters())
        return [(p, params[n.replace(f".{REFERENCE}.", f".{TRAINED}.")])
                for n, p in params.items() if is_adapter(n) and f".{REFERENCE}." in n]

    def reshard(self) -> None:
        if hasattr(self.policy, "reshard"):
            self.policy.reshard()


# --------------------------------------------------------------------------------------------
# What a checkpoint of a LoRA model holds


def config_of(hf_model: nn.Module) -> Any:
    """PEFT's LoraConfig of the trained set, or None for a model without adapters."""
    return getattr(hf_model, "peft_config", {}).get(TRAINED)


def weight_sources(names: list[str]) -> list[tuple[str, list[str]]]:
    """The plain HF weights of a model, in parameter order, and what each is computed from:
    a wrapped layer's weight from its base weight and the trained set's A and B (merged),
    every other non-adapter parameter from itself (a model without adapters: each from itself,
    under its own name)."""
    out = []
    for n in names:
        if is_adapter(n):
            continue
        if n.endswith(".base_layer.weight"):
            stem = n.removesuffix(".base_layer.weight")
            out.append((base_name(n), [n, f"{stem}.lora_A.{TRAINED}.weight",
                                       f"{stem}.lora_B.{TRAINED}.weight"]))
        else:
            out.append((base_name(n), [n]))
    return out


def combine(tensors: list[Tensor], scale: float) -> Tensor:
    """A saved weight from its sources (`weight_sources`): itself, or base + scale * B A."""
    return tensors[0] if len(tensors) == 1 else merged(tensors[0], tensors[1], tensors[2], scale)


def save_sets(folder: Path, tensors: dict[str, Tensor], config: Any) -> None:
    """Both adapter sets of a checkpoint (`tensors`: every adapter parameter, whole) in PEFT's
    format: the trained one in `adapter/`, the reference (if any) in `reference-adapter/`."""
    settings = LoraSettings(r=config.r, alpha=config.lora_alpha, dropout=config.lora_dropout,
                            target_modules=sorted(config.target_modules))
    for set_name, sub in ((TRAINED, ADAPTER_DIR), (REFERENCE, REFERENCE_DIR)):
        mine = {n: t for n, t in tensors.items() if f".{set_name}." in n}
        if mine:
            save_adapter(folder / sub, mine, settings, config.base_model_name_or_path or "")
