"""Public datasets' row shapes read natively through the shipped recipe configs, unchanged."""

from pathlib import Path

import pytest

from reasoner.config import InferConfig, SFTConfig, load
from reasoner.data import sources
from reasoner.data.template import render_sft
from reasoner.errors import DataError, ShardError
from reasoner.records import Problem, SFTExample

REPO = Path(__file__).resolve().parents[3]
FIXTURES = REPO / "tests" / "fixtures" / "data"


@pytest.mark.parametrize("name", ["am_sharegpt.jsonl", "am_openai.jsonl"])
def test_am_distilled_rows_read_through_the_pcl_sft_config(name):
    cfg = load(SFTConfig, REPO / "configs/pcl_reasoner_v1_5/sft.yaml", [f"data.path={FIXTURES / name}"])
    rows = sources.read_rows(cfg.data, SFTExample)
    assert len(rows) == 3
    first = rows[0]["messages"]
    assert [m["role"] for m in first] == ["system", "user", "assistant"]
    assert first[0]["content"] == "You are a helpful assistant."
    assert first[1]["content"] == "What is $3+4\\cdot 2$?"
    assert first[2]["content"].startswith("<think>Multiplication first")
    assert [m["role"] for m in rows[1]["messages"]] == ["user", "assistant"]  # empty system: none
    assert set(first[1]) == {"role", "content"}  # the `info` dicts are left behind
    prompt, response = render_sft(rows[1], cfg.template)
    assert "Find the remainder" in prompt and response.endswith("</answer>")


def test_sharegpt_without_a_mapping_and_bad_turns(tmp_path):
    cfg = SFTConfig.model_validate({"model": {"name_or_path": "m"}, "output_dir": "o",
                                    "data": {"path": str(FIXTURES / "am_sharegpt.jsonl")}})
    assert len(sources.read_rows(cfg.data, SFTExample)) == 3
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"conversations": [{"from": "narrator", "value": "x"}]}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:1: turn 0 needs role/content .* got \['from', 'value'\]"):
        sources.read_rows(cfg.data.model_copy(update={"path": str(bad)}), SFTExample)


@pytest.mark.parametrize("name", ["pcl_rl_math.jsonl", "nemotron_style.jsonl"])
def test_problem_sets_read_through_the_pcl_infer_config(name):
    from reasoner.infer import load_problems

    cfg = load(InferConfig, REPO / "configs/pcl_reasoner_v1_5/infer.yaml",
               [f"data={{path: {FIXTURES / name}}}"])  # the local file, not the hub pool
    rows = load_problems(cfg)
    assert [(r["problem"][:8], r["answer"]) for r in rows] == [
        ("What is ", "11"), ("Find the", "2"), ("How many", "9")]
    assert len({r["id"] for r in rows}) == 3


def test_nested_field_mapping():
    from reasoner.config import DataConfig

    cfg = DataConfig(path=str(FIXTURES / "verl_style.jsonl"),
                     fields={"problem": "prompt.0.content", "answer": "reward_model.ground_truth"})
    rows = sources.read_rows(cfg, Problem)
    assert rows[2]["problem"] == "How many positive divisors does 36 have?" and rows[2]["answer"] == "9"
    missing = cfg.model_copy(update={"fields": {"answer": "reward_model.nope"}})
    with pytest.raises(ShardError, match='verl_style.jsonl:1: .*"answer"'):
        sources.read_rows(missing, Problem)


def test_data_files_and_streaming_with_a_limit(tmp_path):
    """Pick some files of a multi-file set, and stop after `limit` rows without reading the rest
    (local files through datasets' json builder: the same code path as a hub id)."""
    from reasoner.config import DataConfig

    lines = (FIXTURES / "pcl_rl_math.jsonl").read_text().splitlines(keepends=True)
    files = []
    for name, part in (("math.jsonl", lines[:2]), ("code.jsonl", lines[2:])):
        (tmp_path / name).write_text("".join(part))
        files.append(str(tmp_path / name))
    cfg = DataConfig(path="json", data_files=files[0], limit=1)
    assert [r["answer"] for r in sources.read_rows(cfg, Problem)] == ["11"]
    rows = sources.read_rows(DataConfig(path="json", data_files=files, streaming=True), Problem)
    assert [r["answer"] for r in rows] == ["11", "2", "9"]
    with pytest.raises(DataError, match="need data.data_files"):
        sources.read_rows(DataConfig(path="json"), Problem)


@pytest.mark.parametrize("name,first_answer", [
    ("aime24.jsonl", "204"), ("gsm8k.jsonl", "18"), ("minerva_math.jsonl", "1.6"),
    ("amc23.jsonl", "27.0")])
def test_shared_benchmark_files_read_through_the_pcl_infer_config(name, first_answer):
    from tests_helpers import SHARED_EVAL, shared_eval_rows

    from reasoner.infer import load_problems

    raw = shared_eval_rows(name)  # skips with the reason when it is absent
    cfg = load(InferConfig, REPO / "configs/pcl_reasoner_v1_5/infer.yaml",
               [f"data={{path: {SHARED_EVAL / name}}}"])
    rows = load_problems(cfg)
    assert len(rows) == len(raw) and rows[0]["answer"] == first_answer  # final answers only
    assert not any("####" in r["answer"] for r in rows)


def test_usual_answer_names_are_recognised_and_said(tmp_path, capsys):
    """Issue 51, finding 8: `gold`, `target`, `label` and `final_answer` are answer columns,
    each said on stderr once per source when it is used."""
    import json

    from reasoner.config import DataConfig

    for name in ("gold", "target", "label", "final_answer"):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"question": f"{i} + 1?", name: i + 1}) + "\n"
                                for i in range(3)))
        rows = sources.read_rows(DataConfig(path=str(path)), Problem)
        assert [(r["problem"], r["answer"]) for r in rows] == [("0 + 1?", "1"), ("1 + 1?", "2"),
                                                                ("2 + 1?", "3")]
        said = capsys.readouterr().err.splitlines()
        assert said == [f'[data] {path}: "answer" read from the column "{name}" (a usual name; '
                        'map another with fields: {answer: COLUMN})',
                        f'[data] {path}: "problem" read from the column "question" (a usual '
                        'name; map another with fields: {problem: COLUMN})']


def test_a_missing_answer_names_the_mapping_with_an_example(tmp_path):
    """Issue 51, finding 8: 'missing field answer' pointed nowhere; now the error names the
    mapping key, spelled with a column of the row."""
    import json

    from reasoner.config import DataConfig

    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"qid": "a", "question": "1 + 1?", "result": 2}) + "\n")
    with pytest.raises(ShardError) as err:
        sources.read_rows(DataConfig(path=str(path)), Problem)
    assert str(err.value) == (
        f'{path}:1: missing field "answer": none of the usual names (ground_truth, '
        "expected_answer, final_answer, gt_answer, gold, target, label) is there either; the "
        "row has qid, result. Map the column that holds it, e.g. --field answer=result (eval "
        "bench), data.fields.answer=result (infer), or fields: {answer: result} under the data "
        "source in a config")
    mapped = DataConfig(path=str(path), fields={"answer": "res"})
    with pytest.raises(ShardError, match='missing field "answer": the mapping fields.answer: res '
                                         "names no field of this row"):
        sources.read_rows(mapped, Problem)
    rows = sources.read_rows(DataConfig(path=str(path), fields={"answer": "result", "id": "qid"}),
                             Problem)
    assert [(r["id"], r["answer"]) for r in rows] == [("a", "2")]
