"""`python -m launcher.backends.local.background RUN_DIR`: run the spec saved in RUN_DIR to its end, as `jaxlaunch
run` would, in a process of its own (so that its supervisor owns its signals and its ranks). Used
for each configuration of a local sweep and by `launcher.run()` (the Python API)."""

import sys

from .backend import LocalBackend
from ...rundir import RunDirectory


def main(argv: list[str]) -> int:
    run = RunDirectory(argv[0])
    job = LocalBackend().run_attached(run.read_spec(), run, echo=lambda m: print(m, file=sys.stderr, flush=True),
                                      print_result=lambda text: print(text, flush=True))
    return job.exit_code()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
