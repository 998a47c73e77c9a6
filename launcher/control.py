"""The control protocol between a job's supervisor and its ranks: every message's name and shape,
for both sides. Today the channel is small JSON files in RUN_DIR/control/ (and the ranks' state
reports in logs/), written atomically; this module is the one place that knows that, so another
channel can replace it without touching either side.

Supervisor -> every rank:
    stop.json           StopRequest: dump your stacks and state now, the job is being stopped
    preempt.json        PreemptNotice: the supervisor got a preemption notice (SIGUSR2)
Rank N -> supervisor:
    started-rank-N.json RankStarted: the rank is up (its host and pid)
    done-rank-N.json    RankDone: its entrypoint returned, after this many launcher collectives
    abort-rank-N.json   AbortRequest: stop the job (a collective past collective_timeout, or a
                        peer that left main while this rank waits for it)
    notice-rank-N.json  NoticeSeen: a preemption notice reached this rank (and how)
    logs/rank-N.state.json  RankState: where the rank was when asked to stop (the hang report)
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .rundir import RunDirectory, atomic_write_json

STOP_FILE = "stop.json"
PREEMPT_FILE = "preempt.json"


@dataclass
class StopRequest:
    reason: str             # timeout, collective_timeout, left_early, cancelled, ...
    time: float
    detail: str | None = None
    attempt: int | None = None


@dataclass
class PreemptNotice:
    signal: str
    time: float


@dataclass
class RankStarted:
    rank: int
    host: str
    pid: int
    time: float


@dataclass
class RankDone:
    rank: int
    collectives: int        # launcher collectives the rank made
    time: float
    stopped: dict | None = None  # the agreed preemption stop it returned at, if any


@dataclass
class AbortRequest:
    rank: int
    host: str
    reason: str             # collective_timeout or left_early
    message: str
    time: float
    collective: dict = field(default_factory=dict)  # {"seq", "name", "seconds"}
    culprit: int | None = None  # the rank that left main early


@dataclass
class NoticeSeen:
    rank: int
    sources: list[str]      # SIGUSR2, SIGTERM, supervisor
    time: float | None


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


class ControlChannel:
    """The control messages of one run directory; both sides make one."""

    def __init__(self, run: RunDirectory):
        self.run = run
        self.folder = run.control

    def prepare(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)

    # --- supervisor -> ranks ---

    def request_stop(self, request: StopRequest) -> None:
        atomic_write_json(self.folder / STOP_FILE, asdict(request))

    def send_preempt_notice(self, notice: PreemptNotice) -> None:
        atomic_write_json(self.folder / PREEMPT_FILE, asdict(notice))

    def stop_request(self) -> dict | None:
        """The supervisor's stop request (as written), None while there is none."""
        return _read(self.folder / STOP_FILE)

    def preempt_noticed(self) -> bool:
        return (self.folder / PREEMPT_FILE).exists()

    # --- ranks -> supervisor ---

    def _write_rank(self, kind: str, record) -> None:
        atomic_write_json(self.folder / f"{kind}-rank-{record.rank}.json", asdict(record))

    def mark_started(self, record: RankStarted) -> None:
        self._write_rank("started", record)

    def mark_done(self, record: RankDone) -> None:
        self._write_rank("done", record)

    def request_abort(self, record: AbortRequest) -> None:
        self._write_rank("abort", record)

    def report_notice(self, record: NoticeSeen) -> None:
        self._write_rank("notice", record)

    def report_state(self, rank: int, state: dict) -> None:
        atomic_write_json(self.run.rank_state(rank), state)

    def _records(self, kind: str) -> list[dict]:
        return self.run.read_json_files(self.folder, f"{kind}-rank-*.json")

    def started(self) -> list[dict]:
        return self._records("started")

    def done(self) -> list[dict]:
        return self._records("done")

    def abort_requests(self) -> list[dict]:
        return self._records("abort")

    def notices(self) -> list[dict]:
        return self._records("notice")

    def rank_states(self) -> list[dict]:
        return self.run.read_json_files(self.run.logs, "rank-*.state.json")
