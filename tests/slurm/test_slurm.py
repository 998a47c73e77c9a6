"""End to end on a real two-node Slurm cluster started on this machine (tests/slurm_cluster.py)."""

import json
import re
import shlex
import shutil
import subprocess
import time

import numpy as np
import pytest

from conftest import BENCHMARKS, EXAMPLES, TEST_JOBS, jaxlaunch
from launcher.rundir.metrics import read_lines
from preemption_helpers import interrupt_when, start
from straggler_delay import slow_rank_delay

pytestmark = pytest.mark.slurm


def run_ok(*args, env, timeout=240):
    result = jaxlaunch(*args, env=env, timeout=timeout)
    assert result.returncode == 0, f"{args}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    return result


def read_values(run_dir):
    return json.loads((run_dir / "result.json").read_text())["values"]


@pytest.mark.parametrize("launch", ["mpirun", "srun"])
def test_normalize_on_two_nodes(slurm_env, tmp_path, launch):
    run_dir = tmp_path / "run"
    result = run_ok("submit", EXAMPLES / "normalize.yaml", "--set", "nodes=2", "--set", f"slurm.launch={launch}",
                    "--wait", "--run-dir", run_dir, env=slurm_env)
    job_id = re.search(r"Submitted job (\S+?);", result.stderr).group(1)
    assert result.stderr.startswith(f"Submitted job {job_id}; run directory: {run_dir}\n")
    assert f"job {job_id}: COMPLETED" in result.stderr
    assert json.loads(result.stdout) == json.loads((run_dir / "result.json").read_text())  # the result on stdout
    values = read_values(run_dir)
    assert len(values) == 4 and len(set(values)) == 4
    assert abs(sum(values) - 1) < 1e-6
    np.testing.assert_allclose(values, np.arange(1, 5) / 10, rtol=1e-6)
    assert sorted(p.name for p in (run_dir / "logs").glob("rank-*.log")) == ["rank-0.log", "rank-1.log"]
    # both ranks on different nodes: the batch output carries both rank prefixes
    out = (run_dir / f"slurm-{job_id}.out").read_text()
    assert "[rank 0]" in out and "[rank 1]" in out
    # no PMIx help-file noise in srun mode (PMIX_SECURITY_MODE=native, see slurm/render.py)
    assert "help file" not in out and "PMIX ERROR" not in out and "not-valid" not in out

    status = run_ok("status", job_id, env=slurm_env).stdout.splitlines()
    assert status[0].split() == ["JOBID", "STATE", "ELAPSED/LIMIT", "NODES", "RUN", "DIR"]
    assert status[2].split()[:2] == [job_id, "COMPLETED"] and status[2].split()[3:] == ["2", str(run_dir)]
    assert json.loads((run_dir / "status.json").read_text())["state"] == "COMPLETED"

    rank1 = run_ok("logs", job_id, "--rank", "1", env=slurm_env).stdout
    assert "entrypoint finished" in rank1


def test_failing_rank_fails_the_job(slurm_env, tmp_path):
    started = time.monotonic()
    result = jaxlaunch("submit", TEST_JOBS / "fail_on_rank.yaml", "--set", "nodes=2", "--set", "processes_per_node=1",
                       "--wait", "--run-dir", tmp_path / "run", env=slurm_env, timeout=240)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAILED" in result.stderr
    assert time.monotonic() - started < 60
    assert "InjectedFailure: rank 1 failed on purpose" in (tmp_path / "run" / "logs" / "rank-1.error").read_text()
    assert not (tmp_path / "run" / "result.json").exists()


def test_cancel_a_sleeping_job(slurm_env, slurm_cluster, tmp_path):
    job_id = run_ok("submit", TEST_JOBS / "fail_on_rank.yaml", "--parsable", "--set", "entrypoint=fail_on_rank.py:sleep",
                    "--set", "params.seconds=300", "--set", "processes_per_node=1",
                    "--run-dir", tmp_path / "run", env=slurm_env).stdout.strip()
    assert job_id.isdigit()
    deadline = time.monotonic() + 60
    while slurm_cluster.job_state(int(job_id)) != "RUNNING":
        assert time.monotonic() < deadline, "job never started"
        time.sleep(0.2)
    started = time.monotonic()
    assert run_ok("cancel", job_id, env=slurm_env).stdout == f"cancelled job {job_id}\n"
    while not (slurm_cluster.job_state(int(job_id)) or "").startswith("CANCELLED"):
        assert time.monotonic() - started < 10, "not CANCELLED within 10 s"
        time.sleep(0.1)
    assert run_ok("status", job_id, env=slurm_env).stdout.splitlines()[2].split()[1] == "CANCELLED"


