"""Bad nodes left behind (Slurm jobs only): find the nodes that failed under the job, or that fail
the spec's health check, and requeue the job without them.

Slurm does not exclude a failed node by itself: a node that went down and came back (a reboot,
ReturnToService) is idle again at once, and a requeue can land on it. So the supervisor:
- submits with --no-kill (render.py), so a node failure ends the job step but not the job: the
  supervisor on the batch node lives on, sees the step fail, and learns which nodes were lost
  (nodes gone from the job's NodeList, or DOWN/DRAIN/FAIL/NOT_RESPONDING in `scontrol show node`);
- runs `slurm.health_check` once per node before the ranks start (srun, one task per node);
- requeues the job and adds those nodes to its ExcNodeList (Slurm takes the update only once the
  job is pending again, which `scontrol requeue` makes it at once, while this script is still
  being stopped), up to `slurm.max_requeues`.
The nodes excluded are in status.json (excluded_nodes), `jaxlaunch status` and events.jsonl.
If the batch node itself fails, the supervisor dies with it; Slurm then ends (or requeues) the job.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from ...errors import SchedulerError
from . import scheduler

BAD_STATE_FLAGS = ("DOWN", "DRAIN", "FAIL", "NOT_RESPONDING", "NO_RESPOND")
HEALTH_MARK = "jaxlaunch-health "
HEALTH_CHECK_SECONDS = 300  # a node whose check runs longer fails it
HEALTH_ENV = "JAXLAUNCH_HEALTH_CHECK"


def hostnames(nodelist: str) -> list[str]:
    """Slurm's hostlist ('node[1-3],gpu7') as names, by `scontrol show hostnames`."""
    if not nodelist or nodelist in ("(null)", "None"):
        return []
    return scheduler.call_slurm(["scontrol", "show", "hostnames", nodelist], timeout=20).split()


def allocated_nodes(env=os.environ) -> list[str]:
    """The nodes this batch job was given at its start."""
    try:
        return hostnames(env.get("SLURM_JOB_NODELIST", ""))
    except SchedulerError:
        return []


def lost_nodes(record: dict, allocated: list[str]) -> dict[str, str]:
    """{node: why} for the nodes of `allocated` that failed under the job (`record`: its `scontrol
    show job`): gone from its allocation (Slurm removes a failed node from a --no-kill job) or in a
    bad state now."""
    if not allocated:
        return {}
    lost = {}
    if record.get("NodeList"):
        try:
            now = set(hostnames(record["NodeList"]))
        except SchedulerError:
            now = set(allocated)
        lost.update({node: "Slurm removed it from the job's allocation (node failure)"
                     for node in allocated if node not in now})
    try:
        text = scheduler.call_slurm(["scontrol", "show", "node", "--oneliner", ",".join(allocated)], timeout=20)
    except SchedulerError:
        return lost
    for line in text.splitlines():
        fields = scheduler.parse_scontrol_record(line)
        node, state = fields.get("NodeName"), fields.get("State", "")
        flags = state.replace("+", " ").replace("*", " NOT_RESPONDING").split()
        if node in allocated and any(flag in BAD_STATE_FLAGS for flag in flags):
            reason = fields.get("Reason")
            lost.setdefault(node, f"State={state}" + (f" ({reason})" if reason and reason != "(null)" else ""))
    return lost


def exclusion_list(record: dict, nodes: list[str]) -> str:
    """The job's ExcNodeList (`record`: its `scontrol show job`) with `nodes` added, each node once
    (the list jaxlaunch passes holds every node it excluded before, which Slurm already has: issue 45
    saw ExcNodeList=node2,node2,node4)."""
    had = record.get("ExcNodeList", "")
    items = _hostlist_items(had) if had and had not in ("(null)", "None") else []
    return ",".join(dict.fromkeys([*items, *nodes]))


def _hostlist_items(text: str) -> list[str]:
    """The comma-separated items of a Slurm host list, a bracketed range staying one item."""
    items, depth, start = [], 0, 0
    for index, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            items.append(text[start:index])
            start = index + 1
    items.append(text[start:])
    return [item for item in items if item]


def exclude(job_id: str, nodelist: str) -> str | None:
    """Set the (pending, just requeued) job's ExcNodeList; None when it worked, else Slurm's error."""
    try:
        scheduler.call_slurm(["scontrol", "update", f"jobid={job_id}", f"ExcNodeList={nodelist}"], timeout=30)
        return None
    except SchedulerError as exc:
        return str(exc)


def health_check(command: str, nodes: list[str], timeout: float = HEALTH_CHECK_SECONDS) -> dict[str, str]:
    """Run `command` (a shell command: the spec's slurm.health_check) once on every node of the
    allocation, as one srun step; {node: why} for each node where it failed or did not answer."""
    argv = ["srun", "--mpi=none", f"--nodes={len(nodes)}", "--ntasks-per-node=1", "--kill-on-bad-exit=0",
            sys.executable, "-m", "launcher.backends.slurm.nodes", str(timeout)]
    env = {**os.environ, HEALTH_ENV: command}
    try:
        result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout + 60)
        out = result.stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        out = getattr(exc, "stdout", "") or ""
        if isinstance(out, bytes):
            out = out.decode(errors="replace")
    answers = {}
    for line in out.splitlines():
        if line.startswith(HEALTH_MARK):
            try:
                answer = json.loads(line[len(HEALTH_MARK):])
                answers[answer["node"]] = answer
            except (ValueError, KeyError, TypeError):
                continue
    failed = {}
    for node in nodes:
        answer = answers.get(node)
        if answer is None:
            failed[node] = "no answer from the health check"
        elif not answer["ok"]:
            tail = answer.get("output", "").strip().splitlines()[-1:] or [""]
            failed[node] = f"health check {answer['why']}" + (f": {tail[0]}" if tail[0] else "")
    return failed


def _check_this_node(timeout: float) -> None:
    """One srun task: run the health check here, print one marked JSON line."""
    import socket

    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    try:
        done = subprocess.run(["bash", "-c", os.environ[HEALTH_ENV]], capture_output=True, text=True,
                              timeout=timeout)
        ok, why, output = done.returncode == 0, f"exited with code {done.returncode}", done.stdout + done.stderr
    except subprocess.TimeoutExpired:
        ok, why, output = False, f"ran past {timeout:g} s", ""
    print(HEALTH_MARK + json.dumps({"node": node, "ok": ok, "why": why, "output": output[-2000:]}), flush=True)


if __name__ == "__main__":
    _check_this_node(float(sys.argv[1]))
