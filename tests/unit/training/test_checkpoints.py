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
    assert files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    assert "lm_head.weight" not in index["weight_map"]  # tied: written once, as the embedding
    model.config.save_pretrained(tmp_path)
    again = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.tensor([[1, 5, 9, 40, 7]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, again(ids).logits)
    rows = SafetensorsSlices(tmp_path).rows("model.embed_tokens.weight", 3, 7)
    assert torch.equal(rows, model.model.embed_tokens.weight[3:7])


def test_streamed_files_hold_what_safetensors_itself_would_write(tmp_path):
    """The files are written tensor by tensor (header first, from the shapes), so rank 0 never
    holds a file's worth of gathered weights: what `safetensors` reads back is exactly what
    it would have written itself, for every dtype a checkpoint holds."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    from reasoner.device import DistInfo
    from reasoner.training.checkpoints import stream_weights

    class Mixed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            g = torch.Generator().manual_seed(0)
            self.a = torch.nn.Parameter(torch.randn(3, 5, generator=g))
            self.b = torch.nn.Parameter(torch.randn(7, generator=g).to(torch.bfloat16))
            self.c = torch.nn.Parameter(torch.randn(2, 2, 2, generator=g).to(torch.float16))
            self.d = torch.nn.Parameter(torch.randn((), generator=g).double())

    m = Mixed()
    stream_weights(tmp_path, m, DistInfo())  # one file
    got = load_file(tmp_path / "model.safetensors")
    assert set(got) == {"a", "b", "c", "d"}
    for name, p in m.named_parameters():
        assert got[name].dtype == p.dtype and torch.equal(got[name], p.detach())
    with safe_open(tmp_path / "model.safetensors", "pt") as f:
        assert f.metadata() == {"format": "pt"}
    assert not (tmp_path / "model.safetensors.index.json").exists()
