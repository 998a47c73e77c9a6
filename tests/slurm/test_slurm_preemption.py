"""Preemption on the real local Slurm cluster (tests/slurm_cluster.py): a notice reaches every
rank, they checkpoint at one agreed step, the job requeues itself (same job id) and resumes, and
the final parameters and every loss are bit-identical to an uninterrupted run's.

How the notices are sent, and what each exercises:
- a real preemption: a job in the `urgent` partition (higher PriorityTier, exclusive nodes) takes
  both nodes; Slurm sends SIGTERM to the tasks, SIGKILL after GraceTime, and requeues;
- `scancel --batch --signal=USR2`: what sbatch --signal=B:USR2@T sends before the time limit
  (the batch shell, i.e. the supervisor), without waiting for a real time limit;
- `scancel --signal=USR2`: the job steps (the ranks in srun mode).
"""

import json
import subprocess
import time

import numpy as np
import pytest

from conftest import EXAMPLES, jaxlaunch
from preemption_helpers import (TRAIN, TRAIN_SETTINGS, assert_same_training, events, load_result,
                                wait_for_checkpoint, wait_for_end, what_happened)

pytestmark = pytest.mark.slurm


def submit(slurm_env, run_dir, launch, *settings):
    result = jaxlaunch("submit", TRAIN, *TRAIN_SETTINGS, "--set", f"slurm.launch={launch}", *settings,
                       "--parsable", "--run-dir", run_dir, env=slurm_env, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def scancel(slurm_env, *args):
    subprocess.run(["scancel", *args], env=slurm_env, check=True, timeout=30)


def wait_for_restart(run_dir, count, timeout=120):
    """Until the requeued job has started again `count` times (its supervisor logs `resumed`)."""
    deadline = time.monotonic() + timeout
    while sum(e["event"] == "resumed" for e in events(run_dir)) < count:
        assert time.monotonic() < deadline, f"the job did not restart {count} time(s) within {timeout} s"
        time.sleep(0.2)


def preempt_with_urgent_job(slurm_env, tmp_path):
    out = subprocess.run(["sbatch", "--parsable", "-p", "urgent", "-N", "2", "--exclusive", "-o",
                          str(tmp_path / "urgent.out"), "--wrap", "sleep 1"],
                         env=slurm_env, capture_output=True, text=True, check=True, timeout=30)
    return out.stdout.strip()


def requeue_record(run_dir):
    status = json.loads((run_dir / "status.json").read_text())
    return {key: status.get(key, 0) for key in ("requeues", "preemptions", "timeouts")}


@pytest.mark.parametrize("launch", ["srun", "mpirun"])
def test_real_preemption_requeues_and_resumes_bit_identical(slurm_env, tmp_path, reference, launch):
    run_dir = tmp_path / "run"
    job_id = submit(slurm_env, run_dir, launch)
    wait_for_checkpoint(run_dir, 20)
    preempted_at = time.time()
    preempt_with_urgent_job(slurm_env, tmp_path)
    state = wait_for_end(slurm_env, job_id)
    assert state == "COMPLETED", what_happened(run_dir)
    assert_same_training(load_result(run_dir), reference)
    assert requeue_record(run_dir) == {"requeues": 1, "preemptions": 1, "timeouts": 0}
    timeline = events(run_dir)
    stopped = next(e for e in timeline if e["event"] == "stopped")
    resumed_at = next(i for i, e in enumerate(timeline) if e["event"] == "resumed")
    saved = [e["step"] for e in timeline[:resumed_at] if e["event"] == "checkpoint"]
    restored = next(e for e in timeline if e["event"] == "restored")
    # the restart resumes from the newest checkpoint the first allocation completed
    assert restored["step"] >= max(saved) >= 20
    if launch == "srun":
        # the ranks got Slurm's SIGTERM, agreed on a step and checkpointed it
        assert stopped["at_agreed_point"] and "SIGTERM" in stopped["sources"]
        assert restored["step"] > 20
    # mpirun: Open MPI aborts the job on SIGTERM. Whether the ranks' own SIGTERM lets them agree
    # and checkpoint before the abort is a race (measured both ways); if not, the job resumes from
    # its last periodic checkpoint: the same final bits, a few steps computed twice.
    assert stopped["time"] >= preempted_at
    rows = jaxlaunch("status", job_id, env=slurm_env).stdout
    assert f"job {job_id} requeued 1 time: 1 preemption, 0 time limits" in rows


def test_preempted_twice_resumes_twice_bit_identical(slurm_env, tmp_path, reference):
    """Two real preemptions of one job (srun mode: the ranks checkpoint at the SIGTERM each time)."""
    run_dir = tmp_path / "run"
    job_id = submit(slurm_env, run_dir, "srun")
    wait_for_checkpoint(run_dir, 20)
    preempt_with_urgent_job(slurm_env, tmp_path)
    wait_for_restart(run_dir, 1)
    wait_for_checkpoint(run_dir, 40)
    preempt_with_urgent_job(slurm_env, tmp_path)
    state = wait_for_end(slurm_env, job_id)
    assert state == "COMPLETED", what_happened(run_dir)
    assert_same_training(load_result(run_dir), reference)
    assert requeue_record(run_dir) == {"requeues": 2, "preemptions": 2, "timeouts": 0}
    timeline = events(run_dir)
    stops = [e for e in timeline if e["event"] == "stopped"]
    assert len(stops) == 2 and all(e["at_agreed_point"] and "SIGTERM" in e["sources"] for e in stops)
    restored = [e["step"] for e in timeline if e["event"] == "restored"]
    assert len(restored) == 2 and 20 < restored[0] < restored[1] < 80
    assert load_result(run_dir)["attempt"] == 2


@pytest.mark.parametrize("launch", ["mpirun", "srun"])
def test_time_limit_notice_twice_requeues_twice(slurm_env, tmp_path, reference, launch):
    """The notice sbatch --signal=B:USR2@T sends, twice: two requeues, same bits."""
    run_dir = tmp_path / "run"
    job_id = submit(slurm_env, run_dir, launch)
    wait_for_checkpoint(run_dir, 20)
    scancel(slurm_env, "--batch", "--signal=USR2", job_id)
    wait_for_restart(run_dir, 1)
    wait_for_checkpoint(run_dir, 40)
    scancel(slurm_env, "--batch", "--signal=USR2", job_id)
    state = wait_for_end(slurm_env, job_id)
    assert state == "COMPLETED", what_happened(run_dir)
    assert_same_training(load_result(run_dir), reference)
    record = requeue_record(run_dir)
    assert record["requeues"] == 2 and record["preemptions"] + record["timeouts"] == 2
    stops = [e for e in events(run_dir) if e["event"] == "stopped"]
    assert len(stops) == 2 and all(e["at_agreed_point"] and e["sources"] == ["supervisor"] for e in stops)
    out = (run_dir / f"slurm-{job_id}.out").read_text()  # --open-mode=append: every allocation's output
    assert out.count("asking the ranks to checkpoint and stop") == 2
    assert "COMPLETED" in out


def test_usr2_to_the_steps_reaches_srun_ranks(slurm_env, tmp_path, reference):
    run_dir = tmp_path / "run"
    job_id = submit(slurm_env, run_dir, "srun")
    wait_for_checkpoint(run_dir, 20)
    scancel(slurm_env, "--signal=USR2", job_id)
    state = wait_for_end(slurm_env, job_id)
    assert state == "COMPLETED", what_happened(run_dir)
    assert_same_training(load_result(run_dir), reference)
    stopped = next(e for e in events(run_dir) if e["event"] == "stopped")
    assert stopped["at_agreed_point"] and stopped["sources"] == ["SIGUSR2"]
    assert requeue_record(run_dir)["requeues"] == 1


def test_spent_requeues_end_the_job_failed_with_the_reason(slurm_env, tmp_path):
    run_dir = tmp_path / "run"
    job_id = submit(slurm_env, run_dir, "srun", "--set", "slurm.max_requeues=1")
    wait_for_checkpoint(run_dir, 20)
    scancel(slurm_env, "--batch", "--signal=USR2", job_id)
    wait_for_restart(run_dir, 1)
    wait_for_checkpoint(run_dir, 40)
    scancel(slurm_env, "--batch", "--signal=USR2", job_id)
    state = wait_for_end(slurm_env, job_id)
    assert state == "FAILED", what_happened(run_dir)
    failure = json.loads((run_dir / "failure.json").read_text())
    assert failure["reason"] == "requeue_limit"
    assert "slurm.max_requeues=1 is spent; the latest checkpoint is step" in failure["summary"]
    status = jaxlaunch("status", job_id, env=slurm_env).stdout
    assert f"job {job_id} FAILED: " in status and "slurm.max_requeues=1 is spent" in status
    assert not (run_dir / "result.json").exists()


GLOBAL_MESH = EXAMPLES / "global_mesh.yaml"
GLOBAL_SETTINGS = ["--set", "params.steps=60", "--set", "params.checkpoint_every=15"]


def test_a_global_mesh_job_checkpoints_its_sharded_weights_and_resumes_bit_identical(slurm_env, tmp_path):
    """jobs/examples/global_mesh.py: weights split over the 4 devices of 2 processes (jax.distributed), so
    each process saves only the shards it owns. A time-limit notice stops it at an agreed step;
    the requeued job restores the shards onto its mesh and ends with the same bits as a run that
    was never stopped."""
    reference = jaxlaunch("run", GLOBAL_MESH, *GLOBAL_SETTINGS, "--run-dir", tmp_path / "reference", timeout=240)
    assert reference.returncode == 0, reference.stderr
    run_dir = tmp_path / "run"
    result = jaxlaunch("submit", GLOBAL_MESH, *GLOBAL_SETTINGS, "--set", "params.step_seconds=0.1",
                       "--parsable", "--run-dir", run_dir, env=slurm_env, timeout=60)
    assert result.returncode == 0, result.stderr
    job_id = result.stdout.strip()
    wait_for_checkpoint(run_dir, 15)
    step = json.loads(next((run_dir / "checkpoints").glob("step-*/manifest.json")).read_text())
    files = {piece["file"] for leaf in step["leaves"] for piece in leaf["pieces"]}
    assert files == {"process-00000.data", "process-00001.data"}  # each process wrote its own shards
    scancel(slurm_env, "--batch", "--signal=USR2", job_id)
    state = wait_for_end(slurm_env, job_id)
    assert state == "COMPLETED", what_happened(run_dir)
    resumed, uninterrupted = load_result(run_dir), load_result(tmp_path / "reference")
    assert resumed["attempt"] == 1 and resumed["matches_numpy"]
    assert resumed["losses"] == uninterrupted["losses"]
    for name in ("w1", "w2"):
        assert np.array_equal(resumed[name], uninterrupted[name]), name
    restored = next(e for e in events(run_dir) if e["event"] == "restored")
    assert restored["step"] >= 15
    assert requeue_record(run_dir)["requeues"] == 1


@pytest.mark.parametrize("launch, how", [("srun", "jaxlaunch cancel"), ("srun", "scancel"),
                                         ("mpirun", "jaxlaunch cancel"), ("mpirun", "scancel")])
def test_a_cancel_ends_the_job_cancelled_and_never_requeues(slurm_env, tmp_path, launch, how):
    """Issue 29: Slurm sends a cancel the SIGTERM it sends a preemption; the job took it for one and
    requeued. `jaxlaunch cancel` also gets every rank's stacks first, in mpirun mode too (there,
    Slurm's own SIGTERM makes mpirun end its ranks before they can answer)."""
    run_dir = tmp_path / "run"
    job_id = submit(slurm_env, run_dir, launch)
    wait_for_checkpoint(run_dir, 20)
    if how == "scancel":
        scancel(slurm_env, job_id)
    else:
        assert jaxlaunch("cancel", job_id, env=slurm_env, timeout=60).stdout == f"cancelled job {job_id}\n"
    state = wait_for_end(slurm_env, job_id, timeout=60)
    assert state == "CANCELLED", what_happened(run_dir)
    time.sleep(3)  # a requeue would show by now: Slurm makes the job PENDING again at once
    queue = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], env=slurm_env, capture_output=True,
                           text=True, timeout=30).stdout.split()
    assert not set(queue) & {"PENDING", "RUNNING", "CONFIGURING"}, queue
    status = json.loads((run_dir / "status.json").read_text())
    assert (status["state"], status["requeues"], status["exit_code"]) == ("CANCELLED", 0, 143)
    assert not any(e["event"] in ("requeue", "resumed") for e in events(run_dir))
    failure = json.loads((run_dir / "failure.json").read_text())
    assert failure["reason"] == "cancelled"
    if how == "jaxlaunch cancel":  # a plain scancel ends the ranks as it likes: a race, in both modes
        assert [r["answered"] for r in failure["hang"]["ranks"]] == [True, True], failure["hang"]