def test_run_backend_slurm_follows_the_job_and_ctrl_c_cancels_it(slurm_env, slurm_cluster, tmp_path):
    """`run` shares submit's start path (cli/start_job.py) over any backend: on Slurm it submits and
    follows the job in the foreground, the result on stdout and the job's exit code; Ctrl-C
    cancels the job, as it ends a local run's (submit --wait's only stops following)."""
    run_dir = tmp_path / "run"
    result = run_ok("run", EXAMPLES / "normalize.yaml", "--set", "nodes=2", "--backend", "slurm", "--run-dir", run_dir,
                    env=slurm_env)
    assert json.loads(result.stdout) == json.loads((run_dir / "result.json").read_text())
    job_id = re.search(r"Submitted job (\d+);", result.stderr).group(1)
    assert f"job {job_id}: COMPLETED" in result.stderr

    process = start("run", TEST_JOBS / "fail_on_rank.yaml", "--backend", "slurm", "--set", "entrypoint=fail_on_rank.py:sleep",
                    "--set", "params.seconds=300", "--set", "processes_per_node=1", "--run-dir", tmp_path / "sleep",
                    env=slurm_env)
    status = tmp_path / "sleep" / "status.json"
    out, err = interrupt_when(process, lambda: status.exists() and json.loads(status.read_text()).get("state") == "RUNNING",
                              "the job never started")
    assert process.returncode == 130, err
    sleeping = re.search(r"Submitted job (\d+);", err).group(1)
    assert f"jaxlaunch: interrupted: cancelling job {sleeping}" in err
    deadline = time.monotonic() + 30
    while not (slurm_cluster.job_state(int(sleeping)) or "").startswith("CANCELLED"):
        assert time.monotonic() < deadline, "not CANCELLED within 30 s"
        time.sleep(0.2)


def test_sbatch_rejection_shows_sbatch_message(slurm_env, tmp_path):
    # --no-check: jaxlaunch's own check would refuse the partition first (test_slurm_explain.py)
    result = jaxlaunch("submit", EXAMPLES / "normalize.yaml", "--set", "slurm.partition=nosuchpartition",
                       "--run-dir", tmp_path / "run", "--no-check", env=slurm_env)
    assert result.returncode == 1
    assert "Error: command failed (exit code 1): sbatch --parsable" in result.stderr
    assert "invalid partition" in result.stderr.lower()
    assert "Traceback" not in result.stderr
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert status["state"] == "SUBMIT_FAILED" and "invalid partition" in status["error"].lower()
    assert not (tmp_path / "run" / "result.json").exists()


def test_logs_follow_until_the_job_ends(slurm_env, tmp_path):
    job_id = run_ok("submit", TEST_JOBS / "fail_on_rank.yaml", "--parsable", "--set", "entrypoint=fail_on_rank.py:sleep",
                    "--set", "params.seconds=2", "--set", "processes_per_node=1",
                    "--run-dir", tmp_path / "run", env=slurm_env).stdout.strip()
    followed = run_ok("logs", job_id, "-f", env=slurm_env, timeout=120).stdout
    assert "[rank 0] sleeping 2 s" in followed and "entrypoint finished" in followed
    assert json.loads((tmp_path / "run" / "result.json").read_text()) == {"slept": 2}


def test_hostile_values_run_nothing(slurm_env, tmp_path):
    """A job whose env, directives, params and run directory carry shell syntax runs, and nothing in them executes."""
    import yaml
    marker = tmp_path / "PWNED"
    hostile = f"$(touch {marker}) `touch {marker}` ; touch {marker} 'q' \"dq\" \\ ✓ ü " + "x" * 10_000
    spec = tmp_path / "hostile.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "hostile", "entrypoint": f"{TEST_JOBS / 'fail_on_rank.py'}:report", "nodes": 2,
        "env": {"JOBTEST_VALUE": hostile}, "params": {"text": hostile},
        "slurm": {"extra": [f"--comment={hostile[:500]}"]},
    }, allow_unicode=True))
    run_dir = tmp_path / "run dir ;$x `y`"
    run_ok("submit", spec, "--wait", "--run-dir", run_dir, env=slurm_env)
    from launcher import load_result
    result = load_result(run_dir)
    assert result["env"] == {"JOBTEST_VALUE": hostile} and result["params"] == {"text": hostile}
    assert not marker.exists()
    subprocess.run(["bash", "-n", str(run_dir / "job.sbatch")], check=True)


