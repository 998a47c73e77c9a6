"""Spare nodes (slurm.spare_nodes): the batch request, the launcher's node list per attempt, and
the supervisor's swap (a failed node, a node failing the health check, a hang's culprit) inside the
allocation without a requeue; the requeue once spares run out. The real swap on the test cluster:
tests/slurm/test_slurm_nodes.py."""

import json
import os

import pytest

from launcher.backends.slurm import fit, nodes, spares
from launcher.backends.slurm.allocation import SlurmAllocation
from launcher.backends.slurm.job import SlurmJob
from launcher.backends.slurm.render import sbatch_directives
from launcher.errors import UsageError
from launcher.launchers import mpirun, srun
from launcher.spec import JobSpec
from launcher.spec.model import SlurmSpec
from launcher.rundir import RunDirectory

from supervision_helpers import fake_launcher, quick_stops, slurm, status, supervisor  # noqa: F401 (fixtures)


def test_the_attempt_runs_on_the_first_usable_nodes_named_on_the_launchers_line():
    allocated = ["node1", "node2", "node3", "node4"]
    assert spares.chosen(allocated, {}, 3) == ["node1", "node2", "node3"]
    assert spares.chosen(allocated, {"node2": "down"}, 3) == ["node1", "node3", "node4"]  # node2's ranks move
    assert spares.chosen(allocated, ["node2", "node4"], 3) is None
    assert srun.pin_nodelist(["srun", "--mpi=pmix", "python"], ["node1", "node3"], 2) == \
        ["srun", "--nodelist=node1,node3", "--ntasks=4", "--mpi=pmix", "python"]
    assert mpirun.pin_hosts(["/venv/bin/mpirun", "-n", "4", "python"], ["node1", "node3"], 2) == \
        ["/venv/bin/mpirun", "--host", "node1:2,node3:2", "-n", "4", "python"]
    for pin in (srun.pin_nodelist, mpirun.pin_hosts):
        assert pin(["python", "fake.py"], ["node1"], 1) == ["python", "fake.py"]


def test_spare_nodes_are_allocated_and_a_node_failure_does_not_end_the_job(tmp_path):
    spec = JobSpec(name="x", entrypoint="m:f", nodes=2, slurm=SlurmSpec(spare_nodes=1, max_requeues=0))
    lines = sbatch_directives(spec, tmp_path, tmp_path)
    assert "--nodes=3" in lines and "--no-kill" in lines and "--no-requeue" in lines
    plain = sbatch_directives(spec.replace(slurm=SlurmSpec(max_requeues=0)), tmp_path, tmp_path)
    assert "--nodes=2" in plain and "--no-kill" not in plain


def test_the_fit_check_counts_the_spares(write_spec, fake_slurm):
    fake_slurm.answers.update({
        "scontrol show partition": "PartitionName=debug Default=YES TotalNodes=2 MaxNodes=UNLIMITED MaxTime=UNLIMITED\n",
        "scontrol show node": "NodeName=n1 Partitions=debug CPUTot=2\nNodeName=n2 Partitions=debug CPUTot=2\n"})
    spec = JobSpec(name="x", entrypoint="m:f", nodes=2, slurm=SlurmSpec(spare_nodes=1))
    with pytest.raises(UsageError) as refused:
        fit.refuse_if_it_cannot_fit([spec])
    assert "3 nodes requested (2 + 1 spare); partition 'debug' has 2. Fix: --set slurm.spare_nodes=0" in \
        str(refused.value)


def slurm_run(tmp_path, **slurm_fields):
    spec = JobSpec(name="units", entrypoint="job.py:main", nodes=2, processes_per_node=1,
                   slurm=SlurmSpec(**{"max_requeues": 1, **slurm_fields}))
    return spec, RunDirectory.create(spec, tmp_path / "run")


@pytest.fixture
def three_nodes(monkeypatch):
    """An allocation of node1-3; `down` holds the nodes Slurm reports failed."""
    down = {}
    monkeypatch.setattr(nodes, "allocated_nodes", lambda env=os.environ: ["node1", "node2", "node3"])
    monkeypatch.setattr(nodes, "lost_nodes", lambda record, allocated: {n: w for n, w in down.items() if n in allocated})
    return down


