import pytest
from tests_helpers import quiet

from reasoner import infer, shards, verify
from reasoner.config import InferConfig, VerifyConfig
from reasoner.verify.judge import load_prompt, parse_verdict, render

REPO_PROMPT = "configs/judge/prompt.txt"

REPLIES = [
    ("\\boxed{1}", 1),
    ("\\boxed{0}", 0),
    ("The candidate matches the reference.\n\\boxed{1}", 1),
    ("\\boxed{ 0 }  \n", 0),
    ("<think>is 1/2 = 0.5? yes \\boxed{0} no wait</think>\\boxed{1}", 1),  # thinking stripped
    ("\\boxed{1} because they match", None),  # trailing text
    ("\\boxed{1}\\boxed{0}", None),  # two boxes
    ("\\boxed{0} ... \\boxed{0}", None),
    ("1", None),  # outside a box
    ("The answer is correct: 1", None),
    ("\\boxed{yes}", None),
    ("\\boxed{2}", None),
    ("\\boxed{10}", None),
    ("", None),
    ("<think>unfinished thinking \\boxed{1}", None),  # no closing tag: the box is inside thinking? strict: counts as reply
]


@pytest.mark.parametrize(("reply", "expected"), REPLIES[:-1])
def test_strict_parsing(reply, expected):
    assert parse_verdict(reply) == expected


def test_prompt_template_renders_with_latex_braces(tmp_path):
    from pathlib import Path

    template = load_prompt(Path(__file__).resolve().parents[3] / REPO_PROMPT)
    text = render(template, "Find $\\frac{a}{b}$.", "\\frac{1}{2}", None, "long response " * 500, 50)
    assert "Find $\\frac{a}{b}$." in text and "\\frac{1}{2}" in text
    assert "(no final answer was extracted" in text and text.count("long response") <= 5
    # the PCL-Reasoner-V1.5 prompt: no problem, the response tail even when an answer was found
    pcl = load_prompt(Path(__file__).resolve().parents[3] / "configs/judge/pcl_prompt.txt")
    response = "step " * 400 + "so the answer is \\boxed{7}"
    text = render(pcl, "Find x.", "7", "7", response, 60, candidate="tail")
    assert "Find x." not in text and text.count("step") == 6 and "\\boxed{7}" in text
    bad = tmp_path / "p.txt"
    bad.write_text("no placeholders")
    with pytest.raises(ValueError, match=r"\{problem\}"):
        load_prompt(bad)


def test_judge_end_to_end_with_tiny_model(tmp_path, synth_dir, tiny_model_dir):
    from pathlib import Path

    samples = infer.run(quiet(InferConfig.model_validate({
        "model": {"name_or_path": str(tiny_model_dir)},
        "data": {"path": str(synth_dir / "test_problems"), "limit": 3},
        "output_dir": str(tmp_path / "samples"), "backend": "hf",
        "sampling": {"n": 2, "max_tokens": 8}})))
    prompt = Path(__file__).resolve().parents[3] / REPO_PROMPT
    cfg = VerifyConfig.model_validate({
        "input_dir": str(samples), "output_dir": str(tmp_path / "verified"), "mode": "both",
        "judge": {"model": {"name_or_path": str(tiny_model_dir)}, "backend": "hf",
                  "prompt_file": str(prompt), "max_tokens": 6, "retries": 1},
        "filters": {"drop_zero_variance": False}})
    out = verify.run(quiet(cfg))
    rows = list(shards.iter_rows(out))
    assert len(rows) == 6
    for r in rows:
        assert r["verifier"] == "judge" and r["judge_output"] is not None
        assert r["verdict"] in ("correct", "incorrect", "invalid")
        assert r["reward"] == (1.0 if r["verdict"] == "correct" else -1.0)
    # a random tiny model cannot answer in the strict form: invalid, never correct
    assert all(r["verdict"] == "invalid" for r in rows if parse_verdict(r["judge_output"]) is None)
    manifest = shards.read_manifest(out)
    assert sum(manifest["agreement"].values()) == 6
    # mode both: every rule / judge disagreement is listed for a person to read, and only those
    import json

    verdicts = {(v["id"], v["sample_idx"]): v for v in shards.iter_rows(out / verify.VERDICTS)}
    listed = [json.loads(line) for line in (out / "disagreements.jsonl").read_text().splitlines()]
    expected = {k for k, v in verdicts.items() if v["rule_verdict"] != v["judge_verdict"]}
    assert {(d["id"], d["sample_idx"]) for d in listed} == expected and expected
    assert all(d["rule"] != d["judge"] for d in listed)


