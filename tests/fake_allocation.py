"""One stand-in `Allocation` for the unit tier: it answers what a test scripts (failing and lost
nodes, spare nodes left, requeues left, what a notice leads to, what the scheduler says about a
cancel, a preemption or a restart) and records every question the supervisor asks it. A test of
the supervisor's decisions then needs no scheduler and no monkeypatched Slurm module.
SlurmAllocation's own answers are tested apart (tests/unit/test_slurm_allocation.py,
test_spare_nodes.py).

It implements the base class's hooks (swap_in_spares, leave_nodes_behind...), not
replace_nodes itself, so the base class's one decision (spares first, then a requeue, then the
end) is what a test sees."""

from __future__ import annotations

from launcher.states import JobState
from launcher.supervisor.allocation import Allocation


class ScriptedAllocation(Allocation):
    """Answers from a script; `calls` lists each question asked, as (name, *arguments)."""

    def __init__(self, *, job_id: str | None = "fake-7", failing: dict[str, str] | None = None,
                 lost: list[dict[str, str]] = (), spares: int = 0, requeues: int = 0,
                 restart_count: str | None = None, requeues_spent: dict | None = None,
                 notice: tuple[JobState, dict | None, str | None] = (JobState.PREEMPTED, None, None),
                 cancelled_outside: bool = False, ended_by_preemption: bool = False, launch=None):
        self.job_id = job_id                 # None: a machine of our own (no scheduler to ask about preemption)
        self.failing = dict(failing or {})   # failing_nodes(): the health check's answer
        self.lost = list(lost)               # lost_nodes(): one answer per failed attempt, then {}
        self.spares = spares                 # spare swaps left inside the allocation
        self.requeues = requeues             # requeues without the bad nodes left
        self.restarts = restart_count
        self.spent = requeues_spent          # requeues_spent(): the failure that ends a resumed job at once
        self.notice = notice                 # after_notice(): (state, failure, requeue cause)
        self.cancelled = cancelled_outside
        self.preempted = ended_by_preemption
        self.launch = launch                 # launch_command(): argv -> argv (None: unchanged)
        self.calls: list[tuple] = []
        self.bound: list[tuple] = []

    def asked(self, name: str) -> list[tuple]:
        """The arguments of every call of `name`, in order."""
        return [call[1:] for call in self.calls if call[0] == name]

    def questions(self) -> list[str]:
        """The names of the calls, in order (the polled cancelled_outside left out)."""
        return [call[0] for call in self.calls if call[0] != "cancelled_outside"]

    def bind(self, spec, run, echo=print):
        self.bound.append((spec, run, echo))
        return super().bind(spec, run, echo)

    def failing_nodes(self):
        self.calls.append(("failing_nodes",))
        return dict(self.failing)

    def lost_nodes(self):
        self.calls.append(("lost_nodes",))
        return self.lost.pop(0) if self.lost else {}

    def launch_command(self, argv):
        self.calls.append(("launch_command", list(argv)))
        return argv if self.launch is None else self.launch(argv)

    def can_replace_nodes(self, bad=()):
        self.calls.append(("can_replace_nodes", set(bad)))
        return super().can_replace_nodes(bad)

    def replace_nodes(self, bad, cause, failure, attempt):
        self.calls.append(("replace_nodes", dict(bad), cause, attempt))
        return super().replace_nodes(bad, cause, failure, attempt)

    # --- the hooks behind replace_nodes ------------------------------------------------------------

    def can_swap_in_spares(self, bad=()):
        return self.spares > 0

    def swap_in_spares(self, bad, cause, attempt):
        self.calls.append(("swap_in_spares", dict(bad), cause, attempt))
        if self.spares <= 0:
            return False
        self.spares -= 1
        return True

    def can_leave_nodes_behind(self, bad=()):
        return self.requeues > 0

    def leave_nodes_behind(self, bad, cause, failure, attempt):
        self.calls.append(("leave_nodes_behind", dict(bad), cause, attempt))
        if self.requeues <= 0:
            return JobState.FAILED, {"summary": f"node(s) {', '.join(sorted(bad))} and no requeue left",
                                     "reason": cause, "state": JobState.FAILED.value, "attempt": attempt}
        self.requeues -= 1
        return JobState.REQUEUED, None

    # --- the job's life in the scheduler -----------------------------------------------------------

    def requeues_spent(self, attempts):
        self.calls.append(("requeues_spent", attempts))
        return self.spent

    def restart_count(self):
        self.calls.append(("restart_count",))
        return self.restarts

    def cancelled_outside(self):
        self.calls.append(("cancelled_outside",))
        return self.cancelled

    def ended_by_preemption(self):
        self.calls.append(("ended_by_preemption",))
        return self.preempted

    def after_notice(self, sources, checkpointed):
        self.calls.append(("after_notice", set(sources), checkpointed))
        return self.notice

    def finish(self, state, requeue_cause):
        self.calls.append(("finish", JobState.parse(state), requeue_cause))