def test_a_node_lost_under_the_job_is_replaced_by_a_spare_without_a_requeue(fake_launcher, tmp_path, slurm,
                                                                          three_nodes):
    spec, run = slurm_run(tmp_path, spare_nodes=1)  # max_restarts=0: a swap is not a restart
    three_nodes["node2"] = "State=DOWN (jaxlaunch-test)"
    allocation = SlurmAllocation("7")
    sup = supervisor(fake_launcher, spec, run, "fail_first", allocation=allocation)
    outcome = sup.supervise()
    assert (outcome.state, outcome.attempts, outcome.restarts) == ("COMPLETED", 2, 0)
    assert slurm.requeued == [] and allocation.in_use == ["node1", "node3"]
    final = status(run)
    assert final["requeues"] == 0 and final["restarts"] == 0 and not final.get("excluded_nodes")
    assert final["replaced_nodes"] == {"node2": "State=DOWN (jaxlaunch-test)"}
    [swap] = final["spare_swaps"]
    assert (swap["cause"], swap["nodes"], swap["spares"], swap["attempt"]) == ("node_failure", ["node2"], ["node3"], 0)
    assert [e["spares"] for e in run.read_events() if e["event"] == "nodes_replaced"] == [["node3"]]
    assert any("restarting the ranks inside this allocation on node3 (spare)" in line for line in sup.echoed)
    job = SlurmJob("7", run)
    from launcher.backends.records import JobInfo, history_fields
    from launcher.cli.job_views import note_lines

    info = JobInfo(job_id="7", backend="slurm", state=final["state"], **history_fields(job.status()))
    assert "1 spare-node swap inside the allocation (no requeue): node2 -> node3 (node failure)" in note_lines(info)


def test_a_replaced_node_still_down_is_not_lost_again_when_a_later_attempt_fails(fake_launcher, tmp_path, slurm,
                                                                                three_nodes):
    """After the swap the attempt runs on node1 and node3; node2 stays DOWN. When that attempt fails
    for its own reason, it is a restart (max_restarts), not another node failure."""
    spec, run = slurm_run(tmp_path, spare_nodes=1)
    spec = spec.replace(max_restarts=1)
    three_nodes["node2"] = "State=DOWN"
    outcome = supervisor(fake_launcher, spec, run, "fail", allocation=SlurmAllocation("7")).supervise()
    assert (outcome.state, outcome.attempts, outcome.restarts) == ("FAILED", 3, 1) and slurm.requeued == []
    assert len(status(run)["spare_swaps"]) == 1


def test_once_the_spares_are_spent_the_job_requeues_without_every_bad_node(fake_launcher, tmp_path, slurm,
                                                                        three_nodes, monkeypatch):
    spec, run = slurm_run(tmp_path, spare_nodes=1)
    run.update_status(replaced_nodes={"node3": "State=DOWN"})  # the spare was used up earlier
    three_nodes["node2"] = "State=DOWN"
    updates = []
    monkeypatch.setattr(nodes, "exclude", lambda job_id, nodelist: updates.append(nodelist))
    outcome = supervisor(fake_launcher, spec, run, "fail", allocation=SlurmAllocation("7")).supervise()
    assert outcome.state == "REQUEUED" and slurm.requeued == ["7"]
    assert status(run)["excluded_nodes"] == ["node2", "node3"] and updates == ["node2,node3"]
    assert any(e["event"] == "spares_spent" for e in run.read_events())


def test_a_node_failing_the_health_check_is_replaced_before_the_first_attempt(fake_launcher, tmp_path, slurm,
                                                                            three_nodes, monkeypatch):
    spec, run = slurm_run(tmp_path, spare_nodes=1, health_check="true")
    monkeypatch.setattr(nodes, "health_check", lambda command, allocated: {"node1": "health check exited with code 1"})
    allocation = SlurmAllocation("7")
    outcome = supervisor(fake_launcher, spec, run, "complete", allocation=allocation).supervise()
    assert (outcome.state, outcome.attempts) == ("COMPLETED", 1) and slurm.requeued == []
    assert allocation.in_use == ["node2", "node3"]
    assert status(run)["spare_swaps"][0]["cause"] == "health_check"


def test_without_spares_nothing_changes(fake_launcher, tmp_path, slurm, three_nodes):
    spec, run = slurm_run(tmp_path)
    allocation = SlurmAllocation("7").bind(spec, run)
    assert allocation.launch_command(["srun", "x"]) == ["srun", "x"]
    assert not allocation.can_swap_in_spares({"node2"})
    allocation.bind(spec.replace(slurm=SlurmSpec(spare_nodes=1, launch="srun")), run)
    assert allocation.launch_command(["srun", "x"]) == ["srun", "--nodelist=node1,node2", "--ntasks=2", "x"]
    allocation.bind(spec.replace(slurm=SlurmSpec(spare_nodes=1, launch="mpirun")), run)
    assert allocation.launch_command(["mpirun", "x"]) == ["mpirun", "--host", "node1:1,node2:1", "x"]
    assert allocation.can_swap_in_spares({"node2"})
    three_nodes["node3"] = "State=DOWN"  # the spare itself failed while idle
    assert not allocation.can_swap_in_spares({"node2"})


