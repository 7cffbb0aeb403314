"""Load a causal LM + tokenizer (HF hub id or local folder); build tiny ones from scratch.

The tiny model is an ordinary Qwen2 checkpoint (config.json, model.safetensors,
generation_config.json) with a byte-level BPE tokenizer trained by `tokenizers`, ChatML special
tokens and a chat template, so AutoModelForCausalLM, AutoTokenizer and vLLM load it like any
other Qwen2 folder. Tests and the CPU quickstart use it; nothing is downloaded.
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from reasoner import device as dev
from reasoner.config import ModelConfig, TemplateConfig, TinyConfig, TinyModelConfig
from reasoner.errors import DataError, DependencyError, InputError

PAD, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"

# ChatML, as Qwen2.5 uses it, without Qwen's default system prompt.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def load_tokenizer(name_or_path: str, trust_remote_code: bool = False) -> Any:
    """AutoTokenizer with a pad token (eos when the model has none) and left padding for generation."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(cfg: ModelConfig, device: torch.device | None = None) -> tuple[Any, Any]:
    """(model, tokenizer) from an HF hub id or a local folder, on `device` in the configured dtype."""
    from transformers import AutoModelForCausalLM

    device = device or dev.pick_device(cfg.device)
    dtype = dev.pick_dtype(cfg.dtype, device)
    kwargs: dict[str, Any] = {"dtype": dtype, "trust_remote_code": cfg.trust_remote_code}
    if cfg.attn_implementation:
        kwargs["attn_implementation"] = cfg.attn_implementation
    path = Path(cfg.name_or_path)
    if path.exists() and not (path / "config.json").exists():
        raise InputError(f"{path} is not a model folder: it has no config.json")
    model = AutoModelForCausalLM.from_pretrained(cfg.name_or_path, **kwargs).to(device)
    return model, load_tokenizer(cfg.name_or_path, cfg.trust_remote_code)


# --------------------------------------------------------------------------------------------
# Tiny model and tokenizer from scratch


def default_corpus(n: int = 3000, seed: int = 0) -> list[str]:
    """Synthetic problems and worked solutions: text for a tokenizer when no corpus is given."""
    from reasoner.config import SynthConfig
    from reasoner.data import synthetic

    cfg = SynthConfig(output_dir=Path("unused"), seed=seed, num_train=n, num_test=1)
    train, _ = synthetic.generate(cfg)
    texts = []
    for p in train:
        lines, _ = synthetic.solution_lines(p)
        texts += [synthetic.problem_text(p), "\n".join(lines)]
    return texts


def build_tokenizer(texts: Iterable[str], vocab_size: int, template: TemplateConfig) -> Any:
    """Byte-level BPE trained on `texts`: any string round-trips, frequent ones are short.

    ChatML tokens are special; the think/answer tags are single ordinary tokens, so they are
    cheap to generate and survive decoding with skip_special_tokens.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # Digits are split one by one (as Qwen2 does) so that arithmetic is learnable digit-wise.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    specials = [PAD, IM_START, IM_END]
    tags = [template.think_open, template.think_close, template.answer_open, template.answer_close]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(tags), special_tokens=specials, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer)
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in tags])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=IM_END, pad_token=PAD, chat_template=CHAT_TEMPLATE,
        additional_special_tokens=[IM_START], clean_up_tokenization_spaces=False,
        model_max_length=1 << 30,
    )


def build_model(shape: TinyModelConfig, tokenizer: Any) -> Any:
    """A randomly initialised Qwen2ForCausalLM sized by `shape`, ids matching `tokenizer`."""
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(shape.seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        intermediate_size=shape.intermediate_size,
        max_position_embeddings=shape.max_position_embeddings,
        rope_theta=shape.rope_theta,
        tie_word_embeddings=shape.tie_word_embeddings,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    model = Qwen2ForCausalLM(config)
    model.generation_config = generation_config(tokenizer)
    assert isinstance(model.generation_config, GenerationConfig)
    return model


def generation_config(tokenizer: Any) -> Any:
    """Stop on end-of-turn and end-of-text, pad with the pad token (what vLLM reads too)."""
    from transformers import GenerationConfig

    eos = [tokenizer.eos_token_id]
    pad_id = tokenizer.convert_tokens_to_ids(PAD)
    if isinstance(pad_id, int) and pad_id not in eos and pad_id != tokenizer.unk_token_id:
        eos.append(pad_id)
    return GenerationConfig(eos_token_id=eos, pad_token_id=tokenizer.pad_token_id)


def _corpus_texts(paths: list[Path]) -> Iterator[str]:
    from reasoner import shards

    for path in paths:
        rows = shards.iter_rows(path) if Path(path).is_dir() else shards.iter_file(path)
        for row in rows:
            for key in ("problem", "prompt", "response", "answer"):
                if isinstance(row.get(key), str):
                    yield row[key]
            for message in row.get("messages") or []:
                yield message["content"]


def build_tiny(cfg: TinyConfig) -> Path:
    """`reasoner model tiny`: write a tiny Qwen2 model + tokenizer as an ordinary HF folder."""
    out = Path(cfg.output_dir)
    if (out / "config.json").exists() and not cfg.overwrite:
        raise InputError(f"{out} already holds a model; pass overwrite=true to replace it")
    texts = list(_corpus_texts(cfg.corpus)) if cfg.corpus else default_corpus(seed=cfg.model.seed)
    if not texts:
        raise DataError(f"the corpus {', '.join(map(str, cfg.corpus))} holds no text")
    random.Random(cfg.model.seed).shuffle(texts)
    from reasoner.data.template import instruction, render_response

    texts += [instruction(cfg.template), render_response("1 + 1 = 2", "2", cfg.template)]
    tokenizer = build_tokenizer(texts, cfg.model.vocab_size, cfg.template)
    model = build_model(cfg.model, tokenizer)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "reasoner.json").write_text(json.dumps({
        "built_by": "reasoner model tiny", "parameters": num_parameters(model),
        "config": cfg.model_dump(mode="json"),
    }, indent=2))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


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
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from reasoner.data.template import stop_token_ids

    out = Path(output_dir)
    if (out / "config.json").exists() and not overwrite:
        raise InputError(f"{out} already holds a model; pass --overwrite to replace it")
    where, gguf = _gguf_source(source, gguf_file)
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
    model.eval()
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
    probe = tokenizer("1 + 1 = 2", return_tensors="pt", add_special_tokens=False)["input_ids"]
    again = AutoModelForCausalLM.from_pretrained(tmp, dtype="auto").eval()
    with torch.no_grad():
        if not torch.equal(model(probe).logits, again(probe).logits):
            raise InputError(f"{tmp}: the saved model does not reproduce the loaded one's logits")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return {"folder": out, **info}
