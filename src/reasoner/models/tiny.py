"""Tiny models and tokenizers from scratch (`reasoner model tiny`): tests and the CPU quickstart.

The tiny model is an ordinary Qwen2 checkpoint (config.json, model.safetensors,
generation_config.json) with a byte-level BPE tokenizer trained by `tokenizers`, ChatML special
tokens and a chat template, so AutoModelForCausalLM, AutoTokenizer and vLLM load it like any
other Qwen2 folder. Nothing is downloaded.
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from reasoner.config import TemplateConfig, TinyConfig, TinyModelConfig
from reasoner.errors import DataError, InputError
from reasoner.models.load import num_parameters

PAD, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"

# ChatML, as Qwen2.5 uses it, without Qwen's default system prompt.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


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
    from reasoner import outputs

    outputs.check_is_folder(out)
    outputs.check_model_folder(out, "model tiny")  # the folder is replaced whole below
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
