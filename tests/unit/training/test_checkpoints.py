"""Checkpoint files written without gathering a model whole."""

import json

import torch


def test_streamed_weights_split_into_files_load_back_and_read_by_rows(tmp_path, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from reasoner.device import DistInfo
    from reasoner.models.fsdp import SafetensorsSlices
    from reasoner.models.logprobs import PolicyLogprobs
    from reasoner.training.checkpoints import stream_weights

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    stream_weights(tmp_path, PolicyLogprobs(model), DistInfo(), shard_bytes=50_000)
    files = sorted(p.name for p in tmp_path.glob("*.safetensors"))
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(files) > 2 and set(index["weight_map"].values()) == set(files)
    assert "lm_head.weight" not in index["weight_map"]  # tied: written once, as the embedding
    model.config.save_pretrained(tmp_path)
    again = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.tensor([[1, 5, 9, 40, 7]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, again(ids).logits)
    rows = SafetensorsSlices(tmp_path).rows("model.embed_tokens.weight", 3, 7)
    assert torch.equal(rows, model.model.embed_tokens.weight[3:7])
