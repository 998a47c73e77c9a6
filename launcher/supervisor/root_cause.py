"""Why a job ended: failure.json from what the ranks recorded and what mpirun/srun printed.

Sources, most precise first:
- logs/rank-N.error.json: a rank's own record of an exception or a non-zero sys.exit;
- a rank's request to stop the job over the control channel (collective watchdog), or the
  supervisor's finding that a peer left `main` early (both in logs/control.json);
- mpirun's or srun's own messages: a rank killed by a signal (SIGSEGV, SIGKILL from the OOM
  killer) or exiting without MPI_Finalize (os._exit) leaves nothing else behind (each launcher's
  module in launcher/launchers/ reads its own);
- logs/rank-N.log: faulthandler's "Fatal Python error" block after a crash in C;
- logs/rank-N.state.json: where every rank was when the job was stopped (the hang report).
The first failing rank is the earliest by time, as in torchelastic.
"""

from __future__ import annotations

import re
import time

from . import rollcall
from ..launchers import mpirun
from ..launchers.signal_words import SIGNAL_BY_DESCRIPTION
from ..states import Cause, JobState

MPI_ERR_UNKNOWN_EXIT = 14  # Open MPI's exit code for a rank its MPI library aborted (MPI_ERR_UNKNOWN)
LOG_TAIL_LINES = 5  # of the failing rank's log, in `status`, `logs` and `--wait`
_FATAL_PYTHON = re.compile(r"^Fatal Python error: (.+)$", re.MULTILINE)

VANISHED = ("vanished without a trace before the job ended: os._exit(), SIGKILL (e.g. from the out-of-memory "
            "killer), or main returned while the others still ran")


# The signals a launcher's teardown sends (srun --kill-on-bad-exit, mpirun): a task killed by one
# may only have been ended because another failed. Also the out-of-memory killer's SIGKILL.
TEARDOWN_SIGNALS = ("SIGKILL", "SIGTERM")


def _likely_a_victim(report: dict) -> int:
    """How likely a rank the launcher reported was ended by another's failure, for the order of
    reports no rank recorded itself (srun names every task, and not always the cause first):
    0, a crash signal (SIGSEGV...) or an exit code of the program's own; 1, a teardown signal,
    which is also the out-of-memory killer's; 2, exit code 14 with no signal: its MPI library
    aborted with MPI_ERR_UNKNOWN, what Open MPI does when a peer's connection drops ("An error
    occurred in Socket closed ... Unknown error")."""
    if report.get("signal") is None and report.get("exit_code") == MPI_ERR_UNKNOWN_EXIT:
        return 2
    return 1 if report.get("signal") in TEARDOWN_SIGNALS else 0


def parse_launcher_messages(text: str, task_reports=None) -> tuple[list[dict], bool]:
    """(records, reports_every_task): every rank the launcher reports as failed, in the order it
    reported them. mpirun's messages (launcher/launchers/mpirun.py) name only the rank that brought
    the job down, and are read for every allocation. A launcher that names every task that ended
    badly (srun) is read by the allocation's `task_reports(text)`: a list of (rank, position,
    fields), the first one first; reports_every_task says it reported any."""
    found: dict[int, dict] = {}
    every_task = task_reports(text) if task_reports is not None else []
    for rank, position, fields in [*mpirun.rank_reports(text), *every_task]:
        record = found.setdefault(rank, {"rank": rank, "host": None, "exit_code": None, "signal": None,
                                         "error": None, "source": "launcher", "position": position})
        record["position"] = min(record["position"], position)
        record.update({k: v for k, v in fields.items() if v is not None})
    return sorted(found.values(), key=lambda r: r.pop("position")), bool(every_task)


def crash_report(log_text: str) -> tuple[str, str] | None:
    """(summary, stack) from faulthandler's 'Fatal Python error' block in a rank's log, if any."""
    matches = list(_FATAL_PYTHON.finditer(log_text))
    if not matches:
        return None
    last = matches[-1]
    return f"Fatal Python error: {last.group(1).strip()}", log_text[last.start():].strip()[:20000]


