"""Bad nodes left behind, and 16 ranks, on the local 8-node Slurm cluster (`wide` partition).

A node that fails under a job (here: `scontrol update state=down`, as an admin or Slurm's health
check would) ends the job step; the supervisor requeues the job with that node in its
ExcNodeList, and the job resumes from its checkpoint elsewhere. The same for a node that fails
the spec's slurm.health_check before the ranks start."""

import contextlib
import json
import subprocess
import time

import pytest

from conftest import EXAMPLES, TEST_JOBS, jaxlaunch
from preemption_helpers import (TRAIN, TRAIN_SETTINGS, assert_same_training, events, load_result,
                                wait_for_checkpoint, wait_for_end, what_happened)
from supervision_helpers import assert_no_process_survives

pytestmark = pytest.mark.slurm

WIDE = ["--set", "slurm.partition=wide"]


def submit(slurm_env, spec, run_dir, *settings):
    result = jaxlaunch("submit", spec, *WIDE, *settings, "--parsable", "--run-dir", run_dir, env=slurm_env,
                       timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def job_record(slurm_cluster, job_id) -> dict:
    return slurm_cluster.show_job(job_id) or {}


def settled_job_record(slurm_cluster, job_id, timeout: float = 30) -> dict:
    """Slurm's record once the job is out of COMPLETING: the supervisor's word (status.json, what
    `jaxlaunch status` shows) comes before slurmctld has cleaned the job's steps up (CI, 2026-11-27:
    COMPLETING when the test asked)."""
    deadline = time.monotonic() + timeout
    while (record := job_record(slurm_cluster, job_id)).get("JobState") == "COMPLETING":
        assert time.monotonic() < deadline, f"job {job_id} still COMPLETING after {timeout} s"
        time.sleep(0.2)
    return record


@contextlib.contextmanager
def node_down(slurm_cluster, node):
    """`node` DOWN (as an admin or Slurm's health check would set it), RESUMEd afterwards."""
    slurm_cluster.run("scontrol", "update", f"nodename={node}", "state=down", "reason=jaxlaunch-test")
    try:
        yield
    finally:
        slurm_cluster.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)


def hostnames(slurm_cluster, nodelist) -> list[str]:
    return slurm_cluster.run("scontrol", "show", "hostnames", nodelist).stdout.split()


# srun only (40 s a run): mpirun's side of a node failure (its step failing, the node found lost, the
# ranks started again on named nodes) is the spare-node test's [mpirun], and the requeue after it does
# not depend on the launcher.
@pytest.mark.parametrize("launch", ["srun"])
def test_a_node_failed_mid_job_is_left_behind_and_the_job_completes(slurm_env, slurm_cluster, tmp_path, reference,
                                                                    launch):
    run_dir = tmp_path / "run"
    job_id = submit(slurm_env, TRAIN, run_dir, *TRAIN_SETTINGS, "--set", f"slurm.launch={launch}")
    wait_for_checkpoint(run_dir, 20)
    record = job_record(slurm_cluster, job_id)
    first_nodes = hostnames(slurm_cluster, record["NodeList"])
    victim = next(node for node in first_nodes if node != record["BatchHost"])  # a rank's node, not ours
    with node_down(slurm_cluster, victim):
        state = wait_for_end(slurm_env, job_id)
        assert state == "COMPLETED", what_happened(run_dir)
    assert_same_training(load_result(run_dir), reference)
    status = json.loads((run_dir / "status.json").read_text())
    assert status["excluded_nodes"] == [victim] and status["node_failures"] == 1 and status["requeues"] == 1
    final = job_record(slurm_cluster, job_id)
    assert victim in hostnames(slurm_cluster, final["ExcNodeList"])
    assert victim not in hostnames(slurm_cluster, final["NodeList"])
    timeline = events(run_dir)
    left = next(e for e in timeline if e["event"] == "nodes_left_behind")
    assert left["cause"] == "node_failure" and list(left["nodes"]) == [victim]
    assert next(e for e in timeline if e["event"] == "requeue")["exclude"] == [victim]
    assert not any(e["event"] in ("exclude_failed", "requeue_failed") for e in timeline)
    assert next(e for e in timeline if e["event"] == "restored")["step"] >= 20
    shown = jaxlaunch("status", job_id, env=slurm_env).stdout
    assert f"excluded nodes: {victim}" in shown and "1 bad-node requeue" in shown


