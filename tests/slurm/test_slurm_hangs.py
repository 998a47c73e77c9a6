"""A hang on the local Slurm cluster (issue 33): the hang watchdog stops a global-mesh job whose
rank 1 stopped entering the jitted step, the roll-call names rank 1's node, and the job is requeued
without that node (slurm.max_requeues), resumes from its checkpoint and completes bit-identically."""

import json

import pytest

from conftest import TEST_JOBS, jaxlaunch
from preemption_helpers import what_happened
from test_slurm_nodes import hostnames, job_record, submit, wait_for_end

pytestmark = pytest.mark.slurm
SPEC = TEST_JOBS / "hangs.yaml"
LAYOUT = ["--set", "nodes=2", "--set", "processes_per_node=1"]


def test_a_hang_requeues_the_job_without_the_culprits_node_and_it_completes(slurm_env, slurm_cluster, tmp_path):
    clean = jaxlaunch("run", SPEC, *LAYOUT, "--run-dir", tmp_path / "clean", timeout=120)
    assert clean.returncode == 0, clean.stderr[-2000:]
    run_dir = tmp_path / "run"
    job_id = submit(slurm_env, SPEC, run_dir, *LAYOUT, "--set", "params.how=loader", "--set", "hang_timeout=5",
                    "--set", "slurm.max_requeues=1")
    state = wait_for_end(slurm_env, job_id, timeout=300)
    assert state == "COMPLETED", what_happened(run_dir)
    status = json.loads((run_dir / "status.json").read_text())
    hang = json.loads((run_dir / "logs" / "attempt-0" / "failure.json").read_text())
    culprit = hang["hang"]["roll_call"]["culprits"][0]
    assert culprit["rank"] == 1 and "read_batch" in culprit["where"] and hang["reason"] == "hang"
    assert status["excluded_nodes"] == [culprit["host"]] and status["requeues"] == 1
    assert status["node_failures"] == 0 and status["hang_requeues"] == 1  # a hang is not a node failure
    shown = jaxlaunch("status", job_id, env=slurm_env).stdout
    assert "1 hang, 0 bad-node requeues; excluded nodes: " + culprit["host"] in shown
    final = job_record(slurm_cluster, job_id)
    assert culprit["host"] in hostnames(slurm_cluster, final["ExcNodeList"])
    assert culprit["host"] not in hostnames(slurm_cluster, final["NodeList"])
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    left = next(e for e in events if e["event"] == "nodes_left_behind")
    assert left["cause"] == "hang" and list(left["nodes"]) == [culprit["host"]]
    assert next(e for e in events if e["event"] == "restored")["step"] == 8
    result = json.loads((run_dir / "result.json").read_text())
    assert result["attempt"] == 1
    assert result["w"] == json.loads((tmp_path / "clean" / "result.json").read_text())["w"]  # bit for bit


def test_the_programs_own_hang_on_every_attempt_ends_after_the_second_with_one_node_excluded(
        slurm_env, slurm_cluster, tmp_path):
    """Issue 45: rank 1 stalls in its loader at step 8 on every attempt (the program's own hang,
    wherever it runs). Before: requeued each time without the culprit's node (three healthy nodes
    excluded, one twice) until the requeues were spent. Now the second hang at the same place ends
    the job: two attempts, one node excluded, no node listed twice, and status says why."""
    run_dir = tmp_path / "run"
    job_id = submit(slurm_env, SPEC, run_dir, *LAYOUT, "--set", "params.how=loader", "--set", "params.stall_attempt=-1",
                    "--set", "hang_timeout=5", "--set", "slurm.max_requeues=3")
    state = wait_for_end(slurm_env, job_id, timeout=300)
    assert state in ("TIMEOUT", "FAILED"), what_happened(run_dir)
    status = json.loads((run_dir / "status.json").read_text())
    assert status["attempts"] == 2 and status["requeues"] == 1, status
    assert len(status["excluded_nodes"]) == 1, status
    assert "the program's own hang, twice at the same place after step 7" in status["reason"], status["reason"]
    final = job_record(slurm_cluster, job_id)
    listed = hostnames(slurm_cluster, final["ExcNodeList"])
    assert len(listed) == len(set(listed)) == 1, final["ExcNodeList"]
    failure = json.loads((run_dir / "failure.json").read_text())
    assert failure["governor"]["decision"] == "stopped" and "read_batch" in failure["governor"]["why"]
    shown = jaxlaunch("status", job_id, env=slurm_env).stdout
    assert "twice at the same place" in shown, shown
