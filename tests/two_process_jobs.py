"""Several `reasoner` command lines in turn, in one pair of torchrun processes.

    python -m torch.distributed.run --nproc_per_node=2 tests/two_process_jobs.py jobs.json

jobs.json is a list of argument lists. Each runs through the same typer app as `reasoner ...`
would, in the one process group torchrun set up: the tests pay the two processes' start (an
import of torch and transformers each, up to a minute on a slow CI machine) once, not per job.
A job that fails ends the run with its exit code, naming it. A job `["--cut", FOLDER, COPY,
STEP]` is not a command: rank 0 copies a finished training folder as a run killed after
checkpoint STEP would have left it (tests_helpers.cut_after), the others wait."""

import json
import sys
from pathlib import Path

from tests_helpers import cut_after

from reasoner.cli import app


def main() -> None:
    jobs = json.loads(Path(sys.argv[1]).read_text())
    for k, argv in enumerate(jobs):
        if argv[0] == "--cut":
            import torch.distributed as dist

            if dist.get_rank() == 0:
                cut_after(Path(argv[1]), Path(argv[2]), int(argv[3]))
            dist.barrier()
            continue
        code = app(argv, standalone_mode=False)  # typer.Exit(n) comes back as n
        if code not in (None, 0):
            print(f"two_process_jobs: job {k} exited {code}: reasoner {' '.join(argv)}",
                  file=sys.stderr)
            sys.exit(code)


if __name__ == "__main__":
    main()