def test_unknown_job_id(slurm_env):
    result = jaxlaunch("logs", "999999", env=slurm_env)
    assert result.returncode == 2
    assert result.stderr.startswith("Error: no job 999999 known to Slurm or to jaxlaunch")
    assert "fix: check the id with `squeue --me`" in result.stderr


# --- supervision inside the batch job -------------------------------------------------------

from supervision_helpers import FAIL_FAST, assert_no_process_survives, assert_root_cause, misbehave  # noqa: E402

MISBEHAVE = TEST_JOBS / "misbehave.yaml"


@pytest.mark.parametrize("launch", ["mpirun", "srun"])
@pytest.mark.parametrize("how", sorted(FAIL_FAST))
def test_fail_fast_matrix_on_slurm(slurm_env, tmp_path, launch, how):
    """As locally: rank 1 (on node2) fails while rank 0 waits in allreduce; the batch job's
    supervisor writes failure.json, and --wait shows the root cause."""
    run_dir = tmp_path / "run"
    exe = jaxlaunch_path()
    process = subprocess.Popen([exe, "submit", str(MISBEHAVE), "--wait", "--run-dir", str(run_dir),
                                "--set", f"params.how={how}", "--set", "nodes=2", "--set", "processes_per_node=1",
                                "--set", f"slurm.launch={launch}"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=slurm_env)
    failed_at = misbehave(run_dir, how, timeout=120)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 1, err
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "FAILED" and status["ended"] - failed_at < 10, (status, failed_at)
    assert_no_process_survives(run_dir, within=10)
    failure = assert_root_cause(run_dir, how)
    assert f"FAILED: rank 1 on {failure['first_failure']['host']} failed first" in err
    if how in ("raise", "exit3"):
        assert failure["first_failure"]["host"] == "node2"


def jaxlaunch_path():
    import os
    import sys
    return os.path.join(os.path.dirname(sys.executable), "jaxlaunch")


def test_timeout_is_enforced_inside_the_batch_job_with_a_hang_report(slurm_env, tmp_path):
    """timeout=10 s stops the job at 10 s (Slurm's own limit would be a whole minute later),
    with every rank's stacks and the one-line-per-rank report."""
    run_dir = tmp_path / "run"
    result = jaxlaunch("submit", MISBEHAVE, "--wait", "--run-dir", run_dir, "--set", "params.how=hang",
                       "--set", "timeout=10", "--set", "nodes=2", "--set", "processes_per_node=1",
                       env=slurm_env, timeout=180)
    assert result.returncode == 124, result.stderr  # as `jaxlaunch run`
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "TIMEOUT" and status["exit_code"] == 124
    assert status["ended"] - status["started"] < 20
    assert "TIMEOUT: timed out after 10 s" in result.stderr
    assert "in allreduce #2" in result.stderr and "stuck_outside_collectives" in result.stderr
    job_id = re.search(r"Submitted job (\S+?);", result.stderr).group(1)
    shown = run_ok("status", job_id, env=slurm_env).stdout
    assert shown.splitlines()[2].split()[1] == "TIMEOUT"
    assert f"job {job_id} TIMEOUT: timed out after 10 s" in shown
    logs = jaxlaunch("logs", job_id, env=slurm_env)
    assert "jaxlaunch: stacks of rank" in (run_dir / "logs" / "rank-1.log").read_text()
    assert "TIMEOUT: timed out after 10 s" in logs.stderr


@pytest.mark.parametrize("launch, case", [("srun", "device"), ("mpirun", "host"), ("srun", "in_flight")])
def test_the_watchdog_names_a_rank_that_never_reaches_the_first_collective_on_slurm(slurm_env, tmp_path, launch,
                                                                                  case):
    """As locally (tests/e2e/test_supervision.py): rank 1, on node2, stalls before the job's first
    collective; rank 0's watchdog names it within collective_timeout, long before `timeout`."""
    run_dir = tmp_path / "run"
    result = jaxlaunch("submit", MISBEHAVE, "--wait", "--run-dir", run_dir, "--set", "nodes=2",
                       "--set", "processes_per_node=1", "--set", f"slurm.launch={launch}",
                       "--set", "entrypoint=misbehave.py:hang_before_the_first_collective",
                       "--set", f"params.case={case}", "--set", "collective_timeout=3", env=slurm_env, timeout=180)
    assert result.returncode == 124, result.stderr
    failure = json.loads((run_dir / "failure.json").read_text())
    assert failure["reason"] == "collective_timeout", failure
    assert failure["hang"]["collective"]["seq"] == 1 and failure["hang"]["never_arrived"] == [1]
    assert failure["hang"]["collective"]["seconds"] < 3 + 1.5
    status = json.loads((run_dir / "status.json").read_text())
    assert status["ended"] - status["started"] < 60  # the spec's timeout is 2 minutes


def test_status_of_a_failed_job_names_the_rank(slurm_env, tmp_path):
    run_dir = tmp_path / "run"
    result = jaxlaunch("submit", MISBEHAVE, "--wait", "--run-dir", run_dir, "--set", "nodes=2",
                       "--set", "processes_per_node=1", env=slurm_env, timeout=180)
    assert result.returncode == 1
    job_id = re.search(r"Submitted job (\S+?);", result.stderr).group(1)
    shown = run_ok("status", job_id, env=slurm_env).stdout
    assert f"job {job_id} FAILED: rank 1 on node2 failed first: RuntimeError: rank 1 failed on purpose" in shown


def test_unknown_job_ids_and_ranks_are_exit_2_on_a_real_cluster(slurm_env, tmp_path):
    """scancel exits 0 for a job id it does not know; jaxlaunch must not say it cancelled anything."""
    for command in (["cancel", "999999"], ["status", "999999"], ["logs", "999999"]):
        result = jaxlaunch(*command, env=slurm_env)
        assert result.returncode == 2, (command, result.stdout, result.stderr)
        assert "999999" in result.stderr and "Traceback" not in result.stderr
        assert "cancelled" not in result.stdout
    job_id = run_ok("submit", TEST_JOBS / "fail_on_rank.yaml", "--parsable", "--set", "entrypoint=fail_on_rank.py:sleep",
                    "--set", "params.seconds=1", "--set", "processes_per_node=1", "--run-dir", tmp_path / "run",
                    env=slurm_env).stdout.strip()
    for rank in ("-1", "1"):
        result = jaxlaunch("logs", job_id, "--rank", rank, env=slurm_env)
        assert result.returncode == 2 and f"--rank {rank}: job {job_id} has 1 rank: 0." in result.stderr


def test_the_overhead_benchmark_runs_as_the_readme_quotes_it(slurm_env, tmp_path):
    """`jaxlaunch run jobs/benchmarks/bench_launch.yaml --set params.submit=true` against the cluster, one pair
    each: the job docs/benchmarks.md's overhead figures come from keeps working (no timing is asserted)."""
    result = jaxlaunch("run", BENCHMARKS / "bench_launch.yaml", "--set", "params.submit=true", "--set",
                       "params.repeats=1", "--run-dir", tmp_path / "run", env=slurm_env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    bench = json.loads((tmp_path / "run" / "bench.json").read_text())
    assert set(bench["medians"]) == {"launch", "submit"}
    assert set(bench["medians"]["submit"]) == {"sbatch", "jaxlaunch submit"}
    assert all(seconds > 0 for pair in bench["medians"].values() for seconds in pair.values())
    assert "| submit: sbatch vs jaxlaunch submit |" in result.stdout


def test_status_shows_the_progress_of_a_running_slurm_job(slurm_env, tmp_path):
    run_dir = tmp_path / "run"
    submitted = run_ok("submit", EXAMPLES / "train_data_parallel.yaml", "--set", "params.steps=80",
                       "--set", "params.step_seconds=0.1", "--parsable", "--run-dir", run_dir, env=slurm_env)
    job_id = submitted.stdout.strip()
    deadline = time.monotonic() + 120
    shown = ""
    while "steps/s" not in shown or "rank 1:" not in shown:  # rank 1 reports every 2 s
        assert time.monotonic() < deadline, shown
        time.sleep(0.5)
        shown = jaxlaunch("status", job_id, "-v", env=slurm_env).stdout
    print(shown)
    assert f"job {job_id} step " in shown and "/80 (" in shown and "ETA" in shown and "loss=" in shown
    assert "rank 0:" in shown and "rank 1:" in shown
    assert "RUNNING" in shown
    if shutil.which("tmux") is None:
        run_ok("cancel", job_id, env=slurm_env)
        pytest.skip("tmux is not installed: watch not tested")
    # jaxlaunch watch in a real terminal, until the job ends
    session = f"jaxlaunch-watch-slurm-{job_id}"
    command = shlex.join([jaxlaunch_path(), "watch", job_id, "--interval", "0.5"])
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in slurm_env.items() if k in ("SLURM_CONF", "JAXLAUNCH_HOME",
                                                                                      "PATH"))
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "110", "-y", "20",
                    f"env {exports} {command}; echo WATCH-EXIT=$?; sleep 60"], check=True)
    try:
        screens = []
        while not screens or "WATCH-EXIT=" not in screens[-1]:
            assert time.monotonic() < deadline + 120, screens[-1:]
            time.sleep(0.5)
            screens.append(subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True,
                                          text=True).stdout)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
    running = next((screen for screen in screens if "RUNNING" in screen and "steps/s" in screen), None)
    print(running, screens[-1])
    assert running is not None and f"slurm job {job_id}" in running and "ETA" in running
    assert "COMPLETED" in screens[-1] and "WATCH-EXIT=0" in screens[-1]


