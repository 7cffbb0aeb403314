"""Generation and judging on Ray (`ray.workers`): a local Ray cluster on this CPU, two actors
each holding an hf engine. The shards must hold what the single-process path writes for the
same seeds."""

import pytest
from tests_helpers import quiet

from reasoner import infer, shards, verify
from reasoner.config import InferConfig, VerifyConfig

pytest.importorskip("ray", reason="ray is not installed: pip install 'reasoner[ray]' (CI does)")

PROMPT = "configs/judge/prompt.txt"


def by_key(folder):
    return {(r["id"], r["sample_idx"]): r for r in shards.iter_rows(folder)}


@pytest.fixture(scope="module")
def local_ray():
    import ray

    # "local": never another test's cluster (tests run in parallel processes)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def infer_cfg(synth_dir, model, out, **extra):
    return InferConfig.model_validate({
        "model": {"name_or_path": str(model)},
        "data": {"path": str(synth_dir / "test_problems"), "limit": 10},
        "output_dir": str(out), "template": {"instruction": ""}, "backend": "hf", "batch_size": 8,
        "sampling": {"n": 4, "max_tokens": 16, "temperature": 1.0, "logprobs": True, "seed": 3},
        **extra})


@pytest.mark.slow
def test_infer_and_judge_on_ray_write_the_single_process_shards(local_ray, tmp_path, synth_dir,
                                                                tiny_model_dir):
    import ray

    ray_cfg = {"workers": 2, "chunk": 6}
    alone = infer.run(quiet(infer_cfg(synth_dir, tiny_model_dir, tmp_path / "alone")))
    on_ray = infer.run(quiet(infer_cfg(synth_dir, tiny_model_dir, tmp_path / "ray", ray=ray_cfg)))
    a, b = by_key(alone), by_key(on_ray)
    assert a.keys() == b.keys() and len(a) == 40 and shards.is_complete(on_ray)
    for key, row in a.items():
        # same tokens and text: every request carries its own seed, whichever actor drew it;
        # log-probs to float rounding (other batch shapes)
        assert {**b[key], "logprobs": None} == {**row, "logprobs": None}
        assert b[key]["logprobs"] == pytest.approx(row["logprobs"], abs=1e-5)
    assert ray.is_initialized()  # a cluster it did not start is left running

    def judged(out, **judge):
        cfg = VerifyConfig.model_validate({
            "input_dir": str(alone), "output_dir": str(out), "mode": "both",
            "judge": {"model": {"name_or_path": str(tiny_model_dir)}, "backend": "hf",
                      "prompt_file": PROMPT, "max_tokens": 6, "retries": 1, **judge},
            "filters": {"drop_zero_variance": False}})
        return by_key(verify.run(quiet(cfg)) / verify.VERDICTS)

    assert judged(tmp_path / "j-ray", ray=ray_cfg) == judged(tmp_path / "j-alone")