def build_failure(*, state: str, reason: str, num_processes: int, rank_errors: list[dict],
                  abort_requests: list[dict], launcher_reports: list[dict], reports_every_task: bool,
                  finished_ranks: set[int], started_ranks: dict[int, str], rank_states: list[dict],
                  log_tail, launcher_exit_code: int | None, attempt: int, seen_at: float,
                  detail: str = "", launcher_tail: list[str] = (), named: list[int] | None = None) -> dict:
    """The failure.json document. Its keys:

    | key | meaning |
    |---|---|
    | `state` | `FAILED`, `TIMEOUT` or `CANCELLED` |
    | `reason` | `failed` (a rank failed), `left_early`, `hang` (the hang watchdog), `timeout`, `collective_timeout` or `cancelled` |
    | `summary` | one line, e.g. `rank 1 on node2 failed first: RuntimeError: boom` |
    | `attempt` | which attempt failed (0 = the first) |
    | `time` | when the supervisor wrote it (seconds since the epoch) |
    | `first_failure` | the earliest failing rank (by time, as torchelastic does): a rank record, or null |
    | `failed_ranks` | every failing rank's record, earliest first |
    | `torn_down_ranks` | ranks that ended only because the job was torn down |
    | `hang` | for timeouts, watchdog stops and cancels: `ranks` (per rank: `answered`, `host`, `where`, `collective`, `waiting_seconds`, `collectives_started`), and for the watchdog `collective` (`name`, `seq`, `seconds`) and `never_arrived`; for hangs `roll_call` (`line`, `waiting`: where most ranks wait, `culprits`: the ranks elsewhere, each with `rank`, `host`, `kind`, `where`, `why`) |
    | `launcher` | `exit_code` of mpirun/srun and its last `messages` (also in `logs/launcher.log`) |
    | `governor` | when the job was not tried again because its failure repeated (supervisor/governor.py): `decision` (`stopped`) and `why` |

    A rank record has `rank`, `host`, `time`, `exit_code`, `signal` (e.g. `SIGSEGV`, or null), `error` (the
    exception's own `Type: message`, never a note JAX appends; or what happened, e.g. `killed by SIGKILL`),
    `traceback` (Python's, or faulthandler's after a crash in C), `step` (the last step the rank reported, when
    it recorded its own error), and `source` (`rank`: the rank recorded it
    itself; `launcher`: from mpirun's or srun's report; `watchdog`). A rank that dies without a trace and that
    the launcher does not name (srun does not report a task that exits with code 0; mpirun may name the peer
    whose connection broke instead) is reported as `vanished without a trace`.

    How the root cause is chosen:

    Ranks that recorded their own error are failed, at the time they recorded it. Of the ranks
    known only from the launcher's report, the first one reported is the cause when no rank
    recorded anything; the later ones, and ranks reported after a rank's own error, were ended by
    the teardown (srun reports those too). A rank that vanished (started, did not finish `main`,
    recorded nothing, and the launcher does not name it) exited early with code 0 (os._exit(0)):
    srun never reports such a task, and mpirun may name instead the peer whose MPI library lost
    its connection to it. `started_ranks` maps each started rank to its host; `log_tail(rank)` gives
    the end of a rank's log, where faulthandler reports a crash in C.
    """
    failed: dict[int, dict] = {}
    for record in rank_errors:
        failed[record["rank"]] = {**record, "source": "rank"}
    for request in abort_requests:
        culprit = request.get("culprit")
        if request.get("reason") == Cause.LEFT_EARLY and culprit is not None and culprit not in failed:
            failed[culprit] = {"rank": culprit, "host": None, "exit_code": 0, "signal": None,
                               "error": f"left main early: {request['message']}", "time": request["time"],
                               "source": "watchdog"}
    lost_hosts = {r["lost_peer_host"] for r in launcher_reports if r.get("lost_peer_host")}
    only_victims = bool(launcher_reports) and all(r.get("lost_peer_host") for r in launcher_reports)
    launcher_reports = [{k: v for k, v in r.items() if k != "lost_peer_host"} for r in launcher_reports]
    reported = {r["rank"] for r in launcher_reports}
    vanished = sorted(set(started_ranks) - finished_ranks - reported - set(failed))
    if vanished and not failed and (reports_every_task or only_victims):
        on_lost_host = [r for r in vanished if started_ranks[r] in lost_hosts]
        rank = (on_lost_host or vanished)[0]
        failed[rank] = {"rank": rank, "host": started_ranks[rank], "exit_code": 0, "signal": None,
                        "error": VANISHED, "time": seen_at - 1e-3,
                        "source": "launcher"}
    launcher_only = sorted((r for r in launcher_reports if r["rank"] not in failed), key=_likely_a_victim)
    if not failed and launcher_only:
        failed[launcher_only[0]["rank"]] = {**launcher_only[0], "time": seen_at}
    for record in launcher_reports:  # the launcher may know the exit code or signal of a rank's own failure
        if record["rank"] in failed:
            for key in ("exit_code", "signal", "host"):
                if failed[record["rank"]].get(key) is None and record.get(key) is not None:
                    failed[record["rank"]][key] = record[key]
    for rank, record in failed.items():
        if not record.get("traceback"):
            crash = crash_report(log_tail(rank))
            if crash:
                if record.get("error") == VANISHED:
                    record["error"] = "crashed"
                record["error"] = f"{record.get('error') or 'crashed'}; {crash[0]}"
                record["traceback"] = crash[1]
                if record.get("signal") is None:
                    described = crash[0].removeprefix("Fatal Python error: ")
                    record["signal"] = getattr(SIGNAL_BY_DESCRIPTION.get(described), "name", None)
        record.setdefault("traceback", None)
    ordered = sorted(failed.values(), key=lambda r: (r.get("time") or float("inf"), r["rank"]))
    first = ordered[0] if ordered else None
    # A rank that had finished its entrypoint was not cut off by the teardown, only its MPI exit was.
    torn_down = sorted(set(range(num_processes)) - set(failed) - set(finished_ranks))
    if first is not None and reason in (Cause.FAILED, Cause.LEFT_EARLY):
        host = f" on {first['host']}" if first.get("host") else ""
        summary = f"rank {first['rank']}{host} failed first: {first.get('error') or 'see its log'}"
    else:
        summary = detail or reason
    document = {
        "state": state, "reason": reason, "summary": summary, "attempt": attempt, "time": time.time(),
        "first_failure": first, "failed_ranks": ordered, "torn_down_ranks": torn_down,
        "launcher": {"exit_code": launcher_exit_code, "messages": list(launcher_tail)[-40:]},
    }
    if rank_states or reason in (*HANG_REASONS, Cause.CANCELLED):
        document["hang"] = hang_report(num_processes, rank_states, abort_requests, finished_ranks)
        if reason in HANG_REASONS:
            roll = rollcall.roll_call(num_processes, rank_states, finished_ranks, started_ranks, named=named)
            document["hang"]["roll_call"] = roll
            if roll["culprits"]:
                document["summary"] = f"{summary}; " + "; ".join(
                    f"rank {c['rank']}{' on ' + c['host'] if c.get('host') else ''} held it up, {c['why']}"
                    for c in roll["culprits"][:2])
    return document


