"""`reasoner infer` in subprocesses: resume after SIGKILL, two shards into one folder."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests_helpers import SUBPROCESS_ENV, reasoner

REPO = Path(__file__).resolve().parents[2]


def args(synth_dir, model_dir, out, *extra):
    return ["infer", str(REPO / "configs/quickstart/infer.yaml"), f"model.name_or_path={model_dir}",
            f"data.path={synth_dir}/test_problems", f"output_dir={out}", "data.limit=24",
            "sampling.n=3", "sampling.max_tokens=16", "batch_size=4", *extra]


def keys(folder: Path) -> list:
    out = []
    for part in sorted(folder.glob("part-*.jsonl")):
        out += [(r["id"], r["sample_idx"]) for r in map(json.loads, part.read_text().splitlines())]
    return out


@pytest.mark.slow
def test_resume_after_sigkill_has_exactly_the_keys_of_a_full_run(tmp_path, synth_dir, tiny_model_dir):
    ref = reasoner(*args(synth_dir, tiny_model_dir, tmp_path / "ref"))
    assert ref.returncode == 0, ref.stderr
    out = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "reasoner", *args(synth_dir, tiny_model_dir, out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=SUBPROCESS_ENV)
    part = out / "part-00000.jsonl"
    deadline = time.time() + 300
    while not (part.exists() and len(part.read_bytes().splitlines()) >= 20):
        assert proc.poll() is None and time.time() < deadline, "finished before it could be killed"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not json.loads((out / "manifest.json").read_text())["complete"]
    with open(part, "a") as fh:  # as if the kill had torn the line being written
        fh.write('{"id": "torn", "sample_')
    again = reasoner(*args(synth_dir, tiny_model_dir, out))
    assert again.returncode == 0, again.stderr
    got = keys(out)
    assert len(got) == len(set(got)) == 72 and set(got) == set(keys(tmp_path / "ref"))
    ref_rows = {(r["id"], r["sample_idx"]): r["token_ids"] for r in map(
        json.loads, (tmp_path / "ref" / "part-00000.jsonl").read_text().splitlines())}
    for r in map(json.loads, part.read_text().splitlines()):
        assert r["token_ids"] == ref_rows[(r["id"], r["sample_idx"])]  # same seed, same sample
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] and manifest["counts"]["samples"] == 72
    assert "samples/s" in again.stdout and "truncation rate" in again.stdout


@pytest.mark.slow
def test_two_shards_by_two_processes_make_one_complete_folder(tmp_path, synth_dir, tiny_model_dir):
    """Shard 1 in a second process while shard 0 runs in this one, into the same folder."""
    out = tmp_path / "sharded"
    other = subprocess.Popen([sys.executable, "-m", "reasoner", *args(synth_dir, tiny_model_dir, out),
                              "--shard", "1", "--num-shards", "2"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, env=SUBPROCESS_ENV)
    here = reasoner(*args(synth_dir, tiny_model_dir, out), "--shard", "0", "--num-shards", "2")
    assert here.returncode == 0, here.stderr
    assert other.wait(timeout=600) == 0, other.stderr.read()
    assert sorted(p.name for p in out.glob("part-*.jsonl")) == ["part-00000.jsonl", "part-00001.jsonl"]
    got = keys(out)
    assert len(got) == len(set(got)) == 72
    assert json.loads((out / "manifest.json").read_text())["complete"]


def test_bad_shard_and_missing_backend_messages(tmp_path, synth_dir, tiny_model_dir):
    r = reasoner(*args(synth_dir, tiny_model_dir, tmp_path / "x"), "--shard", "2", "--num-shards", "2")
    assert r.returncode == 2 and "shard 2 is not below num_shards 2" in r.stderr
