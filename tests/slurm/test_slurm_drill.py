"""`jaxlaunch drill --target slurm` (issue 34) on the local 8-node cluster: the tutorial's training
job, with one spare node, survives a rank's node set DOWN (the same job goes on, on the spare) and a
rank killed on its node (a step of the job signals it there), each with the clean run's result bit
for bit. (Slurm's own preemption notice, the drill's third fault there, is tested on its own in
test_slurm_preemption.py; here it would add a requeue's 20 s.)"""

import json

import pytest

from conftest import EXAMPLES, jaxlaunch

pytestmark = pytest.mark.slurm


def test_the_training_job_passes_the_slurm_drill_with_a_node_set_down(slurm_env, slurm_cluster, tmp_path):
    folder = tmp_path / "drill"
    result = jaxlaunch("drill", EXAMPLES / "train_data_parallel.yaml", "--target", "slurm",
                       "--faults", "node,kill", "--seed", "7",
                       "--set", "slurm.partition=wide", "--set", "slurm.spare_nodes=1",
                       "--set", "params.steps=40", "--set", "params.checkpoint_every=10",
                       "--set", "params.step_seconds=0.05", "--run-dir", folder, env=slurm_env, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads((folder / "drill.json").read_text())
    assert report["passed"] and report["target"] == "slurm"
    trials = {t["fault"]: t for t in report["trials"]}
    for trial in trials.values():
        assert trial["detected"] and trial["final_state"] == "COMPLETED" and trial["same_result"], trial
        assert trial["recover_seconds"] is not None and trial["steps_lost"] <= 10, trial
    node = trials["node"]
    status = json.loads((folder / "node-1" / "status.json").read_text())
    assert status["requeues"] == 0 and list(status["replaced_nodes"]) == [node["node"]]
    record = slurm_cluster.show_job(status["job_id"])
    assert record["Restarts"] == "0"
    assert node["node"] not in slurm_cluster.run("sinfo", "-h", "-t", "down", "-o", "%N").stdout  # set back
    table = result.stderr[result.stderr.index("FAULT"):]
    assert table.count("\nPASS ") == 2 and "every fault passed" in result.stderr


def test_the_node_fault_needs_slurm():
    result = jaxlaunch("drill", EXAMPLES / "train_data_parallel.yaml", "--faults", "node")
    assert result.returncode == 2 and "node: choose from kill, preempt, hang, repeat (node: with --target slurm)" in \
        result.stderr
