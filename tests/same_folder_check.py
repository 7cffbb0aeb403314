"""Run under torchrun with two processes: `device.check_same_folder` and `sees_same_folder` on
a folder both see, then on one folder per process (two nodes without a shared file system),
then on one rank 0 cannot create.

    python -m torch.distributed.run --nproc_per_node=2 tests/same_folder_check.py BASE OUT.json

Every process writes what each case did (None: passed; else the error) to OUT.json.RANK."""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from tests_helpers import leave_process_group

from reasoner import device as dev
from reasoner.errors import InputError


def main(base: Path, out: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    info = dev.DistInfo(rank, 2, rank)
    seen = {}
    (base / "a-file").parent.mkdir(parents=True, exist_ok=True)
    (base / "a-file").write_text("not a folder")
    for case, folder in (("shared", base / "run"), ("per node", base / f"node{rank}" / "run"),
                         ("uncreatable", base / "a-file" / "run")):
        try:
            dev.check_same_folder(folder, info, torch.device("cpu"), patience_s=1.0)
            seen[case] = None
        except InputError as e:
            seen[case] = str(e)
        seen[f"{case} shared"] = dev.sees_same_folder(folder, info, torch.device("cpu"), 1.0)
    dist.barrier()  # rank 0 removes its mark after the last collective: look after it did
    seen["marks_left"] = sorted(str(p.relative_to(base)) for p in base.rglob(".same-folder-check*"))
    Path(f"{out}.{rank}").write_text(json.dumps(seen))
    leave_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