@pytest.mark.parametrize("launch", ["srun", "mpirun"])
def test_the_slow_rank_is_named_and_nobody_without_one(slurm_env, tmp_path, launch):
    """Rank 1 sleeps longer per step (as a throttled GPU would make it): status and the job's summary
    name it; the same job without the sleep names nobody. The even job runs first: its step times
    size the delay (50 ms on a quiet machine, more where the others' steps vary more than that)."""
    shown, delay = {}, None
    for case in ("even", "slow"):
        extra = [] if case == "even" else ["--set", "params.slow_rank=1", "--set", f"params.slow_seconds={delay:.3f}"]
        run_dir = tmp_path / case
        result = run_ok("submit", EXAMPLES / "train_data_parallel.yaml", "--set", "params.steps=60",
                        "--set", f"slurm.launch={launch}", *extra, "--wait", "--run-dir", run_dir, env=slurm_env)
        job_id = re.search(r"Submitted job (\S+?);", result.stderr).group(1)
        shown[case] = jaxlaunch("status", job_id, env=slurm_env).stdout
        shown[case + " output"] = (run_dir / f"slurm-{job_id}.out").read_text()
        if case == "even":
            reports = [line["time"] for line in read_lines(run_dir / "metrics.jsonl") if line.get("kind") == "metrics"]
            delay = slow_rank_delay(reports)
    print(f"slow rank's delay: {delay * 1e3:.0f} ms", shown["slow"])
    assert "slow rank: rank 1 (node2) arrived last at " in shown["slow"]
    assert "jaxlaunch: slow rank: rank 1 (node2) arrived last at " in shown["slow output"]
    assert "slow rank" not in shown["even"] and "slow rank" not in shown["even output"]


def test_a_percent_in_the_run_directory_reaches_slurm_as_itself(slurm_env, tmp_path):
    """Slurm expands %u, %j... in --output: the log of a run directory named `50%u` went to `50root`
    (issue 30). Doubled, it lands in the run directory, where `jaxlaunch logs` reads it."""
    run_dir = tmp_path / "50%u_run"
    job_id = run_ok("submit", EXAMPLES / "normalize.yaml", "--parsable", "--run-dir", run_dir,
                    env=slurm_env).stdout.strip()
    deadline = time.monotonic() + 120
    while json.loads((run_dir / "status.json").read_text())["state"] not in ("COMPLETED", "FAILED"):
        assert time.monotonic() < deadline, "the job did not end"
        time.sleep(0.5)
    assert (run_dir / f"slurm-{job_id}.out").exists()
    assert not list(tmp_path.glob("50root*"))
    assert "values" in run_ok("logs", job_id, env=slurm_env).stdout
