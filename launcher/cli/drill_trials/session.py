"""One drill from start to end: its folder, the clean run, every trial, the scorecard; and ending the
run in progress when the drill is interrupted (Ctrl-C, SIGTERM, SIGHUP), so that nothing of a trial
outlives it."""

from __future__ import annotations

import contextlib
import signal
import threading
from pathlib import Path

from ...backends import RUN_DEFAULT
from ...states import JobState
from .trials import Drill


def run_drill(spec_path: str, overrides: list[str], program_args: list[str], folder: Path, faults: list[str],
              count: int, seed: int, tolerance: float, num_processes: int, echo=print, ignore=("attempt",),
              target: str = RUN_DEFAULT, processes_per_node: int = 1, runs_program: bool = False) -> bool:
    folder = folder.resolve()  # the ranks' JAXLAUNCH_RUN_DIR is absolute: how their processes are found
    folder.mkdir(parents=True, exist_ok=True)
    drill = Drill(spec_path, overrides, program_args, folder, faults, count, seed, tolerance, echo, ignore,
                  target=target, processes_per_node=processes_per_node, runs_program=runs_program)
    with ending_runs_when_interrupted(drill, echo):
        return _run_drill(drill, folder, num_processes, target, echo)


@contextlib.contextmanager
def ending_runs_when_interrupted(drill: Drill, echo):
    """Ctrl-C (SIGINT), SIGTERM (`timeout`, a batch system) or SIGHUP ends the drill's run in
    progress too, its stopped rank continued first, and says so: nothing of a trial outlives the drill."""
    def on_signal(signum, frame):
        raise KeyboardInterrupt if signum == signal.SIGINT else SystemExit(128 + signum)

    in_main = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)} \
        if in_main else {}
    try:
        yield
    except (KeyboardInterrupt, SystemExit):
        ended = drill.end_running()
        if ended is not None:
            echo(f"drill: interrupted; ended the run in progress and every process of its job ({ended})")
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _run_drill(drill: Drill, folder: Path, num_processes: int, target: str, echo) -> bool:
    from ...rundir import atomic_write_json

    echo(f"drill: {drill.workdirs.describe()}")
    echo(f"drill: the clean run ({folder / 'clean'})")
    drill.run_clean()
    if drill.clean["state"] != JobState.COMPLETED:
        echo(f"drill: the clean run ended {drill.clean['state']} (exit code {drill.clean['exit_code']}): fix the "
             f"job first; its output is in {folder / 'clean.log'}")
        atomic_write_json(folder / "drill.json", drill.report())
        return False
    drill.plan(num_processes)
    for trial in drill.trials:
        where = f"step {trial.target_step}" if trial.target_step is not None else f"{trial.target_seconds} s"
        echo(f"drill: {trial.fault} at {where} ({trial.point}), rank {trial.rank} ({trial.run_dir})"
             + (f" ({target})" if target != RUN_DEFAULT else ""))
        drill.run_trial(trial)
    atomic_write_json(folder / "drill.json", drill.report())
    echo(drill.scorecard())
    passed = all(t.passed for t in drill.trials)
    echo(f"drill: {'every fault passed' if passed else 'FAILED'}; details: {folder / 'drill.json'}")  # not a state
    return passed
