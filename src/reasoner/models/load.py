"""Load a causal LM + tokenizer (HF hub id or local folder), describe a saved one, and import a
GGUF file or any HF model as a plain safetensors folder (`reasoner model import`).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from reasoner import device as dev
from reasoner import hub
from reasoner.config import ModelConfig
from reasoner.errors import DependencyError, InputError


def check_reachable(name_or_path: str, key: str = "model.name_or_path") -> None:
    """Stop with one clear line when `name_or_path` is neither a local model nor a hub id that
    can be had; a stage calls it before it writes anything, so a corrected rerun just runs."""
    cached = False
    if hub.is_hub_id(name_or_path) and hub.offline():
        from huggingface_hub import try_to_load_from_cache

        cached = isinstance(try_to_load_from_cache(name_or_path, "config.json"), str)
    why = hub.missing(name_or_path, key, "model folder", cached)
    if why:
        raise InputError(why)
    path = Path(name_or_path).expanduser()
    if path.is_dir() and not (path / "config.json").exists():
        raise InputError(f"{key}={name_or_path} is not a model folder: it has no config.json"
                         + (" (it holds a .gguf file: convert it with `reasoner model import`)"
                            if any(path.glob("*.gguf")) else ""))
    if path.is_dir():
        check_whole(path, key)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
# what a stage reads of a hub model: config, weights, tokenizer, chat template, remote code
HUB_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken", "*.py"]


def fetch_once(name_or_path: str, dist: Any, device: torch.device) -> None:
    """A hub id under several processes: one process downloads its files into the hub cache
    (rank 0 when every process sees that cache, else the first process of each node), the
    others wait, then every process reads the cache offline: no 64 processes asking the hub
    for the same files (rate limits, lock contention on a shared cache). A failed download
    stops every process with its reason. A collective: every process calls it."""
    if (dist.world_size == 1 or not hub.is_hub_id(name_or_path) or hub.offline()
            or Path(name_or_path).expanduser().exists()):
        return
    from huggingface_hub import constants, snapshot_download

    shared = dev.sees_same_folder(Path(constants.HF_HUB_CACHE), dist, device)
    failed = ""
    if dist.is_main if shared else dist.local_rank == 0:
        try:
            snapshot_download(name_or_path, allow_patterns=HUB_FILES)
        except Exception as exc:  # noqa: BLE001 - any failure must reach the waiting processes
            failed = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if dev.all_reduce([float(bool(failed))], dist, device)[0]:
        raise InputError(f"model.name_or_path={name_or_path}: cannot download it ("
                         f"{failed or 'the download failed on another process'})")
    os.environ["HF_HUB_OFFLINE"] = "1"  # for what starts later (hub.offline, datasets)
    constants.HF_HUB_OFFLINE = True  # what huggingface_hub and transformers read from now on


def check_whole(folder: Path, key: str = "model.name_or_path") -> None:
    """A local model folder is whole before a stage writes anything: a tokenizer (without one
    transformers builds a one-token tokenizer and every stage fails far away from the cause)
    and weights whose safetensors headers read and whose files are as long as their headers
    say (a truncated copy), each problem naming the file."""
    if not any((folder / name).exists() for name in TOKENIZER_FILES):
        raise InputError(f"{key}={folder} has no tokenizer ({', '.join(TOKENIZER_FILES)}): copy "
                         "the tokenizer files of the model into it, or re-save it with "
                         "`reasoner model import`")
    weights = sorted(folder.glob("*.safetensors"))
    if not weights and not any(folder.glob("*.bin")):
        raise InputError(f"{key}={folder} has no weights (*.safetensors)")
    for file in weights:
        why = _safetensors_problem(file)
        if why:
            raise InputError(f"{key}={folder}: {file.name} {why}; copy it again, or re-save the "
                             "model with `reasoner model import`")


def _safetensors_problem(file: Path) -> str | None:
    """What is wrong with a safetensors file's header or length, or None."""
    import struct

    size = file.stat().st_size
    try:
        with open(file, "rb") as fh:
            (length,) = struct.unpack("<Q", fh.read(8))
            if length > size - 8:
                return f"is cut short: its header says {length} bytes, the file has {size}"
            header = json.loads(fh.read(length))
    except (struct.error, ValueError) as exc:
        return f"has no readable safetensors header ({exc})"
    end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"),
              default=0)
    if 8 + length + end > size:
        return f"is cut short: {size} bytes where its header needs {8 + length + end}"
    return None


