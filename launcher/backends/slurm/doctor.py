"""`jaxlaunch doctor`'s Slurm rows: are Slurm's commands here, and does a controller answer? Both
are warnings, never failures: local runs need no Slurm. The fixes are the scheduler wrapper's
words (scheduler.py), so doctor and every command that needs Slurm say the same thing."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Mapping

from ...checks import OK, WARN, Check, Started, which
from .scheduler import FIX_CONF_NOT_A_FILE, FIX_NO_COMMANDS, FIX_NO_CONTROLLER, where_configured

COMMAND_TIMEOUT = 10.0      # scontrol ping
SLURM_COMMANDS = ("sbatch", "squeue", "scontrol", "sinfo")


def start_checks(env: Mapping[str, str]):
    """Start `scontrol ping` now (unless there is no scontrol, or SLURM_CONF names no file: then
    scontrol would retry for 60 s before saying so); returns the function that collects the checks."""
    conf = env.get("SLURM_CONF")
    scontrol = which("scontrol", env)
    skipped = ""
    if scontrol is None:
        skipped = "scontrol is not on PATH"
    elif conf and not Path(conf).is_file():
        skipped = f"SLURM_CONF={conf} is not a file"
    ping = None if skipped else Started([scontrol, "ping"], env, COMMAND_TIMEOUT)
    return lambda: slurm_checks(env, ping, skipped)


def slurm_checks(env: Mapping[str, str], ping: Started | None, ping_skipped: str) -> list[Check]:
    """The rows 'slurm commands' and 'slurm controller'; `ping` is the started `scontrol ping`,
    None when it was skipped for the reason `ping_skipped`."""
    found = {command: which(command, env) for command in SLURM_COMMANDS}
    missing = [command for command, path in found.items() if path is None]
    if missing:
        present = [f"{c} ({p})" for c, p in found.items() if p]
        commands = Check("slurm commands", WARN, f"not on PATH: {', '.join(missing)}"
                         + (f"; found: {', '.join(present)}" if present else ""),
                         f"{FIX_NO_COMMANDS} (module load slurm)")
    else:
        folders = sorted({str(Path(p).parent) for p in found.values()})
        commands = Check("slurm commands", OK, f"{', '.join(SLURM_COMMANDS)} in {', '.join(folders)}")
    if ping is None:
        fix = FIX_CONF_NOT_A_FILE if ping_skipped.startswith("SLURM_CONF") else FIX_NO_COMMANDS
        return [commands, Check("slurm controller", WARN, f"not checked: {ping_skipped}", fix)]
    where = where_configured(env)
    outcome = ping.outcome()
    answer = " ".join(line.strip() for line in outcome.stdout.splitlines() if line.strip())
    if outcome.returncode == 0 and re.search(r"\bUP\b", answer):
        return [commands, Check("slurm controller", OK, f"scontrol ping: {answer}")]
    if outcome.returncode is not None and outcome.returncode > 0:
        detail = f"scontrol ping found no controller (exit code {outcome.returncode}): {outcome.last_error_line()}"
    else:
        detail = outcome.why_not("scontrol ping", COMMAND_TIMEOUT)
    return [commands, Check("slurm controller", WARN, f"{detail} ({where})", FIX_NO_CONTROLLER)]
