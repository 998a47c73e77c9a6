"""The Slurm backend against the real local cluster: polite polling (scheduler calls counted by
wrappers around the real commands), srun jobs from a login node without mpirun, and a broken
setup line refused before sbatch."""

import subprocess
import threading

import pytest

from conftest import EXAMPLES, jaxlaunch
from slurm_call_counter import SlurmCallCounter

pytestmark = pytest.mark.slurm
HELD = ["--set", "slurm.extra=['--hold']"]  # queued but never started: cheap, and PENDING throughout


@pytest.fixture
def counter(tmp_path):
    return SlurmCallCounter(tmp_path / "count")


def scancel(slurm_env, *ids):
    subprocess.run(["scancel", *ids], env=slurm_env, timeout=60, check=True)


def test_status_of_50_jobs_makes_at_most_3_scheduler_calls(slurm_env, counter, tmp_path):
    ids = []
    for number in range(50):
        result = jaxlaunch("submit", EXAMPLES / "trivial.yaml", "--parsable", "--no-check", *HELD,
                           "--run-dir", tmp_path / f"run{number}", env=slurm_env)
        assert result.returncode == 0, result.stderr
        ids.append(result.stdout.strip())
    try:
        counter.reset()
        result = jaxlaunch("status", *ids, env=counter.env(slurm_env))
        assert result.returncode == 0, result.stderr
        rows = result.stdout.splitlines()[2:]
        assert [row.split()[0] for row in rows] == ids
        assert all(row.split()[1:3] == ["PENDING", "(JobHeldUser)"] for row in rows)
        calls = counter.calls()
        print(f"jaxlaunch status of 50 held jobs: {dict(calls)}")  # before the watcher: 50 squeue calls
        assert sum(calls.values()) <= 3, calls
    finally:
        scancel(slurm_env, *ids)
    # finished jobs (squeue still lists them as CANCELLED) and an id nobody knows: still at most 3
    counter.reset()
    result = jaxlaunch("status", *ids, "999999", env=counter.env(slurm_env))
    assert result.returncode == 2 and "no job 999999 known" in result.stderr
    assert sum(counter.calls().values()) <= 3, counter.calls()


def test_twenty_handles_waiting_on_an_array_share_their_queries(slurm_env, counter, tmp_path, monkeypatch):
    """A notebook waiting on every task of a 20-task array: one batched, backing-off watcher."""
    import launcher

    result = jaxlaunch("submit", EXAMPLES / "trivial.yaml", "--parsable", "--no-check", *HELD,
                       "--sweep", "params.x=range(20)", "--run-dir", tmp_path / "sweep", env=slurm_env)
    assert result.returncode == 0, result.stderr
    array = result.stdout.strip()
    try:
        for key, value in counter.env(slurm_env).items():
            monkeypatch.setenv(key, value)
        jobs = [launcher.job(f"{array}_{i}") for i in range(20)]
        counter.reset()
        seconds = 15

        def wait(job):
            with pytest.raises(TimeoutError):
                job.wait(timeout=seconds)
        threads = [threading.Thread(target=wait, args=(job,)) for job in jobs]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        calls = counter.calls()
        print(f"20 handles waiting {seconds} s: {dict(calls)} ({sum(calls.values()) * 60 / seconds:.0f} per minute)")
        # before the watcher: every handle ran squeue every 0.5 s, ~2,500 calls a minute
        assert calls["squeue"] >= 1 and sum(calls.values()) <= 20, calls
        assert all(job.state() == "PENDING" for job in jobs)
    finally:
        scancel(slurm_env, array)


def test_an_srun_job_submits_and_runs_from_a_login_node_without_mpirun(slurm_env, tmp_path, monkeypatch):
    import launcher
    from launcher.errors import UsageError

    for key, value in slurm_env.items():
        monkeypatch.setenv(key, value)

    def no_mpirun():
        raise UsageError("mpirun not found")
    monkeypatch.setattr("launcher.backends.slurm.submission.find_mpirun", no_mpirun)
    job = launcher.submit(EXAMPLES / "normalize.yaml", overrides=["nodes=2", "slurm.launch=srun"],
                          run_dir=tmp_path / "run")
    assert job.wait(timeout=180) == "COMPLETED", job.logs()
    assert abs(sum(job.result()["values"]) - 1) < 1e-6
    assert "mpirun" not in (tmp_path / "run" / "job.sbatch").read_text()


def test_a_broken_setup_line_is_refused_before_sbatch(slurm_env, counter, tmp_path):
    result = jaxlaunch("submit", EXAMPLES / "trivial.yaml", "--set", "setup=['module load x', 'echo \"oops']",
                       "--run-dir", tmp_path / "run", env=counter.env(slurm_env))
    assert result.returncode == 2
    assert result.stderr.startswith("Error: setup[1] ('echo \"oops') is not valid bash: unexpected EOF")
    assert counter.calls()["sbatch"] == 0 and not (tmp_path / "run").exists()
