"""Loading configs: YAML + overrides, every error at once with file:line and the closest key."""

from pathlib import Path

import pytest

from reasoner.config import (
    ConfigError,
    SynthConfig,
    TinyConfig,
    dump,
    load,
    parse_overrides,
)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    return path


def test_good_file_loads(tmp_path):
    cfg = load(SynthConfig, write(tmp_path, "output_dir: out\nseed: 3\ntemplate:\n  think_open: <t>\n"))
    assert cfg.seed == 3 and cfg.output_dir == Path("out")
    assert cfg.template.think_open == "<t>" and cfg.template.think_close == "</think>"


def test_overrides_change_nested_values_and_types(tmp_path):
    path = write(tmp_path, "output_dir: out\n")
    cfg = load(SynthConfig, path, ["seed=7", "flawed_fraction=0.25", "levels=[2, 4]",
                                   "template.system_prompt=be brief", "template.use_chat_template=false"])
    assert cfg.seed == 7 and cfg.flawed_fraction == 0.25 and cfg.levels == [2, 4]
    assert cfg.template.system_prompt == "be brief" and cfg.template.use_chat_template is False
    cfg = load(TinyConfig, None, ["output_dir=x", "model.hidden_size=32", "model.rope_theta=1e6"])
    assert cfg.model.hidden_size == 32 and cfg.model.rope_theta == 1e6


def test_override_values_are_yaml_scalars():
    assert parse_overrides(["a.b=1e-5", "c=null", "d=[1, 2]", "e=true", "f=text", "g=3"]) == {
        ("a", "b"): 1e-5, ("c",): None, ("d",): [1, 2], ("e",): True, ("f",): "text", ("g",): 3}


def test_an_override_that_is_not_yaml_says_how_to_pass_it_as_text():
    """`{sft}/final` (a recipe reference) opens a YAML mapping; the message shows the quoting."""
    with pytest.raises(ConfigError) as err:
        parse_overrides(["rl-prorl.reference={sft}/final"])
    assert "not valid YAML" in str(err.value)
    assert """'rl-prorl.reference="{sft}/final"'""" in str(err.value)
    assert parse_overrides(['reference="{sft}/final"']) == {("reference",): "{sft}/final"}


def test_unknown_key_in_file_names_file_line_and_closest_key(tmp_path):
    path = write(tmp_path, "output_dir: out\nseed: 1\nnum_trian: 5\n")
    with pytest.raises(ConfigError) as err:
        load(SynthConfig, path)
    msg = str(err.value)
    assert f"{path}:3" in msg and "unknown key 'num_trian'" in msg and "did you mean 'num_train'" in msg


def test_unknown_nested_key_suggests_nested_key(tmp_path):
    path = write(tmp_path, "output_dir: out\ntemplate:\n  think_opn: <t>\n")
    with pytest.raises(ConfigError) as err:
        load(SynthConfig, path)
    assert f"{path}:3" in str(err.value)
    assert "did you mean 'template.think_open'" in str(err.value)


def test_wrong_type_names_key_and_value(tmp_path):
    path = write(tmp_path, "output_dir: out\nseed: many\n")
    with pytest.raises(ConfigError) as err:
        load(SynthConfig, path)
    assert f"{path}:2" in str(err.value) and "'seed'" in str(err.value) and "'many'" in str(err.value)


def test_missing_required_value(tmp_path):
    with pytest.raises(ConfigError) as err:
        load(SynthConfig, write(tmp_path, "seed: 1\n"))
    assert "missing required value 'output_dir'" in str(err.value)


def test_bad_override_is_blamed_on_the_override(tmp_path):
    path = write(tmp_path, "output_dir: out\n")
    with pytest.raises(ConfigError) as err:
        load(SynthConfig, path, ["template.think_opn=<t>"])
    assert "override 'template.think_opn=<t>'" in str(err.value)
    with pytest.raises(ConfigError, match="not of the form key.sub=value"):
        load(SynthConfig, path, ["seed"])
    with pytest.raises(ConfigError, match="override 'seed.x=1': 'seed' input should be a valid integer"):
        load(SynthConfig, path, ["seed.x=1"])
    with pytest.raises(ConfigError, match="seed is a value, not a section"):
        load(SynthConfig, write(tmp_path, "output_dir: out\nseed: 1\n"), ["seed.x=1"])


def test_every_error_reported_at_once(tmp_path):
    with pytest.raises(ConfigError) as err:
        load(SynthConfig, write(tmp_path, "seed: x\nnum_tset: 3\n"))
    msg = str(err.value)
    assert "'seed'" in msg and "num_tset" in msg and "output_dir" in msg


def test_missing_file_and_non_mapping(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load(SynthConfig, tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load(SynthConfig, write(tmp_path, "- a\n- b\n"))


def test_dump_is_json_data(tmp_path):
    cfg = load(SynthConfig, None, ["output_dir=out"])
    data = dump(cfg)
    assert data["output_dir"] == "out" and data["template"]["answer_open"] == "<answer>"


def test_an_override_indexes_a_list_of_sections():
    """Issue 51, finding 8: `data.0.fields={answer: gold}` was refused ('data is a value, not a
    section'); a number indexes a list, and a bad index or key says which."""
    from reasoner.config import EvalConfig

    base = ["model.name_or_path=m", "output_dir=o", "data=[{path: a.jsonl}, {path: b.jsonl}]"]
    cfg = load(EvalConfig, None, [*base, "data.0.fields={answer: gold}", "data.1.split=test"])
    assert cfg.data[0].fields == {"answer": "gold"} and cfg.data[1].split == "test"
    cfg = load(EvalConfig, None, base[:2] + ["data.0.fields.id=qid"],
               values={"data": [{"path": "a.jsonl", "fields": {"answer": "gold"}}]})
    assert cfg.data[0].fields == {"answer": "gold", "id": "qid"}
    with pytest.raises(ConfigError, match=r"'data.2.split=test': data is a list of 2; index it "
                                          r"with 0 to 1 \(got '2'\)"):
        load(EvalConfig, None, [*base, "data.2.split=test"])
    with pytest.raises(ConfigError, match=r"override 'data.0.feilds.answer=gold': unknown key "
                                          r"'data.0.feilds' \(did you mean 'data.0.fields'\?\); "
                                          r"valid keys here: path, split"):
        load(EvalConfig, None, [*base, "data.0.feilds.answer=gold"])
    with pytest.raises(ConfigError, match=r"data holds no list to index here; set the list first"):
        load(EvalConfig, None, [*base[:2], "data.0.split=test"])