def test_a_node_failed_on_a_partition_with_no_node_to_spare_ends_the_job_instead_of_a_requeue_that_never_runs(
        slurm_env, slurm_cluster, tmp_path):
    """The 2-node `debug` partition, a 2-node job, a rank's node set DOWN: a requeue without that node
    would wait in the queue for good. The job ends FAILED at once and says why and what to do."""
    run_dir = tmp_path / "run"
    job_id = submit(slurm_env, TRAIN, run_dir, *TRAIN_SETTINGS, "--set", "slurm.partition=debug",
                    "--set", "slurm.launch=srun")
    wait_for_checkpoint(run_dir, 20)
    record = job_record(slurm_cluster, job_id)
    victim = next(node for node in hostnames(slurm_cluster, record["NodeList"]) if node != record["BatchHost"])
    with node_down(slurm_cluster, victim):
        state = wait_for_end(slurm_env, job_id)
        assert state == "FAILED", what_happened(run_dir)
    status = json.loads((run_dir / "status.json").read_text())
    assert status["requeues"] == 0 and job_record(slurm_cluster, job_id)["Restarts"] == "0"
    failure = json.loads((run_dir / "failure.json").read_text())
    assert "partition 'debug' has 1 node(s) left, fewer than the job's 2" in failure["summary"], failure
    assert "--set slurm.partition" in failure["fix"]
    assert failure["summary"] in jaxlaunch("status", job_id, env=slurm_env).stdout


@pytest.mark.parametrize("launch", ["srun", "mpirun"])
def test_a_node_failed_mid_job_is_replaced_by_a_spare_inside_the_allocation(slurm_env, slurm_cluster, tmp_path,
                                                                           reference, launch):
    """slurm.spare_nodes=1 (3 nodes for a 2-node job): a rank's node set DOWN mid-run. The same
    Slurm job goes on with the spare in its place, from its checkpoint: no requeue (Restarts=0;
    max_requeues=0 would have ended it), COMPLETED, bit for bit the uninterrupted run's result."""
    run_dir = tmp_path / "run"
    job_id = submit(slurm_env, TRAIN, run_dir, *TRAIN_SETTINGS, "--set", f"slurm.launch={launch}",
                    "--set", "slurm.spare_nodes=1", "--set", "slurm.max_requeues=0")
    wait_for_checkpoint(run_dir, 20)
    record = job_record(slurm_cluster, job_id)
    allocated = hostnames(slurm_cluster, record["NodeList"])
    assert len(allocated) == 3
    first = next(e for e in events(run_dir) if e["event"] == "launch")["argv"]
    ranks_on = allocated[:2]  # the first two run the ranks; the third waits as the spare
    assert any(arg in (f"--nodelist={','.join(ranks_on)}", ",".join(f"{n}:1" for n in ranks_on)) for arg in first)
    victim = next(node for node in ranks_on if node != record["BatchHost"])
    with node_down(slurm_cluster, victim):
        state = wait_for_end(slurm_env, job_id)
        assert state == "COMPLETED", what_happened(run_dir)
    assert_same_training(load_result(run_dir), reference)
    final = settled_job_record(slurm_cluster, job_id)
    assert final["Restarts"] == "0" and final["JobState"] == "COMPLETED"
    status = json.loads((run_dir / "status.json").read_text())
    assert status["requeues"] == 0 and list(status["replaced_nodes"]) == [victim]
    [swap] = status["spare_swaps"]
    assert swap["nodes"] == [victim] and swap["spares"] == [allocated[2]] and swap["cause"] == "node_failure"
    timeline = events(run_dir)
    launches = [e["argv"] for e in timeline if e["event"] == "launch"]
    assert len(launches) == 2 and not any(victim in arg for arg in launches[1])
    assert next(e for e in timeline if e["event"] == "restored")["step"] >= 20
    assert not any(e["event"] in ("requeue", "nodes_left_behind") for e in timeline)
    shown = jaxlaunch("status", job_id, env=slurm_env).stdout
    assert f"1 spare-node swap inside the allocation (no requeue): {victim} -> {allocated[2]} (node failure)" in shown