def test_a_qwen3_style_judge_thinks_only_when_asked(tmp_path, tiny_model_dir):
    """Qwen3's chat template opens an empty think block when enable_thinking is false; the
    judge passes the switch through and samples as Qwen3 advises when thinking."""
    import shutil
    from pathlib import Path

    from reasoner.config import JudgeConfig
    from reasoner.verify.judge import Judge

    qwen3_like = tmp_path / "judge"
    shutil.copytree(tiny_model_dir, qwen3_like)
    (qwen3_like / "chat_template.jinja").write_text(
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}<|im_start|>assistant\n{% if enable_thinking is defined and "
        "enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}")
    prompt = Path(__file__).resolve().parents[3] / REPO_PROMPT
    item = {"problem": "1+1?", "answer": "2", "extracted": "2", "response": "\\boxed{2}"}
    base = {"model": {"name_or_path": str(qwen3_like)}, "backend": "hf", "prompt_file": str(prompt)}
    quiet = Judge(JudgeConfig.model_validate(base))
    assert quiet.prompt_text(item).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert quiet._sampling(0).temperature == 0.0
    thinking = Judge(JudgeConfig.model_validate({**base, "enable_thinking": True}))
    assert thinking.prompt_text(item).endswith("<|im_start|>assistant\n")
    s = thinking._sampling(0)
    assert (s.temperature, s.top_p, s.top_k) == (0.6, 0.95, 20)


class ScriptedJudge:
    """A judge backend that answers in reverse request order: \\boxed{1} for sample 0, and for
    sample 1 an unparseable reply when greedy, \\boxed{0} when sampled (a retry)."""

    name = "scripted"
    context_window = 4096
    preferred_batch = 2

    def __init__(self, tokenizer, crash_after=None):
        self.tokenizer, self.crash_after, self.calls = tokenizer, crash_after, []

    def stream(self, requests, sampling):
        from reasoner.infer.base import Completion

        self.calls.append((len(requests), sampling.temperature))
        for n, i in enumerate(reversed(range(len(requests)))):
            if n == self.crash_after:
                raise RuntimeError("judge node lost")
            reply = ("\\boxed{1}" if requests[i].sample_idx == 0
                     else "hmm" if sampling.temperature == 0 else "\\boxed{0}")
            yield i, Completion([1], reply, "stop")

    def close(self):
        pass


def test_judge_verdicts_are_written_as_they_arrive_and_resume(tmp_path, synth_dir, tiny_model_dir,
                                                              monkeypatch):
    """Every judge prompt goes to the backend in one call (not batch by batch); each final
    verdict is on disk when it arrives, so a crash keeps them; unparseable replies are retried
    (sampled) and the rerun asks only what is missing."""
    from pathlib import Path

    import reasoner.infer
    from reasoner.models import load_tokenizer

    samples = infer.run(quiet(InferConfig.model_validate({
        "model": {"name_or_path": str(tiny_model_dir)},
        "data": {"path": str(synth_dir / "test_problems"), "limit": 3},
        "output_dir": str(tmp_path / "samples"), "backend": "hf",
        "sampling": {"n": 2, "max_tokens": 4}})))
    cfg = VerifyConfig.model_validate({
        "input_dir": str(samples), "output_dir": str(tmp_path / "verified"), "mode": "judge",
        "judge": {"model": {"name_or_path": str(tiny_model_dir)}, "backend": "hf", "batch_size": 2,
                  "prompt_file": str(Path(__file__).resolve().parents[3] / REPO_PROMPT),
                  "retries": 1},
        "filters": {"drop_zero_variance": False}})
    tok = load_tokenizer(str(tiny_model_dir))
    first = ScriptedJudge(tok, crash_after=4)
    monkeypatch.setattr(reasoner.infer, "make_generator", lambda *a, **kw: first)
    with pytest.raises(RuntimeError, match="judge node lost"):
        verify.run(quiet(cfg))
    assert first.calls == [(6, 0.0)]
    kept = list(shards.iter_rows(tmp_path / "verified" / verify.VERDICTS))
    # four replies came, in reverse order: problem 2 sample 1 (unparseable: held for a retry),
    # problem 2 sample 0, problem 1 sample 1 (held), problem 1 sample 0: two final verdicts
    assert sorted((r["sample_idx"], r["judge_verdict"]) for r in kept) == [(0, "correct")] * 2
    second = ScriptedJudge(tok)
    monkeypatch.setattr(reasoner.infer, "make_generator", lambda *a, **kw: second)
    out = verify.run(quiet(cfg))
    assert second.calls == [(4, 0.0), (3, 0.7)]
    rows = list(shards.iter_rows(out / verify.VERDICTS))
    assert sorted((r["sample_idx"], r["judge_verdict"]) for r in rows) == (
        [(0, "correct")] * 3 + [(1, "incorrect")] * 3)
