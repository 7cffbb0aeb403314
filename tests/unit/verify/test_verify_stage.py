import pytest
from tests_helpers import quiet

from reasoner import infer, shards, verify
from reasoner.config import InferConfig, VerifyConfig


@pytest.fixture(scope="module")
def samples(tmp_path_factory, synth_dir, tiny_model_dir):
    out = tmp_path_factory.mktemp("samples")
    return infer.run(quiet(InferConfig.model_validate({
        "model": {"name_or_path": str(tiny_model_dir)},
        "data": {"path": str(synth_dir / "test_problems"), "limit": 4},
        "output_dir": str(out), "backend": "hf", "sampling": {"n": 3, "max_tokens": 10}})))


def cfg(samples, out, **kw):
    return VerifyConfig.model_validate({"input_dir": str(samples), "output_dir": str(out),
                                        "mode": "rule", "workers": 1, **kw})


def test_resume_does_not_reverify_finished_samples(tmp_path, samples):
    out = tmp_path / "v"
    rows = list(shards.iter_rows(samples))
    # a first run was killed after verifying two samples (planted verdicts a fresh check would
    # not give: the tiny random model never answers correctly)
    verify.run(quiet(cfg(samples, out, filters={"drop_zero_variance": False})))
    folder = out / verify.VERDICTS
    shards.reset_parts(folder)
    planted = [{"id": r["id"], "sample_idx": r["sample_idx"], "extracted": r["answer"],
                "rule_verdict": "correct"} for r in rows[:2]]
    shards.write_rows(folder, planted)
    shards.update_manifest(out, complete=False)
    verify.run(quiet(cfg(samples, out, filters={"drop_zero_variance": False})))
    got = {(r["id"], r["sample_idx"]): r for r in shards.iter_rows(out)}
    assert len(got) == 12
    verdicts = {(v["id"], v["sample_idx"]): v for v in shards.iter_rows(folder)}
    assert len(list(shards.iter_rows(folder))) == len(verdicts) == 12  # nothing verified twice
    for p in planted:
        key = (p["id"], p["sample_idx"])
        assert verdicts[key]["rule_verdict"] == "correct"  # kept, not recomputed
        assert got[key]["extracted"] == p["extracted"]
        # a planted 'correct' that was cut at max_tokens is no finished answer: the truncation
        # filter makes it a negative; one that stopped keeps its verdict
        expected = ("correct", 1.0) if got[key]["finish_reason"] == "stop" else ("no_answer", -1.0)
        assert (got[key]["verdict"], got[key]["reward"]) == expected
    assert sum(v["rule_verdict"] == "correct" for v in verdicts.values()) == 2


def test_filter_change_reuses_verdicts_and_rows_are_complete(tmp_path, samples):
    """A filter change is another verify (refused in the same folder without overwrite=true);
    replacing the folder keeps the verdicts, which no filter changes, and judges nothing again."""
    out = tmp_path / "v"
    verify.run(quiet(cfg(samples, out, filters={"drop_zero_variance": False})))
    verdict_part = shards.part_path(out / verify.VERDICTS, 0)
    before = verdict_part.read_bytes()
    with pytest.raises(shards.ShardError, match="filters.drop_zero_variance: False then, True now"):
        verify.run(quiet(cfg(samples, out, filters={"drop_zero_variance": True})))
    verify.run(quiet(cfg(samples, out, filters={"drop_zero_variance": True}, overwrite=True)))
    assert verdict_part.read_bytes() == before
    manifest = shards.read_manifest(out)
    assert manifest["complete"] and manifest["counts"]["samples"] == 0  # all wrong: dropped
    stats = __import__("json").loads((out / "stats.json").read_text())
    assert stats["counts"] == manifest["counts"] and stats["filters"][-1]["samples_removed"] == 12
    assert stats["counts"]["verified_this_run"] == 0  # verdicts reused
    rows = list(shards.iter_rows(cfg(samples, out).output_dir))
    assert rows == []
    verify.run(quiet(cfg(samples, out, filters={"drop_zero_variance": False}, overwrite=True)))
    from reasoner.config import TemplateConfig
    from reasoner.data.template import think_span
    from reasoner.models import load_tokenizer

    tok = load_tokenizer(next(shards.iter_rows(samples))["model"])
    for r in shards.iter_rows(out):
        assert r["group_size"] == 3 and r["group_accuracy"] == 0.0 and r["reward"] == -1.0
        think = think_span(r["response"], TemplateConfig())
        assert r["reasoning_tokens"] == len(tok(think, add_special_tokens=False)["input_ids"])
        assert r["verifier"] == "rule"


def test_incomplete_input_is_refused(tmp_path, samples):
    shards.update_manifest(tmp_path / "partial", stage="infer", complete=False)
    with pytest.raises(ValueError, match="not a complete Sample shard"):
        verify.run(cfg(tmp_path / "partial", tmp_path / "v"))


def test_judge_mode_without_model_is_a_clear_error(tmp_path, samples):
    with pytest.raises(ValueError, match="judge.model.name_or_path"):
        verify.run(quiet(cfg(samples, tmp_path / "v", mode="judge")))
