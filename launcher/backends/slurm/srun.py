"""What srun prints when its tasks end badly, read for the supervisor's root cause
(launcher/supervisor/root_cause.py asks through SlurmAllocation.task_reports): srun names every
task that ended with a non-zero code or a signal, the first one first."""

from __future__ import annotations

import re

from ...supervisor.root_cause import SIGNAL_BY_DESCRIPTION

TASK_LINE = re.compile(r"srun: error: (\S+): tasks? ([\d,\-]+): (.+?)(?: \(core dumped\))?$")


def task_ranks(text: str) -> list[int]:
    """'1', '0-2' or '1,3' (srun's task lists)."""
    ranks = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        ranks += list(range(int(first), int(last or first) + 1))
    return ranks


def task_reports(text: str) -> list[tuple[int, int, dict]]:
    """(rank, position, fields) for every task srun reports as failed, in the order it says so."""
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
