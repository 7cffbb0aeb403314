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


def _fake_checkpoint(tmp_path, tiny_model_dir, shard_bytes):
    """A checkpoint folder as a multi-process save leaves it: fp32 weights in several files with
    an index, config and tokenizer, plus what only a resume reads."""
    import shutil

    from transformers import AutoModelForCausalLM

    from reasoner.device import DistInfo
    from reasoner.models.logprobs import PolicyLogprobs
    from reasoner.training.checkpoints import stream_weights

    ckpt = tmp_path / "out" / "checkpoint-3"
    ckpt.mkdir(parents=True)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    stream_weights(ckpt, PolicyLogprobs(model), DistInfo(), shard_bytes=shard_bytes)
    for f in tiny_model_dir.iterdir():
        if not f.name.endswith(".safetensors"):
            shutil.copy2(f, ckpt / f.name)
    (ckpt / "aux").mkdir()
    (ckpt / "aux" / "__0_0.distcp").write_bytes(b"token RM and its AdamW state")
    (ckpt / "optimizer").mkdir()
    (ckpt / "trainer_state.pt").write_bytes(b"step 3")
    (ckpt / "trainer_state.json").write_text("{}")
    return ckpt, model


def test_final_holds_what_inference_reads_in_the_save_dtype(tmp_path, tiny_model_dir):
    """`final/` leaves out the auxiliary models, optimiser and trainer state; its weights are
    bf16 (the header says so, the values are the fp32 masters rounded), config.json says
    bfloat16, and the unchanged files are hard links into the checkpoint, not copies."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from reasoner.device import DistInfo
    from reasoner.training.final import publish_final

    ckpt, model = _fake_checkpoint(tmp_path, tiny_model_dir, 50_000)
    final = publish_final(tmp_path / "out", ckpt, torch.bfloat16, DistInfo())
    assert final == tmp_path / "out" / "final" and not (tmp_path / "out" / ".final.tmp").exists()
    names = {p.name for p in final.iterdir()}
    assert not names & {"aux", "optimizer", "trainer_state.pt", "trainer_state.json"}
    weights = sorted(final.glob("*.safetensors"))
    assert len(weights) > 2 and {p.name for p in weights} == {p.name for p in ckpt.glob("*.safetensors")}
    for f in weights:
        with safe_open(f, "pt") as st:
            assert {st.get_slice(k).get_dtype() for k in st.keys()} == {"BF16"}
        assert f.stat().st_ino != (ckpt / f.name).stat().st_ino
    assert json.loads((final / "config.json").read_text())["dtype"] == "bfloat16"
    for name in ("tokenizer.json", "generation_config.json"):
        assert (final / name).stat().st_ino == (ckpt / name).stat().st_ino  # linked
    index = json.loads((final / "model.safetensors.index.json").read_text())
    fp32_total = json.loads((ckpt / "model.safetensors.index.json").read_text())["metadata"]["total_size"]
    assert index["metadata"]["total_size"] == fp32_total // 2
    again = AutoModelForCausalLM.from_pretrained(final)
    assert again.dtype == torch.bfloat16
    for name, p in again.state_dict().items():
        assert torch.equal(p, model.state_dict()[name].to(torch.bfloat16)), name


def test_an_fp32_final_is_the_checkpoint_linked_and_republishing_replaces_it(tmp_path,
                                                                           tiny_model_dir):
    """fp32 (the CPU default): every file is a link to the checkpoint's (no bytes written), so
    `final/` is byte-identical to it; publishing again replaces the folder whole."""
    from reasoner.device import DistInfo
    from reasoner.training.final import publish_final

    ckpt, _ = _fake_checkpoint(tmp_path, tiny_model_dir, 10**9)
    (tmp_path / "out" / "final").mkdir()
    (tmp_path / "out" / "final" / "stale.bin").write_text("from an earlier run")
    final = publish_final(tmp_path / "out", ckpt, torch.float32, DistInfo())
    kept = sorted(p.name for p in ckpt.iterdir() if p.name not in
                  {"aux", "optimizer", "trainer_state.pt", "trainer_state.json"})
    assert sorted(p.name for p in final.iterdir()) == kept
    assert all((final / n).stat().st_ino == (ckpt / n).stat().st_ino for n in kept)


def test_a_full_disk_while_the_trainer_state_is_written_is_an_os_error(tmp_path):
    """torch.save given a path says a full disk as a RuntimeError ("unexpected pos ..."); given
    a Python file, as the OSError the CLI says in one paragraph (issue 51, 7)."""
    import errno
    from pathlib import Path

    import pytest

    from reasoner.training.checkpoints import _finish_checkpoint

    if not Path("/dev/full").is_char_device():
        pytest.skip("no /dev/full here: it stands in for a full disk")
    tmp = tmp_path / ".checkpoint-1.tmp"
    tmp.mkdir()
    (tmp / "trainer_state.pt").symlink_to("/dev/full")
    params = [torch.nn.Parameter(torch.zeros(1000))]
    scheduler = torch.optim.lr_scheduler.LambdaLR(torch.optim.SGD(params, lr=0.1), lambda _: 1)
    with pytest.raises(OSError) as err:
        _finish_checkpoint(tmp, tmp_path / "checkpoint-1", tmp_path, {"state": params[0]},
                           scheduler, 1, {}, keep_last=2)
    assert err.value.errno == errno.ENOSPC
    assert not (tmp_path / "checkpoint-1").exists()  # never renamed into place
