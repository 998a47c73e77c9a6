"""Where a job's hours went: its wall time split, over every attempt, restart and requeue, from
RUN_DIR/status.json, events.jsonl and metrics.jsonl (ctx.report): a record, which `jaxlaunch goodput`
(launcher/cli/goodput_view.py draws it), `status -v`, the drill and the API (Job.goodput) read.

Categories, in the order they come in an attempt:
- queued: from submission to the first attempt (Slurm's queue);
- start-up: from an attempt's start (the supervisor launching mpirun/srun) to rank 0 entering main
  (MPI, imports, device binding, preflight, jax.distributed);
- first step: from main to its first report (loading, restoring, and compiling);
- productive steps: from the first report to the last, less the two below;
- checkpoint blocking: what ctx.checkpoints.save blocked the job for;
- work lost: the steps of an attempt that the next attempt computed again (it resumed from an
  earlier checkpoint than the attempt's last step), with their count;
- wind-down: from an attempt's last report to its end (the last checkpoint, teardown, a stop);
- between attempts: from an attempt's end to the next one's start (a restart, or a requeue until
  Slurm started the job again).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import RunDirectory
from .metrics import read_lines

CATEGORIES = ["queued", "start-up", "first step", "productive steps", "checkpoint blocking", "work lost",
              "wind-down", "between attempts"]


# Each attempt's way to its first step (the start-up budget, `jaxlaunch goodput` and `status -v`):
# from the supervisor's attempt_started, rank 0's main_started (its `startup` times: process start,
# MPI ready, jax.distributed ready, JAX's devices ready, preflight done), its restore and the compile
# seconds JAX reported before its first ctx.report (first_report).
BUDGET_PHASES = ["queue wait", "launch", "imports and MPI", "jax.distributed", "JAX and devices", "preflight",
                 "restore", "compile", "first step"]


def start_up_budget(start: float, previous_end: float | None, queued: float, events: list[dict],
                    end: float) -> dict:
    """Seconds per BUDGET_PHASES of one attempt (None: the phase was not seen), and `total`: from
    the attempt's start to its first report (None: it never reported)."""
    inside = [e for e in events if start <= e.get("time", 0) <= end]
    main = next((e for e in inside if e["event"] == "main_started"), None)
    first = next((e for e in inside if e["event"] == "first_report"), None)
    restored = next((e for e in inside if e["event"] == "restored"), None)
    phases: dict = {name: None for name in BUDGET_PHASES}
    phases["queue wait"] = queued if previous_end is None else max(0.0, start - previous_end)
    if main is not None:
        marks = main.get("startup") or {}
        previous = start
        for name, key in (("launch", "process"), ("imports and MPI", "mpi"), ("jax.distributed", "jax_distributed"),
                          ("JAX and devices", "devices"), ("preflight", "preflight")):
            if marks.get(key) is not None:
                phases[name] = max(0.0, marks[key] - previous)
                previous = marks[key]
        if first is not None:
            after_main = max(0.0, first["at"] - main["time"])
            restore = min(after_main, (restored or {}).get("seconds") or 0.0) if restored else None
            compiled = min(after_main - (restore or 0.0), first.get("compile_seconds") or 0.0)
            phases["restore"], phases["compile"] = restore, compiled
            phases["first step"] = max(0.0, after_main - (restore or 0.0) - compiled)
    phases["total"] = None if first is None else first["at"] - start
    return phases


@dataclass
class Goodput:
    wall_seconds: float
    seconds: dict = field(default_factory=dict)          # category -> seconds
    steps_recomputed: int = 0
    attempts: list = field(default_factory=list)         # per attempt: its intervals, for the timeline
    budgets: list = field(default_factory=list)          # per attempt: its start-up budget (start_up_budget)
    submitted: float | None = None
    reported: bool = True  # the job reported steps (ctx.report): without, there are no steps to count
    governor: str | None = None  # why the job was not tried again (supervisor/governor.py), if it was not

    @property
    def accounted(self) -> float:
        return sum(self.seconds.values()) / self.wall_seconds if self.wall_seconds > 0 else 0.0

    @property
    def goodput(self) -> float:
        return self.seconds.get("productive steps", 0.0) / self.wall_seconds if self.wall_seconds > 0 else 0.0

    def rows(self) -> list[list]:
        rows = [[name, f"{self.seconds.get(name, 0.0):.1f}",
                 f"{100 * self.seconds.get(name, 0.0) / self.wall_seconds:.1f}%" if self.wall_seconds else ""]
                for name in CATEGORIES]
        rows[CATEGORIES.index("work lost")][0] = f"work lost ({self.steps_recomputed} steps recomputed)"
        rows.append(["wall time", f"{self.wall_seconds:.1f}", f"{100 * self.accounted:.1f}% accounted"])
        return rows

    def budget_rows(self) -> list[list]:
        """One row per attempt: its seconds per start-up phase, and in all to its first step."""
        def shown(value):
            return "-" if value is None else f"{value:.1f}"
        return [[budget["attempt"], *(shown(budget[name]) for name in BUDGET_PHASES), shown(budget["total"])]
                for budget in self.budgets]


