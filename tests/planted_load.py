"""Run a command on a loaded machine: BURNERS CPU burners per core beside it (a busy CI runner, or
the issue-55 machine at a load average of 5-18), stopped when the command ends; exits with the
command's exit code. A test that passes idle and fails here assumes how fast the machine is.

    .venv/bin/python tests/planted_load.py [--per-core N] -- COMMAND [ARGS...]
    make test-loaded [TARGET=test-unit] [LOAD=N]

"Per core" is per CPU this process may use (sched_getaffinity): under `taskset -c 0` the command and
its burners share core 0, which loads one core and leaves the others' work alone.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys

# Each burner spins until it is killed, or until the runner is gone (it checks its parent between
# spins), so a runner killed with -9 leaves no burner behind.
BURNER = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    for _ in range(1000000): pass\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-core", type=int, default=1, help="burners per usable core (default 1)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (after --)")
    cores = len(os.sched_getaffinity(0))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the burners are stopped below
    burners = [subprocess.Popen([sys.executable, "-c", BURNER]) for _ in range(cores * args.per_core)]
    print(f"planted_load: {len(burners)} burners on {cores} cores (pids {' '.join(str(b.pid) for b in burners)})",
          file=sys.stderr, flush=True)
    try:
        return subprocess.call(command)
    except KeyboardInterrupt:
        return 130
    finally:
        for burner in burners:
            burner.kill()
        for burner in burners:
            burner.wait()
        print(f"planted_load: {len(burners)} burners stopped", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
