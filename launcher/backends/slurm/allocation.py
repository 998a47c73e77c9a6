"""The in-job side of the Slurm backend: what the supervisor inside a batch job asks of Slurm
(where the ranks reach it, which nodes failed, what a notice or a cancel leads to, the requeue).
The supervisor (launcher/supervisor/supervise.py) is given a `SlurmAllocation`, binds it to the
job (spec, run directory, echo) and never names Slurm itself."""

from __future__ import annotations

import os
import socket
import time

from ...errors import SchedulerError
from ...states import NODE_CAUSE_WORDS, Cause, JobState
from ...supervisor import root_cause
from ...supervisor.allocation import Allocation
from ...launchers import mpirun, srun
from . import fit, nodes, requeue, scheduler, spares


class SlurmAllocation(Allocation):
    def __init__(self, job_id: str):
        self.job_id = job_id
        self.in_use: list[str] | None = None  # the nodes the latest attempt ran on, with spare nodes

    @classmethod
    def here(cls, env=os.environ) -> "SlurmAllocation | None":
        """The allocation of the batch job this process runs in (None outside one)."""
        job_id = requeue.slurm_job_id(env)
        return None if job_id is None else cls(job_id)

    def default_control_host(self, env) -> str:
        """The batch node's NodeAddr (what the other nodes reach it by), else its hostname's address."""
        node = env.get("SLURMD_NODENAME")
        if not node:
            return "127.0.0.1"
        try:
            for word in scheduler.call_slurm(["scontrol", "show", "node", "--oneliner", node], timeout=20).split():
                if word.startswith("NodeAddr="):
                    return socket.gethostbyname(word.partition("=")[2])
        except (SchedulerError, OSError):
            pass
        try:
            return socket.gethostbyname(socket.gethostname())
        except OSError:
            return "127.0.0.1"

    def failing_nodes(self) -> dict[str, str]:
        command = self.spec.slurm.health_check
        allocated = nodes.allocated_nodes() if command else []
        if not allocated:
            return {}
        self.echo(f"jaxlaunch: running the health check on {len(allocated)} node(s)")
        started = time.time()
        failing = nodes.health_check(command, allocated)
        self.run.log_event("health_check", nodes=len(allocated), failed=failing,
                           seconds=round(time.time() - started, 3))
        return failing

    def lost_nodes(self) -> dict[str, str]:
        """The nodes the attempt ran on that failed (a spare that failed while idle is not the
        attempt's; swap_in_spares passes over it)."""
        return nodes.lost_nodes(requeue.job_record(self.job_id), self.in_use or nodes.allocated_nodes())

    # --- spare nodes (slurm.spare_nodes; spares.py) -------------------------------------------

    def launch_command(self, argv):
        spec = self.spec
        allocated = nodes.allocated_nodes()
        if not spec.slurm.spare_nodes or len(allocated) <= spec.nodes:
            return argv
        self.in_use = spares.chosen(allocated, self.run.status().replaced_nodes or {}, spec.nodes)
        if self.in_use is None:  # too few usable nodes (swap_in_spares said so first): launch as rendered
            return argv
        pin = srun.pin_nodelist if spec.slurm.launch == "srun" else mpirun.pin_hosts
        return pin(argv, self.in_use, spec.processes_per_node)

    def _left_out(self, bad, allocated) -> dict[str, str]:
        """{node: why} of the allocation's nodes no attempt may use: replaced before, `bad`, and
        the ones in a bad state now (a spare can fail while idle)."""
        down = nodes.lost_nodes(requeue.job_record(self.job_id), allocated) if allocated else {}
        return {**(self.run.status().replaced_nodes or {}), **down, **bad}

    def can_swap_in_spares(self, bad=()) -> bool:
        if not self.spec.slurm.spare_nodes:
            return False
        allocated = nodes.allocated_nodes()
        left_out = self._left_out({node: "" for node in bad}, allocated)
        return spares.chosen(allocated, left_out, self.spec.nodes) is not None

    def swap_in_spares(self, bad, cause, attempt) -> bool:
        spec, run, echo = self.spec, self.run, self.echo
        if not spec.slurm.spare_nodes:
            return False
        allocated = nodes.allocated_nodes()
        status = run.status()
        before = self.in_use or spares.chosen(allocated, status.replaced_nodes or {}, spec.nodes) or []
        left_out = self._left_out(bad, allocated)
        after = spares.chosen(allocated, left_out, spec.nodes)
        listing = "; ".join(f"{node}: {why}" for node, why in sorted(bad.items()))
        if after is None:
            echo(f"jaxlaunch: node(s) failed ({listing}) and no spare node is left in this allocation "
                 f"({len(spares.usable(allocated, left_out))} usable of the {spec.nodes} the job needs)")
            run.log_event("spares_spent", cause=cause, nodes=bad)
            return False
        swap = {"cause": cause, "attempt": attempt, "nodes": sorted(n for n in before if n not in after),
                "spares": [n for n in after if n not in before], "why": bad}
        run.update_status(replaced_nodes=left_out, spare_swaps=[*(status.spare_swaps or []), swap])
        run.log_event("nodes_replaced", **swap)
        left = len(spares.usable(allocated, left_out)) - spec.nodes
        what = NODE_CAUSE_WORDS.get(cause, NODE_CAUSE_WORDS[Cause.NODE_FAILURE])
        echo(f"jaxlaunch: node(s) {what} ({listing}); restarting the ranks inside this allocation on "
             f"{', '.join(swap['spares']) or 'the nodes left'} (spare), from the latest checkpoint, without a "
             f"requeue ({left} spare node{'' if left == 1 else 's'} left)")
        return True

    def can_leave_nodes_behind(self, bad=()) -> bool:
        """Requeues are left, and the job's partition keeps enough nodes without the excluded ones
        and `bad`: otherwise the requeued job would wait in the queue for good."""
        status = self.run.status()
        if status.requeues >= self.spec.slurm.max_requeues:
            return False
        left = self._nodes_left_without(bad)
        return left is not None and left[1] >= self._nodes_wanted()

    def _nodes_wanted(self) -> int:
        return self.spec.nodes + self.spec.slurm.spare_nodes

    def _nodes_left_without(self, bad) -> tuple[str, int] | None:
        """(the job's partition, how many of its nodes are neither excluded, nor replaced, nor in `bad`);
        None when Slurm cannot tell."""
        status = self.run.status()
        partition = requeue.job_record(self.job_id).get("Partition")
        try:
            _, node_records = fit.read_cluster()
        except SchedulerError:
            return None
        if not partition:
            return None
        usable = {n.get("NodeName") for n in node_records if partition in n.get("Partitions", "").split(",")}
        gone = set(status.excluded_nodes or []) | set(status.replaced_nodes or {}) | set(bad)
        return partition, len(usable - gone)

    def leave_nodes_behind(self, bad, cause, failure, attempt):
        """Requeue the job without `bad` nodes (node: why): REQUEUED, or FAILED once
        slurm.max_requeues requeues are spent."""
        spec, run, echo = self.spec, self.run, self.echo
        status = run.status()
        # Nodes replaced by spares earlier are bad too: the next allocation must not hold them.
        excluded = sorted(set(status.excluded_nodes or []) | set(status.replaced_nodes or {}) | set(bad))
        run.update_status(excluded_nodes=excluded)
        run.log_event("nodes_left_behind", cause=cause, nodes=bad)
        listing = "; ".join(f"{node}: {why}" for node, why in sorted(bad.items()))
        what = NODE_CAUSE_WORDS.get(cause, NODE_CAUSE_WORDS[Cause.NODE_FAILURE])
        if status.requeues >= spec.slurm.max_requeues:
            failure = root_cause.scheduler_failure(
                reason=cause, attempt=attempt,
                summary=f"node(s) {what} ({listing}), and slurm.max_requeues={spec.slurm.max_requeues} is "
                        f"spent; excluded so far: {', '.join(excluded)}",
                fix="ask the cluster's admins about these nodes; resubmit (with --exclude) or raise slurm.max_requeues")
            return JobState.FAILED, failure
        left = self._nodes_left_without(bad)
        if left is not None and left[1] < self._nodes_wanted():
            # Requeued without them, the job would wait in the queue for good (nothing says so there).
            partition, count = left
            wanted = self._nodes_wanted()
            failure = root_cause.scheduler_failure(
                reason=cause, attempt=attempt,
                summary=f"node(s) {what} ({listing}); without them and the nodes excluded before "
                        f"({', '.join(excluded)}) partition {partition!r} has {count} node(s) left, fewer than "
                        f"the job's {wanted}: a requeue would wait in the queue for good, so the job ends here",
                fix=f"ask the cluster's admins about these nodes; resubmit to a partition with {wanted} good nodes "
                    f"(--set slurm.partition=...), or with fewer nodes")
            return JobState.FAILED, failure
        if failure is not None and run.failure_file.exists():
            run.failure_file.rename(run.logs / run.failure_file.name)  # the attempt's, kept with its logs
        counter = "hang_requeues" if cause == Cause.HANG else "node_failures"
        run.update_status(requeues=status.requeues + 1, **{counter: getattr(status, counter) + 1})
        echo(f"jaxlaunch: node(s) {what} ({listing}); requeueing job {self.job_id} without them "
             f"(requeue {status.requeues + 1} of at most {spec.slurm.max_requeues}); it resumes from "
             f"its latest checkpoint")
        return JobState.REQUEUED, None

    def requeues_spent(self, attempts):
        return requeue.count_requeues_slurm_made(self.run, self.spec, attempts, self.echo)

    def restart_count(self) -> str | None:
        return os.environ.get(requeue.RESTART_COUNT_ENV)

    def task_reports(self, text: str) -> list[tuple[int, int, dict]]:
        return srun.task_reports(text)

    def cancelled_outside(self) -> bool:
        return requeue.cancelled_by_slurm(requeue.job_record(self.job_id))

    def ended_by_preemption(self) -> bool:
        return requeue.preempted_by_slurm(requeue.job_record(self.job_id))

    def after_notice(self, sources, checkpointed):
        state, failure, cause = requeue.decide(self.run, self.spec, self.job_id, sources, checkpointed, self.echo)
        return JobState.parse(state), failure, cause

    def finish(self, state, requeue_cause) -> None:
        if state == JobState.CANCELLED:
            requeue.cancel_in_slurm(self.job_id)
        elif state == JobState.REQUEUED:
            requeue.requeue_now(self.run, self.job_id, requeue_cause, self.echo,
                                exclude=self.run.status().excluded_nodes or [])
