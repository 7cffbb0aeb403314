import json
import os

import pytest

from reasoner import shards
from reasoner.records import SCHEMA_VERSION, Problem, Sample


def problem(i: int) -> Problem:
    return Problem(id=f"p{i}", problem=f"what is {i}+1?", answer=str(i + 1))


def test_write_read_roundtrip_and_manifest(tmp_path):
    folder = tmp_path / "out"
    shards.begin(folder, "test", {"a": 1}, inputs={"src": "x"})
    assert not shards.is_complete(folder)
    assert shards.write_rows(folder, (problem(i) for i in range(5))) == 5
    shards.finish(folder, {"problems": 5})
    manifest = shards.read_manifest(folder)
    assert manifest["complete"] is True and manifest["config"] == {"a": 1}
    assert manifest["stage"] == "test" and manifest["schema_version"] == SCHEMA_VERSION
    assert manifest["inputs"] == {"src": "x"} and manifest["counts"] == {"problems": 5}
    assert "reasoner_version" in manifest
    rows = list(shards.iter_rows(folder, Problem))
    assert [r["id"] for r in rows] == [f"p{i}" for i in range(5)]
    assert all(r["schema_version"] == SCHEMA_VERSION for r in rows)


def test_torn_last_line_is_ignored_then_truncated_on_resume(tmp_path):
    folder = tmp_path / "out"
    shards.begin(folder, "test", {})
    shards.write_rows(folder, (problem(i) for i in range(3)))
    path = shards.part_path(folder, 0)
    with open(path, "a") as fh:  # a crash in the middle of writing row 3
        fh.write(json.dumps(problem(3).model_dump())[:25])
    assert [r["id"] for r in shards.iter_rows(folder, Problem)] == ["p0", "p1", "p2"]
    done = shards.present_keys(folder, Problem)
    assert done == {"p0", "p1", "p2"}
    with shards.PartWriter(folder, 0) as writer:  # resume: repair, then skip present keys
        assert writer.dropped_bytes == 25
        for i in range(6):
            if f"p{i}" not in done:
                writer.write(problem(i))
    shards.finish(folder, {"problems": 6})
    ids = [r["id"] for r in shards.iter_rows(folder, Problem)]
    assert ids == [f"p{i}" for i in range(6)]  # nothing lost, nothing twice


def test_complete_folder_with_torn_line_is_an_error(tmp_path):
    folder = tmp_path / "out"
    shards.write_rows(folder, [problem(0)])
    with open(shards.part_path(folder, 0), "a") as fh:
        fh.write('{"id": "p1", "probl')
    shards.finish(folder, {})
    with pytest.raises(shards.ShardError, match=r"part-00000.jsonl:2: not a JSON object"):
        list(shards.iter_rows(folder))


def test_unknown_schema_version_refused(tmp_path):
    folder = tmp_path / "out"
    shards.write_rows(folder, [problem(0), {**problem(1).model_dump(), "schema_version": 99}])
    with pytest.raises(shards.ShardError) as err:
        list(shards.iter_rows(folder, Problem))
    assert "part-00000.jsonl:2: schema_version 99 is not supported" in str(err.value)


def test_malformed_row_reported_with_path_and_line(tmp_path):
    folder = tmp_path / "out"
    rows = [problem(0).model_dump(), problem(1).model_dump(), {"id": "p2", "problem": "x"}]
    shards.write_rows(folder, rows)
    with pytest.raises(shards.ShardError) as err:
        list(shards.iter_rows(folder, Problem))
    assert str(err.value) == f"{shards.part_path(folder, 0)}:3: missing field \"answer\""
    shards.write_rows(tmp_path / "b", [{**problem(0).model_dump(), "sample_idx": "x"}])
    with pytest.raises(shards.ShardError, match=r"part-00000.jsonl:1: field \"sample_idx\": Input should be a valid integer.*; missing field \"prompt\""):
        list(shards.iter_rows(tmp_path / "b", Sample))


def test_duplicate_key_detected(tmp_path):
    folder = tmp_path / "out"
    shards.write_rows(folder, [problem(0), problem(0)])
    with pytest.raises(shards.ShardError, match="appears twice"):
        shards.present_keys(folder, Problem)


def test_workers_write_separate_parts_of_one_folder(tmp_path):
    folder = tmp_path / "out"
    shards.begin(folder, "test", {})
    pids = []
    for worker in range(2):
        pid = os.fork()
        if pid == 0:  # child: write every other problem into its own part
            try:
                shards.write_rows(folder, (problem(i) for i in range(worker, 10, 2)), part=worker)
                shards.update_manifest(folder, **{f"worker_{worker}": "done"})
            finally:
                os._exit(0)
        pids.append(pid)
    for pid in pids:
        assert os.waitpid(pid, 0)[1] == 0
    assert [p.name for p in shards.part_files(folder)] == ["part-00000.jsonl", "part-00001.jsonl"]
    assert shards.present_keys(folder, Problem) == {f"p{i}" for i in range(10)}
    manifest = shards.read_manifest(folder)
    assert manifest["worker_0"] == manifest["worker_1"] == "done"


def test_begin_refuses_other_config_unless_overwrite(tmp_path):
    folder = tmp_path / "out"
    shards.begin(folder, "test", {"a": 1})
    shards.write_rows(folder, [problem(0)])
    assert shards.begin(folder, "test", {"a": 1})["complete"] is False  # same config: resume
    assert shards.present_keys(folder, Problem) == {"p0"}
    with pytest.raises(shards.ShardError, match="another config"):
        shards.begin(folder, "test", {"a": 2})
    shards.begin(folder, "test", {"a": 2}, overwrite=True)
    assert shards.present_keys(folder, Problem) == set()


def test_sample_key_is_id_and_index():
    row = {"id": "p", "sample_idx": 3}
    assert Sample.key_of(row) == ("p", 3)
