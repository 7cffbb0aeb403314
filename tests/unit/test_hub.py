"""Local path or hub id, decided before any download: a typo is one line, at once."""

from reasoner import hub


def test_hub_ids_have_at_most_one_slash_and_no_file_ending():
    assert hub.is_hub_id("Qwen/Qwen2.5-32B") and hub.is_hub_id("gsm8k")
    for local in ("runs/quickstart/sft/finall", "./model", "/data/x", "~/m", "a/b/",
                  "problems.jsonl", "nowhere/problems.jsonl"):
        assert not hub.is_hub_id(local), local


def test_a_local_typo_names_the_closest_existing_path(tmp_path):
    (tmp_path / "sft" / "final").mkdir(parents=True)
    why = hub.missing(str(tmp_path / "sft" / "finall"), "model.name_or_path", "model folder")
    assert why == (f"model.name_or_path={tmp_path}/sft/finall: no such model folder "
                   f"(did you mean {tmp_path}/sft/final?)")
    assert hub.missing(str(tmp_path / "sft" / "final"), "k", "model folder") is None


def test_offline_a_hub_id_is_refused_at_once_unless_cached(monkeypatch):
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(key, raising=False)
    assert hub.missing("nobody/nothing", "model.name_or_path", "model folder") is None  # online
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    why = hub.missing("nobody/nothing", "model.name_or_path", "model folder")
    assert why.startswith("model.name_or_path=nobody/nothing: not a local model folder, and "
                          "not in the hub cache while offline (HF_HUB_OFFLINE is set)")
    assert hub.missing("nobody/nothing", "k", "model folder", cached=True) is None