# Stops for a hang: the roll-call names the rank that held the job up.
HANG_REASONS = (Cause.HANG, Cause.TIMEOUT, Cause.COLLECTIVE_TIMEOUT)


def scheduler_failure(*, reason: str, summary: str, attempt: int, fix: str) -> dict:
    """The failure.json document of a job the scheduler's accounting ended (no rank failed), in
    the same schema as build_failure's."""
    return {"state": JobState.FAILED.value, "reason": reason, "summary": summary, "attempt": attempt, "time": time.time(),
            "first_failure": None, "failed_ranks": [], "torn_down_ranks": [],
            "launcher": {"exit_code": None, "messages": []}, "fix": fix}


def hang_report(num_processes: int, rank_states: list[dict], abort_requests: list[dict],
                finished_ranks: set[int] = frozenset()) -> dict:
    """Where every rank was when the job was stopped, and which ranks never reached the collective
    the watchdog fired on. A rank in `finished_ranks` had already left its entrypoint: the likely
    culprit when the others wait in MPI calls of the program's own, which the watchdog cannot see."""
    by_rank = {s["rank"]: s for s in rank_states}
    watched = next((r["collective"] for r in abort_requests if r.get("reason") == Cause.COLLECTIVE_TIMEOUT), None)
    ranks = []
    for rank in range(num_processes):
        state = by_rank.get(rank)
        if state is None:
            ranks.append({"rank": rank, "answered": False, **({"left_main": True} if rank in finished_ranks else {})})
            continue
        waiting = state.get("waiting_in")
        ranks.append({"rank": rank, "answered": True, "host": state.get("host"), "where": state.get("where"),
                      "collective": None if waiting is None else f"{waiting['name']} #{waiting['seq']}",
                      "waiting_seconds": None if waiting is None else waiting["seconds"],
                      "collectives_started": state.get("collectives_started")})
    report = {"ranks": ranks}
    if watched is not None:
        report["collective"] = watched
        report["never_arrived"] = [r["rank"] for r in ranks
                                   if r["answered"] and (r["collectives_started"] or 0) < watched["seq"]]
    return report