def partition_of(monkeypatch, slurm, partition, members):
    """Slurm answers: the job runs in `partition`, whose nodes are `members`."""
    slurm.record = {"Partition": partition}
    monkeypatch.setattr(fit, "read_cluster", lambda: ([{"PartitionName": partition}],
                                                      [{"NodeName": n, "Partitions": partition} for n in members]))


@pytest.mark.parametrize("members, state", [(["node1", "node2"], "FAILED"), (["node1", "node2", "node4"], "REQUEUED")])
def test_a_node_failure_requeues_only_where_the_partition_can_spare_the_node(fake_launcher, tmp_path, slurm,
                                                                            monkeypatch, members, state):
    """A lost node is left behind by a requeue that excludes it. On a partition with no node to spare,
    that requeue would wait in the queue for good: the job ends FAILED instead and says why (the hang
    path already checked this; the node-failure and health-check paths did not)."""
    monkeypatch.setattr(nodes, "allocated_nodes", lambda env=os.environ: ["node1", "node2"])
    monkeypatch.setattr(nodes, "lost_nodes", lambda record, allocated: {"node2": "State=DOWN"})
    monkeypatch.setattr(nodes, "exclude", lambda job_id, nodelist: None)
    partition_of(monkeypatch, slurm, "debug", members)
    spec, run = slurm_run(tmp_path)
    outcome = supervisor(fake_launcher, spec, run, "fail", allocation=SlurmAllocation("7")).supervise()
    assert outcome.state == state
    if state == "FAILED":
        assert slurm.requeued == []
        summary = outcome.failure["summary"]
        assert "partition 'debug' has 1 node(s) left, fewer than the job's 2" in summary, summary
        assert "would wait in the queue for good" in summary and "--set slurm.partition" in outcome.failure["fix"]
    else:
        assert slurm.requeued == ["7"] and status(run)["excluded_nodes"] == ["node2"]


def test_the_exclusion_list_names_each_node_once():
    """Issue 45: a second requeue wrote ExcNodeList=node2,node2,node4 (Slurm's list, then every node
    excluded so far)."""
    from launcher.backends.slurm.nodes import exclusion_list

    assert exclusion_list({"ExcNodeList": "node2"}, ["node2", "node4"]) == "node2,node4"
    assert exclusion_list({"ExcNodeList": "node[1-3],node5"}, ["node5", "node6"]) == "node[1-3],node5,node6"
    assert exclusion_list({"ExcNodeList": "(null)"}, ["node2"]) == "node2"


# --- one decision for bad nodes (issue 46): the allocation decides, the supervisor carries it out ------

def test_the_allocation_gives_one_decision_for_bad_nodes_and_the_supervisor_writes_the_end(tmp_path, write_spec):
    import importlib

    from launcher.spec.load import load_spec
    from launcher.states import JobState
    from launcher.supervisor.allocation import Allocation, NodeAction

    class Cluster(Allocation):
        spares, requeues = True, True

        def swap_in_spares(self, bad, cause, attempt):
            return self.spares

        def leave_nodes_behind(self, bad, cause, failure, attempt):
            if self.requeues:
                return JobState.REQUEUED, None
            return JobState.FAILED, {"summary": f"node(s) {sorted(bad)} and no requeue left", "reason": cause}

    supervise = importlib.import_module("launcher.supervisor.supervise")
    run = RunDirectory(tmp_path / "run")
    run.path.mkdir()
    cluster = Cluster()
    supervisor = supervise.Supervisor(load_spec(write_spec("name: x\nentrypoint: m:f\n")), run, [], {},
                                      allocation=cluster)
    assert supervisor._replace_nodes({"n2": "down"}, "node_failure", None, 0).action == NodeAction.SPARE
    cluster.spares = False
    decision = supervisor._replace_nodes({"n2": "down"}, "node_failure", None, 0)
    assert (decision.action, decision.state, supervisor.requeue_cause) == (NodeAction.REQUEUE, JobState.REQUEUED,
                                                                            "node_failure")
    assert not run.failure_file.exists()
    cluster.requeues = False
    decision = supervisor._replace_nodes({"n2": "down"}, "hang", None, 0)
    assert (decision.action, decision.state) == (NodeAction.END, JobState.FAILED)
    assert json.loads(run.failure_file.read_text())["summary"] == "node(s) ['n2'] and no requeue left"
