"""How this cluster restarts a requeued job, read from `scontrol show config`: whether it allows
Slurm 25.11's expedited requeue (`sbatch --requeue=expedite`, with `enable_expedited_requeue` in
SlurmctldParameters: the job may start again at once, at top priority), and otherwise how long a
requeued job waits before it may start again (`requeue_delay` in SchedulerParameters from 25.11;
before, the credential lifetime: AuthInfo's cred_expire, 120 s by default).

`submit` asks once, for a job that may requeue, and renders `--requeue=expedite` where allowed;
`explain --target slurm` says which applies. Our test cluster runs Slurm 22.05: its figure (a
requeued job ran again 120 s after `scontrol requeue` with the default cred_expire) is measured by
tests/requeue_delay.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ...errors import SchedulerError
from . import scheduler

EXPEDITE_SINCE = (25, 11)
EXPEDITE_SETTING = "enable_expedited_requeue"
DEFAULT_DELAY_SECONDS = 120  # Slurm's default cred_expire, which requeue_delay follows


@dataclass(frozen=True)
class RequeuePolicy:
    version: str            # SLURM_VERSION, e.g. "22.05.8"; "" when not known
    expedite: bool          # sbatch --requeue=expedite is allowed here
    delay_seconds: int      # how long a requeued job (not expedited) waits before it may start
    delay_from: str         # where that figure comes from, for explain

    @property
    def known(self) -> bool:
        return bool(self.version)

    @property
    def offers_expedite(self) -> bool:
        """This Slurm has --requeue=expedite (whether or not the cluster enables it)."""
        return _version(self.version) >= EXPEDITE_SINCE


UNKNOWN = RequeuePolicy("", False, DEFAULT_DELAY_SECONDS, "Slurm's default; the cluster could not be asked")


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:2])


def _setting(config: str, key: str) -> str:
    match = re.search(rf"^{key}\s*=\s*(.*)$", config, re.MULTILINE)
    value = match.group(1).strip() if match else ""
    return "" if value == "(null)" else value


def _parameter(values: str, name: str) -> str | None:
    """`name`'s value in a comma list such as SchedulerParameters ('bf_interval=2,requeue_delay=5'):
    '' for a bare flag, None when absent."""
    for item in values.split(","):
        key, sep, value = item.strip().partition("=")
        if key == name:
            return value if sep else ""
    return None


def parse_policy(config: str) -> RequeuePolicy:
    """The policy that `scontrol show config`'s text describes. Pure."""
    version = _setting(config, "SLURM_VERSION")
    new_enough = _version(version) >= EXPEDITE_SINCE
    # slurm.conf(5) of 25.11 puts the switch in SlurmctldParameters; some vendors' docs write
    # SchedulerParameters: either counts.
    switch = any(_parameter(_setting(config, key), EXPEDITE_SETTING) is not None
                 for key in ("SlurmctldParameters", "SchedulerParameters"))
    expedite = new_enough and switch  # an older Slurm ignores the word, and its sbatch refuses the option
    delay = _parameter(_setting(config, "SchedulerParameters"), "requeue_delay")
    if new_enough and delay and delay.isdigit():
        return RequeuePolicy(version, expedite, int(delay), "SchedulerParameters requeue_delay")
    cred_expire = _parameter(_setting(config, "AuthInfo"), "cred_expire")
    if cred_expire and cred_expire.isdigit():
        return RequeuePolicy(version, expedite, int(cred_expire), "AuthInfo cred_expire")
    return RequeuePolicy(version, expedite, DEFAULT_DELAY_SECONDS, "Slurm's default cred_expire")


def read_policy() -> RequeuePolicy:
    """This cluster's policy (one `scontrol show config`); UNKNOWN when Slurm cannot be asked."""
    try:
        return parse_policy(scheduler.call_slurm(["scontrol", "show", "config"], timeout=20))
    except SchedulerError:
        return UNKNOWN