def hang_lines(hang: dict) -> list[str]:
    """The compact report: one line per rank."""
    lines = []
    roll = hang.get("roll_call")
    if roll:
        lines.append(f"roll-call: {roll['line']}")
    watched = hang.get("collective")
    if watched is not None:
        missing = ", ".join(map(str, hang.get("never_arrived", []))) or "none"
        lines.append(f"collective watchdog: {watched['name']} #{watched['seq']} waited {watched['seconds']:.0f} s; "
                     f"ranks that never arrived: {missing}")
    for entry in hang["ranks"]:
        if not entry["answered"] and entry.get("left_main"):
            lines.append(f"  rank {entry['rank']}: had left its entrypoint (ended without an error) while others "
                         f"had not: a peer waiting for it in a collective waits forever")
            continue
        if not entry["answered"]:
            lines.append(f"  rank {entry['rank']}: did not answer (dead, or stuck in C code holding the GIL)")
            continue
        inside = (f"in {entry['collective']} for {entry['waiting_seconds']:.1f} s"
                  if entry["collective"] else f"not in a collective ({entry['collectives_started']} started)")
        lines.append(f"  rank {entry['rank']} ({entry['host']}): {inside}, at {entry['where']}")
    return lines


def _held_by_a_scheduler(run_path) -> bool:
    """Whether a scheduler queued the run (its status has the scheduler's job id): only there can
    the scheduler's own cancel (scancel) end the ranks; a run on this machine has no such id."""
    if run_path is None:
        return True
    try:
        return _run(run_path).status().job_id is not None
    except (OSError, ValueError):
        return True


def summary_lines(failure: dict, run_path=None) -> list[str]:
    """What every command shows of a failure.json: the root cause, the others, the hang report."""
    lines = [f"{failure['state']}: {failure['summary']}"]
    others = [r for r in failure.get("failed_ranks", [])[1:]]
    for record in others:
        lines.append(f"  also failed: rank {record['rank']}: {record.get('error') or 'see its log'}")
    if failure.get("torn_down_ranks") and failure.get("first_failure"):
        torn = failure["torn_down_ranks"]
        lines.append(f"  stopped only because the job was torn down: rank{'s' if len(torn) > 1 else ''} "
                     f"{', '.join(map(str, torn))}")
    cancelled = failure.get("reason") == Cause.CANCELLED
    if "hang" in failure:
        lines += hang_lines(failure["hang"])
        if cancelled and not all(entry["answered"] for entry in failure["hang"]["ranks"]) and _held_by_a_scheduler(run_path):
            lines.append("  (a plain scancel ends mpirun's ranks at once, before they can answer; "
                         "`jaxlaunch cancel` asks them for their stacks first)")
    first = failure.get("first_failure")
    if run_path is not None and first is not None and failure.get("reason") in (Cause.FAILED, Cause.LEFT_EARLY):
        # The end of the failing rank's own log: often the line that explains the traceback.
        run = _run(run_path)
        text = run.rank_log_tail(first["rank"], size=64_000)
        tail = [line for line in text.splitlines() if line.strip()][-LOG_TAIL_LINES:]
        if tail:
            lines.append(f"  last lines of rank {first['rank']}'s log ({run.rank_log(first['rank'])}):")
            lines += [f"    {line[:300]}" for line in tail]
    if not cancelled and (first is None or first.get("source") != "rank" and not first.get("traceback")):
        # No rank recorded its own error (it died in MPI_Init, or was killed): what mpirun/srun
        # said first is the explanation. After a cancel, what they said is the teardown.
        said, more = launcher_said(failure, run_path)
        if said:
            where = f" ({_run(run_path).launcher_log})" if run_path is not None else ""
            lines.append(f"  the launcher said{where}:")
            lines += [f"    {line[:300]}" for line in said]
            if more:
                lines.append(f"    ... ({more} more lines)")
    if run_path is not None:
        lines.append(f"  details: {_run(run_path).failure_file}")
    return lines


def _run(run_path):
    from ..rundir import RunDirectory  # at first use: status and --wait import this module

    return RunDirectory(run_path)


def launcher_said(failure: dict, run_path=None, limit: int = 30) -> tuple[list[str], int]:
    """(the first `limit` distinct lines mpirun/srun printed themselves, how many more there are),
    without blank lines and the dash rules of Open MPI's banners: logs/launcher.log, or
    failure.json's copy of its last lines. Distinct, because every rank prints the same banner,
    in an order that varies from run to run."""
    messages = (failure.get("launcher") or {}).get("messages") or []
    if run_path is not None:
        try:
            with open(_run(run_path).launcher_log, "rb") as log:
                messages = log.read(64_000).decode(errors="replace").splitlines()
        except OSError:
            pass
    said = list(dict.fromkeys(m.strip() for m in messages if m.strip() and not set(m.strip()) <= {"-"}))
    return said[:limit], max(0, len(said) - limit)
