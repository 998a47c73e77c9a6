"""The hang watchdog's corpus, end to end under a real mpirun (issue 51): a program written without
jaxlaunch in mind (tests/jobs/stalls.py: mpi4py, subprocess, sockets, JAX) that never reports.

- Twelve legitimate long waits in one run (rank 0 evaluating alone, an upload through a busy child,
  a child moving bytes, a network read that returns, a restore read back in pieces, a host callback,
  a checkpoint write, a worker thread, printed progress, a compile, every rank asleep, one long XLA
  computation on every rank),
  each longer than the split bound: no alarm, at 2 and 8 ranks.
- Ten real hangs, each ended within its bound with the stalled rank named (or no culprit where
  every rank waits alike) and the rule that fired: stopped in a step, in a compile and in a write;
  a loader asleep for ever while its peer polls in mpi4py's allreduce; a lock never released; C code
  holding the GIL; a socket that never answers; a child that never ends; a deadlock between two
  ranks' receives; a rank killed without a word. At 2 and at 8 ranks.

The automatic bounds are scaled (JAXLAUNCH_WATCHDOG_SCALE) so the corpus runs in minutes: the split
bound is 120 s x scale, the together bound 600 s x scale; a stopped rank's 5 s and a silent one's
10 s are not scaled."""

import json
import os
import time

import pytest

from conftest import TEST_JOBS, jaxlaunch
from supervision_helpers import assert_no_process_survives

pytestmark = pytest.mark.e2e
PROGRAM = TEST_JOBS / "stalls.py"
LEGIT_SCALE, LEGIT_SECONDS = 0.04, 7.0   # split bound 4.8 s: every wait outlasts it
HANG_SCALE = 0.02                        # split 2.4 s, together 12 s


def run_stalls(tmp_path, ranks, scale, *args, timeout=300):
    run_dir = tmp_path / "run"
    env = {**os.environ, "JAXLAUNCH_WATCHDOG_SCALE": str(scale), "STALLS_DIR": str(tmp_path)}
    result = jaxlaunch("run", PROGRAM, "-n", ranks, "--run-dir", run_dir, "--", *args, timeout=timeout, env=env)
    return result, run_dir


@pytest.mark.parametrize("ranks", [2, 8])
def test_legitimate_long_waits_raise_no_alarm(tmp_path, ranks):
    result, run_dir = run_stalls(tmp_path, ranks, LEGIT_SCALE, "--legit", LEGIT_SECONDS, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "every legitimate wait ended" in result.stdout
    assert "stopping the job" not in result.stderr
    cases = [line.split("case ")[1] for line in result.stdout.splitlines() if "] case " in line]
    assert len(cases) == 12, cases


# name -> (the rule that fires, the culprits named, the bound it must be ended within after the stall)
SPLIT, TOGETHER, STOPPED, SILENT = 120 * HANG_SCALE, 600 * HANG_SCALE, 5.0, 10.0
HANGS = {
    "stopped_step": ("stopped", [1], STOPPED),
    "stopped_compile": ("stopped", [1], STOPPED),
    "stopped_write": ("stopped", [1], STOPPED),
    "loader": ("split", [1], SILENT),  # its peer polls with the GIL held: silent, then out-voted
    "lock": ("split", [1], SPLIT),
    "gil": ("silent", [1], SILENT),
    "network": ("together", [1], TOGETHER),
    "child": ("together", [1], TOGETHER),
    "deadlock": ("together", [], TOGETHER),
}


def assert_caught(tmp_path, result, run_dir, name):
    rule, culprits, bound = HANGS[name]
    assert result.returncode == 124, result.stderr[-4000:]
    failure = json.loads((run_dir / "failure.json").read_text())
    assert failure["reason"] == "hang" and f"rule: {rule}" in failure["summary"], failure["summary"]
    roll = failure["hang"]["roll_call"]
    assert [c["rank"] for c in roll["culprits"]] == culprits, (roll, failure["summary"])
    if culprits:
        assert "rank 1 on" in failure["summary"] and "held it up" in failure["summary"], failure["summary"]
    stalled = tmp_path / "stalled"
    if stalled.exists():  # the deadlock has no one rank that stalls
        ended = (run_dir / "status.json").stat().st_mtime
        took = ended - float(stalled.read_text().split()[0])
        assert took < bound + 20, f"{name}: ended {took:.1f} s after the stall (bound {bound:.1f} s)"
    assert_no_process_survives(run_dir)


@pytest.mark.parametrize("name", list(HANGS))
def test_a_real_hang_is_caught_within_its_bound_naming_the_stalled_rank(tmp_path, name):
    result, run_dir = run_stalls(tmp_path, 2, HANG_SCALE, "--hang", name, timeout=240)
    assert_caught(tmp_path, result, run_dir, name)


@pytest.mark.parametrize("name", list(HANGS))
def test_a_real_hang_at_8_ranks_is_caught_naming_the_stalled_rank(tmp_path, name):
    result, run_dir = run_stalls(tmp_path, 8, HANG_SCALE, "--hang", name, timeout=300)
    assert_caught(tmp_path, result, run_dir, name)


@pytest.mark.parametrize("ranks", [2, 8])
def test_a_rank_dead_without_a_word_ends_the_job_at_once_naming_it(tmp_path, ranks):
    started = time.monotonic()
    result, run_dir = run_stalls(tmp_path, ranks, HANG_SCALE, "--hang", "killed", timeout=240)
    assert result.returncode not in (0, 124), result.stderr[-4000:]
    failure = json.loads((run_dir / "failure.json").read_text())
    assert failure["first_failure"]["rank"] == 1 and failure["first_failure"]["signal"] == "SIGKILL", failure
    assert time.monotonic() - started < 120
    assert_no_process_survives(run_dir)
