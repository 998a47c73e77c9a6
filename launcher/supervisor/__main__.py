"""`python -m launcher.supervisor RUN_DIR -- LAUNCH...`: the supervisor inside a batch job (Slurm's).

The batch script `exec`s this, so it is the batch shell itself: the scheduler's signals to the
batch step (scancel, --signal=B:...) reach it directly, and its exit code is the job's. The
backend whose job this is provides the allocation (backends.allocation_here).
"""

import sys
import time

from ..rundir import RunDirectory
from ..backends import allocation_here
from .supervise import describe_outcome, supervise


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m launcher.supervisor RUN_DIR -- LAUNCH_COMMAND...", file=sys.stderr)
        return 2
    run = RunDirectory(argv[0])
    spec = run.read_spec()
    started = time.time()
    # Always "resume": a requeued job runs this script again, in the same run directory.
    outcome = supervise(spec, run, argv[2:], {}, echo=lambda m: print(m, file=sys.stderr, flush=True),
                        allocation=allocation_here(), resume=True)
    for line in describe_outcome(spec, run, outcome, time.time() - started):
        print(line, file=sys.stderr, flush=True)
    return outcome.exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
