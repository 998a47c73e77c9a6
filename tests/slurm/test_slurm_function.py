"""The function API on the real local Slurm cluster (tests/slurm_cluster.py): a closure on 2 nodes
gives rank 0's psum back, a failure raises with the remote traceback, map is a job array with the
results in order, and a preempted function job requeues and resumes from ctx.checkpoints."""

import subprocess
import time

import numpy as np
import pytest

import launcher
from conftest import jaxlaunch
from preemption_helpers import events, wait_for_checkpoint

pytestmark = pytest.mark.slurm


@pytest.fixture
def slurm_api(slurm_env, tmp_path, monkeypatch):
    """This process talks to the test cluster (the API runs in-process, where the closures live)."""
    for key, value in slurm_env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    return slurm_env


def test_a_closure_on_two_nodes_gives_the_psum_and_a_failure_its_remote_traceback(slurm_api):
    weights = np.arange(4.0)  # captured: pickled with the function

    def weighted_rank_sum(ctx):
        return {"sum": float(launcher.allreduce(weights[ctx.rank] + 1.0)), "nodes": ctx.num_nodes}

    def fails_on_the_second_node(ctx):
        if ctx.node_index == 1:
            raise KeyError(f"missing shard on node {ctx.node_index}")
        launcher.barrier()

    executor = launcher.Executor("slurm", nodes=2, timeout="5m")
    job, failing = executor.submit(weighted_rank_sum), executor.submit(fails_on_the_second_node)
    assert job.id.isdigit()
    value = job.result(timeout=180)
    assert value["sum"] == 3.0 and value["nodes"] == 2  # (0 + 1) + (1 + 1)
    with pytest.raises(launcher.JobFailedError) as caught:
        failing.result(timeout=180)
    assert caught.value.rank == 1 and "KeyError: 'missing shard on node 1'" in str(caught.value)
    assert "in fails_on_the_second_node" in caught.value.remote_traceback
    # the CLI finds both by their Slurm job ids
    status = jaxlaunch("status", job.id, failing.id, env=slurm_api)
    assert "COMPLETED" in status.stdout and "FAILED" in status.stdout, status.stdout + status.stderr


def test_map_over_six_items_is_one_job_array_with_the_results_in_order(slurm_api):
    items = ["a", "bb", "ccc", "dddd", "eeeee", "ffffff"]
    jobs = launcher.Executor("slurm", slurm={"partition": "wide"}, timeout="5m").map(
        lambda ctx, item: {"item": item, "length": len(item), "ranks": ctx.size}, items)
    arrays = {job.id.partition("_")[0] for job in jobs}
    assert len(arrays) == 1 and [job.id.partition("_")[2] for job in jobs] == [str(i) for i in range(6)]
    assert [job.result(timeout=300) for job in jobs] == [{"item": i, "length": len(i), "ranks": 1} for i in items]


def count_steps(ctx, steps):
    """Sums every rank's step number over `steps` steps, 0.1 s each, checkpointing every 10 and at a
    preemption notice (module level: pickled by reference, so the ranks import this test module)."""
    total, start = np.zeros((), np.float64), 0
    restored = ctx.checkpoints.restore()
    if restored is not None:
        start, state = restored
        total = state["total"]
    for step in range(start, steps):
        if ctx.should_stop():
            ctx.checkpoints.save(step, {"total": total})
            return None
        total = total + launcher.allreduce(np.float64(step))
        time.sleep(0.1)
        if (step + 1) % 10 == 0:
            ctx.checkpoints.save(step + 1, {"total": total})
    return {"total": float(total), "attempt": ctx.attempt}


def test_a_preempted_function_job_requeues_and_resumes_from_its_checkpoint(slurm_api):
    job = launcher.Executor("slurm", nodes=2, timeout="5m").submit(count_steps, 60)
    wait_for_checkpoint(job.run_dir, 10)
    # what sbatch --signal=B:USR2@T sends before a time limit: the job checkpoints and requeues
    subprocess.run(["scancel", "--batch", "--signal=USR2", job.id], env=slurm_api, check=True, timeout=30)
    value = job.result(timeout=240)
    assert value == {"total": 2.0 * sum(range(60)), "attempt": 1}  # every step counted once, on both ranks
    timeline = events(job.run_dir)
    assert any(e["event"] == "resumed" for e in timeline)
    restored = next(e for e in timeline if e["event"] == "restored")
    assert restored["step"] >= 10
