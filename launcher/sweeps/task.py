"""`python -m launcher.sweeps.task RUN_DIR`: one configuration of a local sweep, run as its own
process (so that its supervisor owns its signals and its ranks, as `jaxlaunch run` does)."""

import sys

from ..local import run_local
from ..rundir import RunDirectory


def main(argv: list[str]) -> int:
    run = RunDirectory(argv[0])
    return run_local(run.read_spec(), run, echo=lambda m: print(m, file=sys.stderr, flush=True),
                     print_result=lambda text: print(text, flush=True))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
