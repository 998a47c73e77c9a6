"""A hang on the local Slurm cluster (issue 33): the hang watchdog stops a global-mesh job whose
rank 1 stopped entering the jitted step, the roll-call names rank 1's node, and the job is requeued
without that node (slurm.max_requeues), resumes from its checkpoint and completes bit-identically."""

import json

import pytest

from conftest import TEST_JOBS, jaxlaunch
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
    assert wait_for_end(slurm_env, job_id, timeout=300) == "COMPLETED"
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
