import json

import torch

from reasoner import models
from reasoner.config import TemplateConfig
from reasoner.data.template import instruction, render_prompt, render_sft, sft_messages
from reasoner.models import tiny
from reasoner.shards import iter_rows


def test_tiny_folder_loads_back_with_auto_classes_and_same_logits(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2ForCausalLM

    files = {p.name for p in tiny_model_dir.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json"} <= files
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    again = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    assert isinstance(model, Qwen2ForCausalLM)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = tok("Mia has 3 apples. <think>\n3 + 4 = 7\n</think>", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert torch.equal(model(ids).logits, again(ids).logits)
    assert model.config.vocab_size == len(tok)


def test_saved_weights_equal_built_weights(tmp_path, tiny_shape):
    from transformers import AutoModelForCausalLM

    tok = tiny.build_tokenizer(["a b c 1 2 3"] * 10, 300, TemplateConfig())
    built = tiny.build_model(tiny_shape, tok).eval()
    built.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.tensor([[1, 5, 9, 40, 7]])
    with torch.no_grad():
        assert torch.equal(built(ids).logits, loaded(ids).logits)


def test_generation_config_stops_on_end_of_turn(tiny_model_dir):
    gen = json.loads((tiny_model_dir / "generation_config.json").read_text())
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert tok.eos_token == "<|im_end|>"
    assert tok.convert_tokens_to_ids("<|im_end|>") in gen["eos_token_id"]
    assert gen["pad_token_id"] == tok.pad_token_id != tok.eos_token_id


def test_tokenizer_roundtrips_every_synthetic_text(tiny_model_dir, synth_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    texts = []
    for row in iter_rows(synth_dir / "sft"):
        texts += [row["prompt"], row["response"]]
    for row in iter_rows(synth_dir / "test_problems"):
        texts += [row["problem"], row["answer"]]
    texts += ["  spaces  and\ttabs\n\nünïcödé ∑ 😀 \\frac{1}{2}"]  # outside the training corpus
    for text in texts:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == text
    tags = ["<think>", "</think>", "<answer>", "</answer>"]
    assert all(len(tok(t, add_special_tokens=False)["input_ids"]) == 1 for t in tags)


def test_chat_template_renders_what_the_template_module_expects(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    t = TemplateConfig(system_prompt="You are careful.")
    prompt = render_prompt("Mia has 3 apples.", t, tok)
    expected_user = "Mia has 3 apples.\n" + instruction(t)
    assert prompt == (
        "<|im_start|>system\nYou are careful.<|im_end|>\n"
        f"<|im_start|>user\n{expected_user}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    # SFT split: prompt + response is exactly the full conversation the chat template renders.
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "<think>x</think>"}]
    p, r = render_sft({"messages": messages}, t, tok)
    full = tok.apply_chat_template(sft_messages({"messages": messages}, t), tokenize=False)
    assert full == p + r + "\n" and r.endswith("<|im_end|>")


def test_default_corpus_is_synthetic_text():
    texts = tiny.default_corpus(n=20)
    assert len(texts) == 40 and "How many" in texts[0] and " = " in texts[1]


def test_import_writes_a_plain_folder_that_stops_on_the_end_of_turn(tmp_path, tiny_model_dir):
    import pytest
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from reasoner.errors import InputError

    info = models.import_model(str(tiny_model_dir), tmp_path / "copy")
    out = info["folder"]
    assert json.loads((out / "config.json").read_text()).get("quantization_config") is None
    tok = AutoTokenizer.from_pretrained(out)
    gen = json.loads((out / "generation_config.json").read_text())
    assert tok.convert_tokens_to_ids("<|im_end|>") in gen["eos_token_id"]
    ids = torch.tensor([[1, 5, 9, 40, 7]])
    with torch.no_grad():
        a = AutoModelForCausalLM.from_pretrained(tiny_model_dir)(ids).logits
        b = AutoModelForCausalLM.from_pretrained(out)(ids).logits
    assert torch.equal(a, b)
    with pytest.raises(InputError, match="already holds a model"):
        models.import_model(str(tiny_model_dir), out)
    (tmp_path / "w.bin").write_text("x")
    with pytest.raises(InputError, match="must be .gguf"):
        models.import_model(str(tmp_path / "w.bin"), tmp_path / "o")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="neither a model folder"):
        models.import_model(str(tmp_path / "empty"), tmp_path / "o")
