"""`jaxlaunch drill SPEC`: rehearse failures on the user's own job before the big run, and score
how it recovers. Nothing in the job changes: the drill runs it with `jaxlaunch run`, as the user
would, once clean and then once per fault, injecting the fault from outside at a point of its run:

- `kill`:    a rank is killed (SIGKILL), as the OOM killer or a dead host does. The job must fail fast
             and restart (the drill sets max_restarts to at least 1) from its latest checkpoint.
- `preempt`: a preemption notice (SIGUSR2 to `jaxlaunch run`, what Slurm's warning becomes). The job
             must checkpoint and stop (PREEMPTED), then `jaxlaunch run --resume` continues it.
- `hang`:    a rank stops, alive (SIGSTOP): the hang watchdog must stop the job (the drill sets
             hang_timeout from the clean run's step time) and the restart resume from a checkpoint.
- `repeat`:  the program's own hang: the chosen rank's `ctx.report` blocks at the same step on every
             attempt (rank/drill_fault.py). The watchdog must stop it, and the governor must not try a
             third time (max_restarts is 3): it passes when the job ends after two attempts with the
             governor's reason. Not in the default set; it needs a job that reports its steps.

Points: `start` (at the first report), `step` (a step chosen at random), `checkpoint` (the step a
checkpoint was saved at, as the save runs). A job that never reports is faulted at a random time
between 30% and 70% of the clean run's length instead.

For each fault: detected (and how many seconds after the fault), the state the faulted attempt ended
in, the seconds until the job was back at the step where the fault hit, the steps computed again,
and whether the final result equals the clean run's (bit for bit, or within --tolerance; a key named
`attempt`, which counts restarts by design, is not compared unless --ignore says otherwise). A fault
fails when it is not detected, when the job does not end COMPLETED, when the result differs, or when
more steps were computed again than the job's checkpoint interval (the largest gap between two
checkpoints of the clean run; a job that never checkpoints has none: any lost step fails it).

A fault counts as detected only when jaxlaunch ended the attempt for it (a failure for `kill`, the hang
watchdog's stop for `hang` and `repeat`) and named the faulted rank (scoring.py); the rank faulted is the
process mpirun or srun started, not a worker it forked (backends/faults.py). Every run works in a fresh
copy of the working directory, and the drill says what it shares (workdir.py). A job that reports no
steps has its steps computed again read from its output, or shown unknown (printed_steps.py).

Everything goes to DRILL_DIR (runs/drill-NAME-TIME by default): clean/, kill-1/, ..., each fault's
output in its .log, and drill.json (the seed, the points chosen, every figure). The exit code is 0
only when every fault passed.

`--target slurm` drills the job on the cluster it targets: each run is `jaxlaunch run --backend slurm`,
a preemption notice is Slurm's own (`scancel --batch --signal=USR2`; the job requeues itself), a
rank is killed or stopped on its node through a step of the job (`srun --overlap`, which finds the
rank's process there and signals it), and one more fault is possible:
- `node`:    the node of the chosen rank is set DOWN (`scontrol update state=down`, which needs Slurm
             operator rights; the drill sets it back to RESUME after the run). The job must go on on
             a spare node (slurm.spare_nodes) or requeue without it (slurm.max_requeues). The batch
             node, where the supervisor runs, is never chosen: its loss ends any Slurm job.
The Slurm side of each fault is the Slurm backend's (launcher/backends/slurm/faults.py).

The package: runs.py (a Trial's record, reading a run directory, ending a run, comparing results),
trials.py (the Drill: the clean run, the plan, each trial and its score, the scorecard) and session.py
(`run_drill`: one drill from start to end, interrupted cleanly), scoring.py, workdir.py and printed_steps.py.
"""

from .runs import ASKED_BY_NAME, REPEAT_RESTARTS, Trial, TrialTimedOut, end_run, same_result
from .session import ending_runs_when_interrupted, run_drill
from .trials import Drill

__all__ = ["ASKED_BY_NAME", "REPEAT_RESTARTS", "Drill", "Trial", "TrialTimedOut", "end_run",
           "ending_runs_when_interrupted", "run_drill", "same_result"]
