"""A stage's earlier outputs: kept in slots up to a count and a size, found again by identity,
brought back in place of recomputing (issue 51, finding 4)."""

import json
import shutil
from pathlib import Path

from reasoner import shards
from reasoner.config import VerifyConfig
from reasoner.pipeline import previous
from reasoner.pipeline.recipe import StageSpec
from reasoner.pipeline.resolve import StageRun


def folder(path: Path, label: str, size: int = 10) -> Path:
    """A stage output holding `size` bytes, named by what is inside it."""
    path.mkdir(parents=True)
    (path / "label").write_text(label.ljust(size))
    return path


def labels(out: Path) -> dict[str, str]:
    """Each kept copy's slot name -> what it holds; the stage's own folder as "out"."""
    found = {p.name: (p / "label").read_text().strip() for p in previous.copies(out)}
    if out.exists():
        found["out"] = (out / "label").read_text().strip()
    return found


def test_replaced_outputs_move_one_slot_on_and_the_oldest_go_past_keep(tmp_path):
    out = tmp_path / "sft"
    folder(out, "A")
    said = previous.set_aside(out, keep=2, max_gib=None)
    assert labels(out) == {"sft.previous": "A"}
    assert said.startswith(f"the replaced output is kept in {tmp_path}/sft.previous (0.00 GiB)")
    folder(out, "B")
    previous.set_aside(out, keep=2, max_gib=None)
    folder(out, "C")
    said = previous.set_aside(out, keep=2, max_gib=None)
    assert labels(out) == {"sft.previous": "C", "sft.previous-2": "B"}  # A: past keep_previous
    assert "deleted sft.previous-2 (0.00 GiB: over keep_previous)" in said


def test_a_copy_brought_back_swaps_with_the_output_it_replaces(tmp_path):
    out = tmp_path / "sft"
    folder(tmp_path / "sft.previous", "B")
    folder(tmp_path / "sft.previous-2", "A")
    folder(out, "C")
    previous.set_aside(out, keep=2, max_gib=None, back=tmp_path / "sft.previous-2")
    assert labels(out) == {"out": "A", "sft.previous": "C", "sft.previous-2": "B"}
    # with one copy kept, an override and back is a swap: nothing recomputed either way
    previous.set_aside(out, keep=1, max_gib=None, back=tmp_path / "sft.previous")
    assert labels(out) == {"out": "C", "sft.previous": "A"}
    # no output in place (deleted by hand): the copies move down a slot, none is lost
    folder(tmp_path / "sft.previous-2", "B")
    shutil.rmtree(out)
    previous.set_aside(out, keep=3, max_gib=None, back=tmp_path / "sft.previous")
    assert labels(out) == {"out": "A", "sft.previous": "B"}


def test_copies_past_the_size_limit_are_deleted_oldest_first(tmp_path):
    out = tmp_path / "rl"
    folder(tmp_path / "rl.previous", "A", size=600)
    folder(out, "B", size=600)
    said = previous.set_aside(out, keep=5, max_gib=1000 / 2**30)
    assert labels(out) == {"rl.previous": "B"}
    assert "deleted rl.previous (0.00 GiB: over previous_max_gib)" in said  # A, as it was named
    folder(out, "C", size=2000)
    said = previous.set_aside(out, keep=5, max_gib=1000 / 2**30)
    assert labels(out) == {"rl.previous": "B"}  # C alone is over the limit
    assert "deleted the replaced output (0.00 GiB: over previous_max_gib)" in said
    # two large copies go while smaller, older ones stay: those move down as `out` moves in
    for slot, (label, size) in enumerate([("E", 2000), ("F", 2000), ("G", 10), ("H", 10)]):
        shutil.rmtree(tmp_path / f"rl.previous{f'-{slot + 1}' if slot else ''}",
                      ignore_errors=True)
        folder(tmp_path / f"rl.previous{f'-{slot + 1}' if slot else ''}", label, size)
    folder(out, "D")
    previous.set_aside(out, keep=5, max_gib=1000 / 2**30)
    assert labels(out) == {"rl.previous": "D", "rl.previous-2": "G", "rl.previous-3": "H"}
    folder(out, "I")
    previous.set_aside(out, keep=0, max_gib=None)  # keep_previous: 0 deletes what is replaced
    assert labels(out) == {}


def verify_stage(tmp_path: Path, name: str, shard: Path) -> StageRun:
    cfg = VerifyConfig(input_dir=shard, output_dir=tmp_path / name, workers=1)
    return StageRun(name, StageSpec(name=name, command="verify"), tmp_path / name, cfg, "chain")


def made(stage: StageRun, where: Path, complete: bool = True) -> None:
    """`where` holds the output this stage makes, as its manifest says (or not complete)."""
    where.mkdir(parents=True, exist_ok=True)
    (where / "manifest.json").write_text(json.dumps(
        {"stage": "verify", "identity": previous.identity(stage), "complete": complete}))


def test_the_output_made_with_this_identity_is_found_in_place_or_in_a_copy(tmp_path):
    shard = tmp_path / "samples"
    shard.mkdir()
    shards.update_manifest(shard, stage="infer", identity="x", complete=True, counts={})
    stage = verify_stage(tmp_path, "verified", shard)
    other = verify_stage(tmp_path, "verified", shard)
    other.config = other.config.model_copy(update={"timeout_s": 9.0})  # decides verdicts
    assert previous.matching(stage) is None
    made(other, tmp_path / "verified")
    made(stage, tmp_path / "verified.previous", complete=False)  # interrupted: not reused
    assert previous.matching(stage) is None
    made(stage, tmp_path / "verified.previous-2")
    assert previous.matching(stage) == tmp_path / "verified.previous-2"
    # a setting outside the identity (rule workers) finds the folder in place
    faster = verify_stage(tmp_path, "verified", shard)
    faster.config = faster.config.model_copy(update={"workers": 8})
    made(faster, tmp_path / "verified")
    assert previous.matching(stage) == tmp_path / "verified"
    redo = verify_stage(tmp_path, "verified", shard)
    redo.config = redo.config.model_copy(update={"overwrite": True})
    assert previous.matching(redo) is None  # overwrite=true: redone, as asked
    # its input regenerated: nothing made from the old one is reused
    shards.update_manifest(shard, identity="y")
    assert previous.matching(stage) is None
