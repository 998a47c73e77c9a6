"""`jaxlaunch run` with a sweep: every configuration on this machine, `max_parallel` at a time.

Each configuration is an ordinary local run (its own supervisor and mpirun) in its own process,
with its output in TASK_DIR/output.log. A failing configuration does not stop the others; the
exit code is 0 only if every configuration completed.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from ...sweeps.directory import SweepDirectory
from ...states import JobState

TASK_PROGRAM = ["-m", "launcher.backends.local.background"]
POLL_SECONDS = 0.2
# After Ctrl-C, how long the configurations' supervisors get to stop their ranks.
STOP_GRACE_SECONDS = 30


def run_sweep_locally(directory: SweepDirectory, max_parallel: int, echo=print) -> int:
    """Run every task of the sweep directory; returns 0 if all COMPLETED, else 1 (130 on Ctrl-C)."""
    record = directory.read()
    pending = directory.task_runs(record)
    total = len(pending)
    running: dict[int, tuple] = {}
    finished: dict[str, int] = {}
    echo(f"jaxlaunch: sweep of {total} configurations in {directory.path}, {max_parallel} at a time")
    interrupted = False

    def on_term(signum, frame):
        raise KeyboardInterrupt
    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        while pending or running:
            while pending and len(running) < max_parallel:
                task, run = pending.pop(0)
                with open(run.output_log, "ab") as output:
                    process = subprocess.Popen([sys.executable, *TASK_PROGRAM, str(run.path)], stdout=output,
                                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
                running[task["index"]] = (process, task, run, time.monotonic())
            for index, (process, task, run, started) in list(running.items()):
                if process.poll() is None:
                    continue
                del running[index]
                status = run.status()
                # a supervisor that died without a word (kill -9) left no final state
                state = status.state.value if status.state.final else JobState.FAILED.value
                finished[state] = finished.get(state, 0) + 1
                label = ", ".join(f"{k}={v!r}" for k, v in task["values"].items())
                echo(f"jaxlaunch: [{sum(finished.values())}/{total}] {task['folder']} ({label}): {state} "
                     f"in {time.monotonic() - started:.1f} s")
                if state != JobState.COMPLETED:
                    echo(f"  {status.reason or 'no reason recorded'}\n  output: {run.output_log}")
            time.sleep(POLL_SECONDS)
    except KeyboardInterrupt:
        interrupted = True
        echo(f"jaxlaunch: stopping the sweep: {len(running)} running configuration(s) get SIGTERM; "
             f"{len(pending)} not started")
        for process, *_ in running.values():
            process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for process, *_ in running.values():
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)
    counts = ", ".join(f"{n} {state}" for state, n in sorted(finished.items()))
    echo(f"jaxlaunch: sweep {'stopped' if interrupted else 'done'}: {counts or 'nothing finished'} "
         f"(of {total}); results: jaxlaunch results {directory.path}")
    if interrupted:
        return 130
    return 0 if finished.get(JobState.COMPLETED.value, 0) == total else 1


if __name__ == "__main__":  # `python -m launcher.backends.local.array SWEEP_DIR MAX_PARALLEL`: Executor.map's local runs
    sys.exit(run_sweep_locally(SweepDirectory(sys.argv[1]), int(sys.argv[2]),
                               echo=lambda message: print(message, flush=True)))