def test_a_node_that_fails_the_health_check_is_excluded_before_the_ranks_start(slurm_env, slurm_cluster, tmp_path):
    """The check fails on whichever node runs it first (a lock directory), once: the job requeues
    without that node, and its second allocation passes."""
    run_dir = tmp_path / "run"
    marks = tmp_path / "marks"
    marks.mkdir()
    check = (f'if mkdir {marks}/lock 2>/dev/null; then echo $SLURMD_NODENAME > {marks}/bad; '
             f'echo "GPU 0 fell off the bus"; exit 1; fi; '
             f'test "$(cat {marks}/bad 2>/dev/null)" != "$SLURMD_NODENAME"')
    job_id = submit(slurm_env, EXAMPLES / "normalize.yaml", run_dir, "--set", "nodes=2",
                    "--set", f"slurm.health_check={check}")
    state = wait_for_end(slurm_env, job_id, timeout=180)
    assert state == "COMPLETED", what_happened(run_dir)
    bad = (marks / "bad").read_text().strip()
    status = json.loads((run_dir / "status.json").read_text())
    assert status["excluded_nodes"] == [bad] and status["node_failures"] == 1
    checks = [e for e in events(run_dir) if e["event"] == "health_check"]
    assert len(checks) == 2 and checks[1]["failed"] == {}
    assert checks[0]["failed"] == {bad: "health check exited with code 1: GPU 0 fell off the bus"}
    assert bad not in hostnames(slurm_cluster, job_record(slurm_cluster, job_id)["NodeList"])
    assert json.loads((run_dir / "result.json").read_text())["processes"] == 2


@pytest.mark.parametrize("launch", ["srun", "mpirun"])
def test_sixteen_ranks_on_eight_nodes_fail_fast_with_the_root_cause(slurm_env, tmp_path, launch):
    """16 ranks (8 nodes x 2): rank 13 raises while the others wait in allreduce; the job is down
    in under 10 s with rank 13's traceback as the cause, and no process is left."""
    run_dir = tmp_path / "run"
    job_id = submit(slurm_env, TEST_JOBS / "misbehave.yaml", run_dir, "--set", "nodes=8",
                    "--set", "processes_per_node=2", "--set", "params.how=raise", "--set", "params.rank=13",
                    "--set", f"slurm.launch={launch}", "--set", "slurm.max_requeues=0")
    ready = run_dir / "ready-rank-13"
    deadline = time.monotonic() + 240
    while not ready.exists():
        assert time.monotonic() < deadline, "rank 13 never got to fail"
        time.sleep(0.1)
    failed_at = ready.stat().st_mtime
    state = wait_for_end(slurm_env, job_id, timeout=120)
    assert state == "FAILED", what_happened(run_dir)
    status = json.loads((run_dir / "status.json").read_text())
    assert status["ended"] - failed_at < 10, (status, failed_at)
    failure = json.loads((run_dir / "failure.json").read_text())
    assert failure["first_failure"]["rank"] == 13 and "rank 13 failed on purpose" in failure["first_failure"]["error"]
    assert sorted(failure["torn_down_ranks"]) == [r for r in range(16) if r != 13]
    assert_no_process_survives(run_dir, within=10)
    shown = subprocess.run(["cat", str(run_dir / f"slurm-{job_id}.out")], capture_output=True, text=True).stdout
    assert "RuntimeError: rank 13 failed on purpose" in shown


# --- at scale, outside CI (make test-scale) ---------------------------------------------------------

SIXTEEN = ["--set", "nodes=8", "--set", "processes_per_node=2", "--set", "devices_per_process=1"]


@pytest.fixture(scope="module")
def sixteen_rank_reference(tmp_path_factory):
    """The training run uninterrupted, locally, on the same 16-rank layout (the reduction order, so
    the bits, depend on the layout)."""
    run_dir = tmp_path_factory.mktemp("reference16") / "run"
    result = jaxlaunch("run", TRAIN, *TRAIN_SETTINGS, *SIXTEEN, "--set", "params.step_seconds=0",
                       "--run-dir", run_dir, timeout=600)
    assert result.returncode == 0, result.stderr
    return load_result(run_dir)


@pytest.mark.scale
@pytest.mark.parametrize("launch", ["srun", "mpirun"])
def test_sixteen_ranks_preempted_resume_bit_identically(slurm_env, tmp_path, sixteen_rank_reference, launch):
    run_dir = tmp_path / "run"
    job_id = submit(slurm_env, TRAIN, run_dir, *TRAIN_SETTINGS, *SIXTEEN, "--set", f"slurm.launch={launch}")
    wait_for_checkpoint(run_dir, 20, timeout=300)
    subprocess.run(["scancel", "--batch", "--signal=USR2", job_id], env=slurm_env, check=True, timeout=30)
    state = wait_for_end(slurm_env, job_id, timeout=600)
    assert state == "COMPLETED", what_happened(run_dir)
    assert_same_training(load_result(run_dir), sixteen_rank_reference)
    timeline = events(run_dir)
    stopped = next(e for e in timeline if e["event"] == "stopped")
    assert stopped["at_agreed_point"]
    assert next(e for e in timeline if e["event"] == "restored")["step"] > 20
