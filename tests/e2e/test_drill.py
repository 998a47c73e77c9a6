"""`jaxlaunch drill` end to end (issue 34): the tutorial's training job survives a killed rank, a
preemption notice and a hung rank, each injected from outside at a point the seed chooses, with the
same result as its clean run; a careless copy that never checkpoints and ignores notices fails, and
the scorecard says which fault failed and why."""

import json

import pytest

from conftest import EXAMPLES, TEST_JOBS, jaxlaunch

pytestmark = pytest.mark.e2e


def test_the_training_job_passes_the_drill_with_the_three_local_faults(tmp_path):
    folder = tmp_path / "drill"
    result = jaxlaunch("drill", EXAMPLES / "train_data_parallel.yaml", "--set", "params.steps=40",
                       "--set", "params.checkpoint_every=10", "--set", "params.step_seconds=0.05", "--seed", "1",
                       "--run-dir", folder, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads((folder / "drill.json").read_text())
    assert report["passed"] and report["seed"] == 1 and report["clean"]["checkpoint_interval"] == 10
    trials = {t["fault"]: t for t in report["trials"]}
    assert set(trials) == {"kill", "preempt", "hang"}
    assert trials["kill"]["faulted_state"] == "FAILED" and trials["hang"]["faulted_state"] == "TIMEOUT"
    assert trials["preempt"]["faulted_state"] == "PREEMPTED"
    for trial in trials.values():
        assert trial["detected"] and trial["final_state"] == "COMPLETED" and trial["same_result"], trial
        assert trial["detect_seconds"] is not None and trial["recover_seconds"] is not None, trial
        assert trial["steps_lost"] <= 10
    table = result.stderr[result.stderr.index("FAULT"):]
    assert table.count("\nPASS ") == 3 and "every fault passed" in result.stderr


def test_a_job_that_never_checkpoints_and_ignores_notices_fails_the_drill_and_says_why(tmp_path):
    folder = tmp_path / "drill"
    result = jaxlaunch("drill", TEST_JOBS / "careless_train.yaml", "--faults", "preempt,kill", "--seed", "3",
                       "--run-dir", folder, timeout=300)
    assert result.returncode == 1, result.stderr[-4000:]
    report = json.loads((folder / "drill.json").read_text())
    assert not report["passed"] and report["clean"]["checkpoint_interval"] is None
    assert "preempt (preempt-1): the job did not checkpoint and stop on the preemption notice" in result.stderr
    assert "kill (kill-1): " in result.stderr and "the job never checkpoints" in result.stderr
    assert "drill: FAILED" in result.stderr


def test_the_programs_own_hang_at_one_step_is_stopped_by_the_governor_after_two_attempts(tmp_path):
    # seed 5: rank 1 hangs in its report of step 34 on every attempt (max_restarts 3; checkpoints every 10)
    folder = tmp_path / "drill"
    result = jaxlaunch("drill", EXAMPLES / "train_data_parallel.yaml", "--set", "params.steps=40",
                       "--set", "params.checkpoint_every=10", "--set", "params.step_seconds=0.05", "--seed", "5",
                       "--faults", "repeat", "--run-dir", folder, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    trial = json.loads((folder / "drill.json").read_text())["trials"][0]
    assert trial["fault"] == "repeat" and trial["passed"] and trial["attempts"] == 2, trial
    assert trial["governor"].startswith("the program's own hang, twice at the same place after step ")
    assert f"rank {trial['rank']} " in trial["governor"]
    assert "repeat (repeat-1): the governor stopped it after 2 attempts" in result.stderr


def test_an_unknown_fault_is_a_usage_error():
    result = jaxlaunch("drill", EXAMPLES / "train_data_parallel.yaml", "--faults", "meteor")
    assert result.returncode == 2 and "meteor: choose from kill, preempt, hang" in result.stderr


PLAIN = TEST_JOBS / "programs" / "plain_loop.py"


def test_a_drill_on_a_script_that_never_reports_ends_with_a_verdict_for_every_fault(tmp_path):
    """Before: the hang trial waited forever (a job that never reports had no watchdog, and the drill
    waited on its trial without a bound), and the kill trial failed on a missing result.json. Now
    each trial is bounded by twice the clean run plus its fault's allowance; the hang is caught by
    the ranks' stacks; a result neither side set is not compared; the preemption advice is a
    script's (preemption_signal)."""
    import time

    folder = tmp_path / "drill"
    started = time.monotonic()
    result = jaxlaunch("drill", PLAIN, "-n", "2", "--seed", "1", "--run-dir", folder, "--",
                       "--steps", "200", "--step-sleep", "0.03", timeout=400)
    took = time.monotonic() - started
    report = json.loads((folder / "drill.json").read_text())
    trials = {t["fault"]: t for t in report["trials"]}
    assert set(trials) == {"kill", "preempt", "hang"}, result.stderr[-3000:]
    clean = report["clean"]["seconds"]
    assert took < 3 * (2 * clean + 60) + 4 * 5 + 10 + clean + 60, took
    assert trials["hang"]["detected"] and trials["hang"]["faulted_state"] == "TIMEOUT", trials["hang"]
    assert trials["hang"]["blamed"] == [trials["hang"]["rank"]], trials["hang"]
    # issue 51, finding 8: the script starts over after the kill; its output says how far it had come
    kill = trials["kill"]
    assert not kill["passed"] and kill["same_result"] is None and kill["blamed"] == [kill["rank"]], kill
    assert kill["steps_lost_from"] == "output" and kill["steps_lost"] > 0, kill
    assert any(why.startswith("the job started over after the restart") for why in kill["why"]), kill
    assert any("the result was not compared" in note for note in kill["notes"])
    assert not trials["preempt"]["passed"] and any("preemption_signal" in why for why in trials["preempt"]["why"])
    assert result.returncode == 1


def test_interrupting_a_drill_ends_its_trial_with_no_rank_left_stopped(tmp_path):
    """Before: Ctrl-C (or SIGTERM) printed 'Aborted!' and left the trial's jaxlaunch run, its mpirun
    and a SIGSTOPped rank running, reparented to init."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from launcher.supervisor.processes import job_processes

    for signum in (signal.SIGINT, signal.SIGTERM):
        folder = tmp_path / f"drill-{signum}"
        drill = subprocess.Popen([str(Path(sys.executable).parent / "jaxlaunch"), "drill", str(PLAIN), "-n", "2",
                                  "--faults", "hang", "--seed", "1", "--run-dir", str(folder), "--",
                                  "--steps", "300", "--step-sleep", "0.03"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        trial = folder / "hang-1"
        deadline = time.monotonic() + 120

        def stopped_ranks():
            found = []
            for pid in job_processes(trial):
                try:
                    if Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "T":
                        found.append(pid)
                except OSError:
                    pass
            return found

        while not stopped_ranks():
            assert drill.poll() is None and time.monotonic() < deadline, drill.stderr.read().decode()[-3000:]
            time.sleep(0.2)
        drill.send_signal(signum)
        said = drill.communicate(timeout=60)[1].decode()
        assert drill.returncode != 0
        assert "drill: interrupted; ended the run in progress" in said, said[-3000:]
        assert job_processes(trial) == [], f"processes of the trial survive: {job_processes(trial)}"
        assert not stopped_ranks()


def test_the_hang_fault_stops_the_rank_mpirun_started_not_a_worker_of_its_pool(tmp_path):
    """Issue 51, finding 6: with a fork-based ProcessPoolExecutor, 'hang rank N' SIGSTOPped a pool worker
    (the newest process carrying the rank's variables) and the trial still passed. The stopped process's
    parent must be mpirun (prterun) itself."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from launcher.supervisor.processes import command_line, job_processes

    folder = tmp_path / "drill"
    drill = subprocess.Popen([str(Path(sys.executable).parent / "jaxlaunch"), "drill",
                              str(TEST_JOBS / "programs" / "pool_loop.py"), "-n", "2", "--faults", "hang", "--seed", "1",
                              "--run-dir", str(folder), "--", "--steps", "300", "--step-sleep", "0.03"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    trial, deadline, stopped = folder / "hang-1", time.monotonic() + 180, []
    try:
        while not stopped:
            assert drill.poll() is None and time.monotonic() < deadline, drill.stderr.read().decode()[-3000:]
            for pid in job_processes(trial):
                try:
                    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
                except OSError:
                    continue
                if fields[0] == "T":
                    stopped.append((pid, int(fields[1])))
            time.sleep(0.1)
        (pid, parent), = stopped
        assert "launcher.rank.bootstrap" in command_line(pid)  # a worker forked from it has the same command line
        assert os.path.basename(command_line(parent).split()[0]) in ("mpirun", "prterun", "mpiexec"), \
            f"the stopped process {pid} is a child of {command_line(parent)!r}, not of mpirun"
    finally:
        drill.send_signal(signal.SIGINT)  # the rest of the trial is not this test's
        drill.communicate(timeout=60)
    assert job_processes(trial) == []
