"""explain and submit's check against the real local Slurm cluster (2 nodes x 2 CPUs, no GPUs)."""

import subprocess

import pytest

from conftest import EXAMPLES, jaxlaunch

pytestmark = pytest.mark.slurm
SPEC = EXAMPLES / "normalize.yaml"


def jobs_in_queue(slurm_env):
    return subprocess.run(["squeue", "--noheader", "--format=%i"], env=slurm_env, capture_output=True, text=True,
                          check=True, timeout=30).stdout.split()


def test_a_request_that_fits_is_said_to(slurm_env):
    result = jaxlaunch("explain", SPEC, "--target", "slurm", "--set", "nodes=2", env=slurm_env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.rstrip().endswith("the request fits the cluster")


def test_explain_says_a_requeue_waits_the_clusters_delay_on_a_slurm_without_expedite(slurm_env, slurm_cluster):
    result = jaxlaunch("explain", SPEC, "--target", "slurm", "--set", "slurm.max_requeues=2", env=slurm_env)
    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stdout.splitlines() if line.startswith("requeue:"))
    assert line.startswith(f"requeue: up to 2 times; each requeued attempt waits {slurm_cluster.cred_expire} s "
                           f"(AuthInfo cred_expire)"), line
    assert "has no --requeue=expedite" in line


def test_more_nodes_than_the_partition_has_is_refused_with_the_fix(slurm_env):
    result = jaxlaunch("explain", SPEC, "--target", "slurm", "--set", "nodes=3", env=slurm_env)
    assert result.returncode == 2
    assert "refused: 3 nodes requested; partition 'debug' has 2. Fix: --set nodes=2 or less" in result.stdout


def test_submit_refuses_gpus_the_partition_lacks_before_sbatch(slurm_env, tmp_path):
    before = jobs_in_queue(slurm_env)
    result = jaxlaunch("submit", SPEC, "--set", "platform=gpu", "--set", "slurm.gpus_per_node=4",
                       "--run-dir", tmp_path / "run", env=slurm_env)
    assert result.returncode == 2
    assert result.stderr.startswith("Error: the request does not fit the cluster; nothing was submitted:\n")
    assert "partition 'debug' has no GPUs (no gpu gres on its nodes). Fix: --set slurm.partition=" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists() and jobs_in_queue(slurm_env) == before


def test_a_sweep_is_refused_with_every_configuration_that_cannot_fit(slurm_env, tmp_path):
    before = jobs_in_queue(slurm_env)
    result = jaxlaunch("submit", SPEC, "--sweep", "nodes=1,3", "--sweep", "processes_per_node=1,4",
                       "--run-dir", tmp_path / "sweep", env=slurm_env)
    assert result.returncode == 2, result.stderr
    assert "3 nodes requested; partition 'debug' has 2." in result.stderr
    assert "4 CPUs per node requested (4 processes x 1 cpus_per_task); nodes of 'debug' have 2." in result.stderr
    assert result.stderr.count("3 nodes requested") == 1  # two configurations, one problem: said once
    assert not (tmp_path / "sweep").exists() and jobs_in_queue(slurm_env) == before


def test_an_unknown_partition_is_refused_naming_the_ones_that_exist(slurm_env, tmp_path):
    result = jaxlaunch("submit", SPEC, "--set", "slurm.partition=nosuchpartition", "--run-dir", tmp_path / "run",
                       env=slurm_env)
    assert result.returncode == 2
    assert "partition 'nosuchpartition' does not exist; this cluster has debug, urgent, wide. Fix: --set " \
           "slurm.partition=NAME with one of them" in result.stderr
    assert not (tmp_path / "run").exists()


def test_too_many_cpus_per_node_is_refused(slurm_env, tmp_path):
    result = jaxlaunch("submit", SPEC, "--set", "processes_per_node=2", "--set", "slurm.cpus_per_task=2",
                       "--run-dir", tmp_path / "run", env=slurm_env)
    assert result.returncode == 2
    assert "4 CPUs per node requested (2 processes x 2 cpus_per_task); nodes of 'debug' have 2" in result.stderr


def test_python_api_submit_wait_result_logs(slurm_env, tmp_path, monkeypatch):
    import launcher

    for key, value in slurm_env.items():
        monkeypatch.setenv(key, value)
    job = launcher.submit(SPEC, overrides=["nodes=2"], run_dir=tmp_path / "run")
    assert job.id.isdigit() and job.warnings == []
    assert job.wait(timeout=120) == "COMPLETED"
    assert job.result()["processes"] == 2
    assert "COMPLETED" in job.logs() and "[rank 1]" in job.logs()
    assert launcher.job(job.id).state() == "COMPLETED"
    with pytest.raises(launcher.errors.UsageError, match="does not fit the cluster"):
        launcher.submit(SPEC, overrides=["nodes=3"], run_dir=tmp_path / "other")