def goodput(run_dir) -> Goodput:
    run = RunDirectory(run_dir)
    try:
        status = json.loads(run.status_file.read_text())
    except (OSError, ValueError):
        status = {}
    events = sorted(run.read_events(), key=lambda e: e.get("time", 0))
    reports = sorted((r for r in read_lines(run.metrics_file) if r.get("kind") == "metrics"),
                     key=lambda r: r["time"])  # read_lines: steps as numbers, even where written as strings
    starts = [e for e in events if e["event"] == "attempt_started"]
    ends = {e["attempt"]: e["time"] for e in events if e["event"] == "attempt_ended"}
    end_of_run = status.get("ended") or time.time()
    first_start = starts[0]["time"] if starts else status.get("started") or end_of_run
    submitted = status.get("submitted") or first_start
    result = Goodput(wall_seconds=end_of_run - submitted, submitted=submitted,
                     seconds={name: 0.0 for name in CATEGORIES}, reported=bool(reports),
                     governor=next((e.get("why") for e in events if e["event"] == "governor"), None))
    result.seconds["queued"] = max(0.0, first_start - submitted)
    attempts = []
    for index, start in enumerate(starts):
        begin = start["time"]
        finish = ends.get(start["attempt"], starts[index + 1]["time"] if index + 1 < len(starts) else end_of_run)
        inside = [r for r in reports if begin <= r["time"] <= finish]
        main = next((e["time"] for e in events if e["event"] == "main_started" and begin <= e["time"] <= finish),
                    None)
        attempt = {"attempt": start["attempt"], "start": begin, "end": finish, "main": main,
                   "first": inside[0]["time"] if inside else None, "last": inside[-1]["time"] if inside else None,
                   "reports": inside,
                   "blocked": sum(e.get("blocked", 0.0) for e in events
                                  if e["event"] == "checkpoint" and begin <= e["time"] <= finish),
                   "restored": next((e["step"] for e in events
                                     if e["event"] == "restored" and begin <= e["time"] <= finish), None)}
        attempts.append(attempt)
    for index, attempt in enumerate(attempts):
        main = attempt["main"] or attempt["end"]
        result.seconds["start-up"] += main - attempt["start"]
        if attempt["first"] is None:
            result.seconds["wind-down"] += attempt["end"] - main  # main never reported a step
            attempt["lost"] = 0.0
        else:
            result.seconds["first step"] += attempt["first"] - main
            steps = attempt["last"] - attempt["first"]
            lost = 0.0
            if index + 1 < len(attempts):  # what the next attempt did again
                again_from = attempts[index + 1]["restored"] or 0
                done = [r for r in attempt["reports"] if r["step"] >= again_from]
                if done:
                    result.steps_recomputed += len({r["step"] for r in done})
                    before = [r for r in attempt["reports"] if r["step"] < again_from]
                    lost = attempt["last"] - (before[-1]["time"] if before else attempt["first"])
            attempt["lost"] = lost
            blocked = min(attempt["blocked"], max(0.0, steps - lost))
            result.seconds["work lost"] += lost
            result.seconds["checkpoint blocking"] += blocked
            result.seconds["productive steps"] += max(0.0, steps - lost - blocked)
            result.seconds["wind-down"] += attempt["end"] - attempt["last"]
        if index + 1 < len(attempts):
            result.seconds["between attempts"] += attempts[index + 1]["start"] - attempt["end"]
    result.attempts = [{k: v for k, v in a.items() if k != "reports"} for a in attempts]
    for index, attempt in enumerate(attempts):
        previous_end = attempts[index - 1]["end"] if index else None
        budget = start_up_budget(attempt["start"], previous_end, result.seconds["queued"], events, attempt["end"])
        result.budgets.append({"attempt": attempt["attempt"], **budget})
    return result
