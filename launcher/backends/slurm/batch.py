"""`python -m launcher.backends.slurm.batch RUN_DIR -- LAUNCH...`: the supervisor inside a Slurm
batch job, the one program a batch script runs (slurm/batch.sh.j2 renders the line).

The batch script `exec`s this, so it is the batch shell itself: Slurm's signals to the batch step
(scancel, --signal=B:...) reach it directly, and its exit code is the job's. It hands the
supervisor this job's `SlurmAllocation` (allocation.py), through which the supervisor asks Slurm
everything it needs.
"""

import sys
import time

from ...rundir import RunDirectory
from ...supervisor import describe_outcome, supervise
from ...supervisor.allocation import Allocation
from .allocation import SlurmAllocation


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m launcher.backends.slurm.batch RUN_DIR -- LAUNCH_COMMAND...", file=sys.stderr)
        return 2
    run = RunDirectory(argv[0])
    spec = run.read_spec()
    started = time.time()
    # Outside a batch job (the script run by hand) there is nothing to requeue: a local allocation.
    allocation = SlurmAllocation.here() or Allocation()
    # Always "resume": a requeued job runs this script again, in the same run directory.
    outcome = supervise(spec, run, argv[2:], {}, echo=lambda m: print(m, file=sys.stderr, flush=True),
                        allocation=allocation, resume=True)
    for line in describe_outcome(spec, run, outcome, time.time() - started):
        print(line, file=sys.stderr, flush=True)
    return outcome.exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