def _from_hub(load, name_or_path: str, **kwargs: Any) -> Any:
    """`load(name_or_path, ...)`, a hub failure (no such repo, no network) as one clear line."""
    check_reachable(name_or_path)
    try:
        return load(name_or_path, **kwargs)
    except OSError as exc:
        raise InputError(f"{name_or_path}: cannot load it ({str(exc).splitlines()[0]})") from exc


def load_tokenizer(name_or_path: str, trust_remote_code: bool = False) -> Any:
    """AutoTokenizer with a pad token (eos when the model has none) and left padding for generation."""
    from transformers import AutoTokenizer

    tok = _from_hub(AutoTokenizer.from_pretrained, name_or_path,
                    trust_remote_code=trust_remote_code)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(cfg: ModelConfig, device: torch.device | None = None,
               dtype: torch.dtype | None = None) -> tuple[Any, Any]:
    """(model, tokenizer) from an HF hub id or a local folder, on `device` in the configured
    dtype (`dtype`: in this one instead). The weights are read on the host in that dtype and
    moved to the device once: what reaches the device is never wider than asked for."""
    from transformers import AutoModelForCausalLM

    device = device or dev.pick_device(cfg.device)
    dtype = dtype or dev.pick_dtype(cfg.dtype, device)
    kwargs: dict[str, Any] = {"dtype": dtype, "trust_remote_code": cfg.trust_remote_code}
    if cfg.attn_implementation:
        kwargs["attn_implementation"] = cfg.attn_implementation
    model = _from_hub(AutoModelForCausalLM.from_pretrained, cfg.name_or_path, **kwargs).to(device)
    return model, load_tokenizer(cfg.name_or_path, cfg.trust_remote_code)


def num_parameters(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())


def describe(folder: Path) -> dict[str, Any]:
    """Architecture, size and parameter count of a saved model folder, read from its JSON files."""
    config = json.loads((Path(folder) / "config.json").read_text())
    extra_path = Path(folder) / "reasoner.json"
    extra = json.loads(extra_path.read_text()) if extra_path.exists() else {}
    return {
        "architecture": (config.get("architectures") or ["?"])[0],
        "layers": config.get("num_hidden_layers"),
        "hidden_size": config.get("hidden_size"),
        "vocab_size": config.get("vocab_size"),
        "parameters": extra.get("parameters", "unknown"),
    }


# --------------------------------------------------------------------------------------------
# Import: a GGUF file or any HF model -> a plain safetensors folder every stage and vLLM load


def _gguf_source(source: str, gguf_file: str | None) -> tuple[str, str | None]:
    """(folder or hub id, GGUF file name or None) of what `reasoner model import` was given."""
    path = Path(source)
    if path.is_file():
        if path.suffix != ".gguf":
            raise InputError(f"{path}: a file to import must be .gguf (else give a model folder)")
        return str(path.parent), path.name
    if gguf_file is None and path.is_dir() and not (path / "config.json").exists():
        found = sorted(p.name for p in path.glob("*.gguf"))
        if len(found) > 1:
            raise InputError(f"{path} holds several GGUF files ({', '.join(found)}); name one "
                             "with --gguf-file")
        if not found:
            raise InputError(f"{path} is neither a model folder (no config.json) nor holds a "
                             ".gguf file")
        return str(path), found[0]
    return source, gguf_file


