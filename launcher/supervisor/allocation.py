"""What the supervisor needs from the place its job runs: the `Allocation` interface. The supervisor
owns it (it is the one that asks) and each backend implements it (launcher/backends/base.py
re-exports it as part of the seam), so the supervisor imports no backend and no backend's
scheduler leaks into it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from ..states import JobState


class NodeAction(str, Enum):
    SPARE = "spare"      # the next attempt starts at once, spare nodes of the allocation in the bad ones' place
    REQUEUE = "requeue"  # the job goes back to the queue without the bad nodes
    END = "end"          # neither is possible: the job ends FAILED


@dataclass(frozen=True)
class NodeDecision:
    """What the allocation makes of bad nodes after an attempt (Allocation.replace_nodes): one
    decision, which the supervisor carries out (it writes failure.json when the job ends)."""

    action: NodeAction
    state: JobState | None = None  # REQUEUED or FAILED; None for a spare swap
    failure: dict | None = None    # END: why the job ends


class Allocation:
    """The in-job side of a backend: what a running job's supervisor needs from the place its job
    runs (submitit's JobEnvironment, torchelastic's agent). The supervisor is given one, binds it
    to its job once (`bind`: the spec, the run directory, where to say things), and from then on
    asks it with no more than the question's own facts; it never asks a scheduler itself. This
    base class is a machine of our own (a local run): the ranks reach the supervisor on
    127.0.0.1, no node can be lost, and nothing is requeued.
    Slurm's: launcher/backends/slurm/allocation.py."""

    job_id: str | None = None   # the scheduler's id for the job, when it has one

    def bind(self, spec, run, echo=print) -> "Allocation":
        """The job this allocation serves: its spec, its run directory (a RunDirectory) and the
        supervisor's `echo`. The Supervisor calls it once, as it is made; every method below
        except control_host reads them from here."""
        self.spec, self.run, self.echo = spec, run, echo
        return self

    def control_host(self, env) -> str:
        """The address the supervisor's control channel binds to, which every rank can reach:
        JAXLAUNCH_CONTROL_HOST when set, else the allocation's own answer."""
        from ..environment import CONTROL_HOST_ENV

        return env.get(CONTROL_HOST_ENV) or self.default_control_host(env)

    def default_control_host(self, env) -> str:
        return "127.0.0.1"

    def failing_nodes(self) -> dict[str, str]:
        """{node: why} for the nodes that fail the spec's health check, before the first attempt."""
        return {}

    def lost_nodes(self) -> dict[str, str]:
        """{node: why} for the nodes the allocation lost under a failed attempt."""
        return {}

    def launch_command(self, argv: list[str]) -> list[str]:
        """The launcher's argv for the next attempt (a Slurm allocation with spare nodes names the
        nodes the ranks run on)."""
        return argv

    # --- bad nodes: the supervisor asks the two questions below and nothing else about them --------

    def can_replace_nodes(self, bad=()) -> bool:
        """Whether `bad` nodes (a hang's culprits) can be replaced at all: by spares inside the
        allocation, or by a requeue without them (otherwise the job restarts or ends as after any failure)."""
        return self.can_swap_in_spares(bad) or self.can_leave_nodes_behind(bad)

    def replace_nodes(self, bad: dict[str, str], cause: str, failure: dict | None, attempt: int) -> NodeDecision:
        """One decision for `bad` nodes (node: why): spares in their place inside the allocation, else a
        requeue without them, else the end."""
        if self.swap_in_spares(bad, cause, attempt):
            return NodeDecision(NodeAction.SPARE)
        state, failure = self.leave_nodes_behind(bad, cause, failure, attempt)
        action = NodeAction.REQUEUE if state == JobState.REQUEUED else NodeAction.END
        return NodeDecision(action, state, failure)

    # The backend's hooks behind those two questions, in the order replace_nodes tries them; the
    # supervisor never calls them.

    def can_swap_in_spares(self, bad=()) -> bool:
        """Whether swap_in_spares can replace `bad` nodes inside this allocation."""
        return False

    def swap_in_spares(self, bad: dict[str, str], cause: str, attempt: int) -> bool:
        """Stop using `bad` nodes (node: why) inside the allocation, spare nodes in their place: True
        when the next attempt can start at once, False when too few nodes are left (then the job is
        requeued without them, or ends)."""
        return False

    def can_leave_nodes_behind(self, bad=()) -> bool:
        """Whether leave_nodes_behind can still requeue the job without `bad` (a hang's culprit node
        is then left behind; otherwise the job restarts or ends as after any failure)."""
        return False

    def leave_nodes_behind(self, bad: dict[str, str], cause: str, failure: dict | None,
                           attempt: int) -> tuple[JobState, dict | None]:
        """Give the job its nodes back without `bad`: REQUEUED, or FAILED (with the failure, which the
        supervisor writes) when it cannot."""
        raise NotImplementedError(f"{type(self).__name__} cannot replace nodes")

    # --- the job's life in the scheduler ---------------------------------------------------------

    def requeues_spent(self, attempts: int) -> dict | None:
        """When the job starts again in its run directory (after `attempts` attempts): the failure
        that ends it at once (requeued more often than the spec allows), else None."""
        return None

    def restart_count(self) -> str | None:
        """How many times the scheduler has started this job again, as it says it (None: it does not)."""
        return None

    def task_reports(self, text: str) -> list[tuple[int, int, dict]]:
        """The tasks this scheduler's launcher says ended badly, read from its output `text`, as
        (rank, position, fields) in the order it said so (srun names every such task); mpirun's
        own messages are read by root_cause.py for every allocation."""
        return []

    def cancelled_outside(self) -> bool:
        """The scheduler is ending the job because somebody cancelled it there (not through
        `jaxlaunch cancel`, which writes an event the supervisor reads itself)."""
        return False

    def ended_by_preemption(self) -> bool:
        """The scheduler ended the ranks for a preemption before they could stop on a notice."""
        return False

    def after_notice(self, sources: set[str], checkpointed: bool) -> tuple[JobState, dict | None, str | None]:
        """The ranks stopped on a preemption notice (or were ended by one): the job's state, its
        failure record, and the cause of a requeue. A local run ends PREEMPTED, to resume with
        `run --resume`."""
        return JobState.PREEMPTED, None, None

    def finish(self, state: JobState, requeue_cause: str | None) -> None:
        """After status.json has the final state: what the scheduler must be told (a cancel to
        record, a requeue to make)."""
