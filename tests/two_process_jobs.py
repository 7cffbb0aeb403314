"""Several `reasoner` command lines in turn, in one pair of torchrun processes.

    python -m torch.distributed.run --nproc_per_node=2 tests/two_process_jobs.py jobs.json

jobs.json is a list of argument lists. Each runs through the same typer app as `reasoner ...`
would, in the one process group torchrun set up: the tests pay the two processes' start (an
import of torch and transformers each, up to a minute on a slow CI machine) once, not per job.
A job that fails ends the run with its exit code, naming it."""

import json
import sys
from pathlib import Path

from reasoner.cli import app


def main() -> None:
    jobs = json.loads(Path(sys.argv[1]).read_text())
    for k, argv in enumerate(jobs):
        code = app(argv, standalone_mode=False)  # typer.Exit(n) comes back as n
        if code not in (None, 0):
            print(f"two_process_jobs: job {k} exited {code}: reasoner {' '.join(argv)}",
                  file=sys.stderr)
            sys.exit(code)


if __name__ == "__main__":
    main()