def import_model(source: str, output_dir: Path, gguf_file: str | None = None,
                 dtype: str = "auto", overwrite: bool = False,
                 trust_remote_code: bool = False) -> dict[str, Any]:
    """Write `source` (a .gguf file, a folder, or an HF id) as model.safetensors + config +
    tokenizer (chat template included) + a generation config that stops at the end of turn.

    GGUF weights are dequantized by transformers (the `gguf` package) into an fp32 model that
    is still marked as GGUF-quantized, which `save_pretrained` refuses; the weights are moved
    into an unmarked model of the same config. The folder is checked by loading it back and
    comparing logits with the loaded model, then moved into place.
    """
    from transformers import GenerationConfig

    from reasoner.data.template import stop_token_ids

    out = Path(output_dir)
    from reasoner import outputs

    outputs.check_is_folder(out)
    outputs.check_model_folder(out, "model import")  # the folder is replaced whole
    why = hub.missing(source, "SOURCE", "file or folder")
    if why:
        raise InputError(why)
    if (out / "config.json").exists() and not overwrite:
        raise InputError(f"{out} already holds a model; pass --overwrite to replace it")
    where, gguf = _gguf_source(source, gguf_file)
    tokenizer, model = _load_for_import(source, where, gguf, dtype, trust_remote_code)
    stops = stop_token_ids(tokenizer)
    model.generation_config = GenerationConfig.from_dict({
        **model.generation_config.to_dict(), "eos_token_id": stops,
        "pad_token_id": tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stops[0]})
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    info = {"imported_from": source, "gguf_file": gguf, "parameters": num_parameters(model),
            "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
            "stop_token_ids": stops}
    (tmp / "reasoner.json").write_text(json.dumps({"built_by": "reasoner model import", **info},
                                                  indent=2))
    _check_saved(tmp, model, tokenizer)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return {"folder": out, **info}


def _load_for_import(source: str, where: str, gguf: str | None, dtype: str,
                     trust_remote_code: bool) -> tuple[Any, Any]:
    """(tokenizer, model) of what `import_model` reads, as a plain (unquantized) model in eval
    mode: GGUF weights dequantized by transformers are moved into an unmarked model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code}
    if gguf:
        kwargs["gguf_file"] = gguf
        try:
            import gguf as _  # noqa: F401
        except ImportError as exc:
            raise DependencyError("importing a GGUF file needs the gguf package: "
                                  "pip install 'reasoner[gguf]'") from exc
    try:
        tokenizer = AutoTokenizer.from_pretrained(where, **kwargs)
        torch_dtype = torch.float32 if gguf and dtype == "auto" else (
            "auto" if dtype == "auto" else getattr(torch, dtype))
        model = AutoModelForCausalLM.from_pretrained(where, dtype=torch_dtype, **kwargs)
    except (OSError, ValueError) as exc:
        raise InputError(f"{source}: cannot load it as a causal LM ({exc})") from exc
    if getattr(model, "hf_quantizer", None) is not None or model.config.to_dict().get(
            "quantization_config"):
        config = model.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        plain = AutoModelForCausalLM.from_config(config, dtype=next(model.parameters()).dtype,
                                                 trust_remote_code=trust_remote_code)
        plain.load_state_dict(model.state_dict())
        plain.generation_config = model.generation_config
        model = plain
    return tokenizer, model.eval()


def _check_saved(folder: Path, model: Any, tokenizer: Any) -> None:
    """The saved folder, loaded back, gives the loaded model's logits exactly."""
    from transformers import AutoModelForCausalLM

    probe = tokenizer("1 + 1 = 2", return_tensors="pt", add_special_tokens=False)["input_ids"]
    again = AutoModelForCausalLM.from_pretrained(folder, dtype="auto").eval()
    with torch.no_grad():
        if not torch.equal(model(probe).logits, again(probe).logits):
            raise InputError(f"{folder}: the saved model does not reproduce the loaded one's "
                             "logits")
