"""The run directory: one folder per run holding the spec, per-rank logs, status and result.

Layout (the same for local runs and Slurm jobs):
    spec.json           the validated spec the ranks read (every name here: launcher/rundir/names.py)
    status.json         state, exit code, command, times, and the Slurm job id if any
    logs/rank-N.log     everything rank N printed
    logs/rank-N.error   rank N's traceback, when it failed (logs/rank-N.error.json: the same as data)
    logs/rank-N.state.json  where rank N was when the job was stopped (timeout, signal, watchdog)
    logs/launcher.log   what mpirun/srun printed themselves (not a rank's output)
    output.log          a background local run's combined output (what `jaxlaunch run` would print)
    logs/attempt-K/     the logs of attempt K, moved there when the job restarts (max_restarts)
    logs/control.json   every message the ranks sent the supervisor in this attempt (supervisor/channel.py)
    failure.json        the root cause of a failed, timed-out or cancelled job (schema: launcher/supervisor/root_cause.py, build_failure)
    checkpoints/step-N/ what ctx.checkpoints.save wrote (launcher/rank/checkpoints/)
    compile-cache/KEY/  JAX's persistent compilation cache, shared by the attempts (0700; KEY: jaxlib
                        version, platform, machine kind; spec key compile_cache; launcher/rank/compile_cache.py)
    metrics.jsonl       ctx.report's progress: rank 0's metrics and every rank's step time (appended)
    events.jsonl        the run's timeline: notices, checkpoints, requeues, resumes
    result.json         what the entrypoint returned on rank 0, or what a script gave set_result() (arrays
                        in result.npz; what JSON cannot hold in result.pkl, signed in result.pkl.sig:
                        launcher/rundir/results.py); a script that set none has no result.json
    preflight.json      every rank's software and devices, compared at start (launcher/rank/preflight.py)
    environment.json    what ran: Python, packages, the job folder's git commit (git.diff: its
                        uncommitted changes); code/: the job's code, with snapshot: true (provenance.py)
    function/           a function job's pickled call, call.pkl and call.json (launcher/executor.py)

Here: RunDirectory (every path above), names.py (every name above, spelled once), jsonl.py (the one
reader of events.jsonl and metrics.jsonl), metrics.py (metrics.jsonl's writer and what reads it
back), results.py (result.json, result.npz, result.pkl).
"""

from __future__ import annotations

import json
import os
import stat
import shutil
import tempfile
import time
from pathlib import Path

from typing import TYPE_CHECKING

from ..errors import UsageError
from ..states import FINAL_STATES, JobState, StatusRecord  # noqa: F401  (FINAL_STATES: re-exported)
from . import names
from .jsonl import read_jsonl

if TYPE_CHECKING:
    from ..spec import JobSpec

RUNS_ROOT = "runs"


def _drop_empty(record: dict) -> dict:
    """status.json keeps the fields that say something (None is left out), as it always has."""
    return {k: v for k, v in record.items() if v is not None}


def current_umask() -> int:
    """The process's umask, read without changing it where Linux allows (/proc), else set and reset."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# A run directory holds results, checkpoints, logs, pickled arguments and the job folder's
# uncommitted diff, on filesystems that every user of a cluster may reach: it is made for its
# owner alone (0700), or with JAXLAUNCH_SHARE_RUNS=group, readable by the group (0750); never
# writable by anyone else. See docs/design/security.md.
SHARE_ENV = "JAXLAUNCH_SHARE_RUNS"


def private_mode() -> int:
    return 0o750 if os.environ.get(SHARE_ENV) == "group" else 0o700


def make_private_dir(path: Path) -> None:
    """Make `path` (its parents as usual) with private_mode(). An existing folder must be ours and
    writable by nobody else (UsageError otherwise, with the fix): a folder another user made first
    would let them swap what the job reads, or read what it writes."""
    path = Path(path)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir(mode=0o700)
        os.chmod(path, private_mode())
        return
    if info.st_uid != os.geteuid():
        raise UsageError(f"{path} belongs to another user (uid {info.st_uid}): jaxlaunch writes a run only into a "
                         f"folder of yours.\n  fix: choose another --run-dir (or remove that folder)")
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise UsageError(f"{path} is not a folder (a symbolic link or a file).\n  fix: choose another --run-dir")
    if stat.S_IMODE(info.st_mode) & 0o022:
        raise UsageError(f"{path} can be written by other users (mode {stat.S_IMODE(info.st_mode):o}): they could "
                         f"change what the job reads.\n  fix: chmod go-w {path}, or choose another --run-dir")
    os.chmod(path, private_mode())


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temp file in the same folder, fsync, then rename: readers never see half a file.

    The file gets the mode an ordinary open() would give (0666 minus the umask): mkstemp makes
    its files 0600, which would hide results from the rest of a group sharing a project folder.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: Path, value) -> None:
    atomic_write_bytes(path, (json.dumps(value, indent=2, sort_keys=True) + "\n").encode())


class RunDirectory:
    def __init__(self, path: str | Path):
        self.path = Path(path).absolute()

    spec_file = property(lambda self: self.path / names.SPEC_FILE)
    status_file = property(lambda self: self.path / names.STATUS_FILE)
    result_file = property(lambda self: self.path / names.RESULT_FILE)
    arrays_file = property(lambda self: self.path / names.ARRAYS_FILE)
    logs = property(lambda self: self.path / names.LOGS_FOLDER)
    metrics_file = property(lambda self: self.path / names.METRICS_FILE)
    events_file = property(lambda self: self.path / names.EVENTS_FILE)
    control_records = property(lambda self: self.logs / names.CONTROL_RECORDS)
    failure_file = property(lambda self: self.path / names.FAILURE_FILE)
    launcher_log = property(lambda self: self.logs / names.LAUNCHER_LOG)
    output_log = property(lambda self: self.path / names.OUTPUT_LOG)
    environment_file = property(lambda self: self.path / names.ENVIRONMENT_FILE)
    diff_file = property(lambda self: self.path / names.DIFF_FILE)
    preflight_file = property(lambda self: self.path / names.PREFLIGHT_FILE)
    code = property(lambda self: self.path / names.CODE_FOLDER)
    checkpoints = property(lambda self: self.path / names.CHECKPOINTS_FOLDER)
    function = property(lambda self: self.path / names.FUNCTION_FOLDER)
    call_file = property(lambda self: self.function / names.CALL_FILE)
    call_record = property(lambda self: self.function / names.CALL_RECORD)

    def rank_log(self, rank: int) -> Path:
        return self.logs / names.RANK_LOG.format(rank=rank)

    def logged_ranks(self) -> list[int]:
        """The ranks that have a log in logs/ (this attempt's), in order."""
        return sorted(int(p.stem.split("-")[1]) for p in self.logs.glob(names.every_rank(names.RANK_LOG)))

    def rank_log_tail(self, rank: int, size: int = 200_000) -> str:
        """The last `size` bytes of rank `rank`'s log ("" if none): logs can be large. Without NUL
        bytes (Open MPI ends its version string with one), which would make the summary a binary
        file to grep; a progress bar's carriage returns end lines."""
        try:
            with open(self.rank_log(rank), "rb") as log:
                log.seek(max(0, log.seek(0, os.SEEK_END) - size))
                return log.read().replace(b"\0", b"").replace(b"\r\n", b"\n").replace(b"\r", b"\n").decode(
                    errors="replace")
        except OSError:
            return ""

    def rank_error(self, rank: int) -> Path:
        return self.logs / names.RANK_ERROR.format(rank=rank)

    def rank_error_record(self, rank: int) -> Path:
        return self.logs / names.RANK_ERROR_RECORD.format(rank=rank)

    def rank_error_records(self) -> list[dict]:
        """Every rank's logs/rank-N.error.json of this attempt that parses (a half-written one is skipped)."""
        return self.read_json_files(self.logs, names.every_rank(names.RANK_ERROR_RECORD))

    def rank_state(self, rank: int) -> Path:
        return self.logs / names.RANK_STATE.format(rank=rank)

    def read_failure(self) -> dict | None:
        try:
            return json.loads(self.failure_file.read_text())
        except (FileNotFoundError, ValueError):
            return None

    @staticmethod
    def template(spec: JobSpec, path: str | Path | None = None) -> str:
        """The run directory before placeholders: the --run-dir flag (relative to the working
        directory), the spec's run_dir (made absolute against the spec's folder at load), or the
        default runs/{name}-{time} in the working directory."""
        return str(path) if path is not None else spec.run_dir or f"{RUNS_ROOT}/{{name}}-{{time}}"

    @staticmethod
    def expand(template: str, spec: JobSpec, stamp: str) -> Path:
        return Path(template.replace("{name}", spec.name).replace("{time}", stamp))

    @classmethod
    def create(cls, spec: JobSpec, path: str | Path | None = None) -> "RunDirectory":
        """Make the run directory: the given path, the spec's run_dir, or runs/{name}-{time}.

        An existing directory is accepted only if empty, so no run overwrites another's results,
        or if sbatch refused its job (SUBMIT_FAILED: nothing ran there), so the same command can be
        tried again: what jaxlaunch wrote there is written anew, other files are left alone.
        Call it last, once everything that can fail has been checked: it leaves a folder behind.
        """
        spec.to_json()  # fails (unserialisable) before anything exists on disk
        target = cls.expand(cls.template(spec, path), spec, time.strftime("%Y%m%d-%H%M%S"))
        try:
            make_private_dir(target)
            if any(target.iterdir()) and cls(target)._submit_failed():
                cls(target)._clear_failed_submission()  # nothing ran there: the same command again
            elif any(target.iterdir()):
                if path is None and spec.run_dir is None:
                    target = Path(tempfile.mkdtemp(prefix=target.name + "-", dir=target.parent))
                else:
                    raise UsageError(f"run directory {target} already holds files; choose a new or empty one")
            run = cls(target)
            run.logs.mkdir(parents=True, exist_ok=True)
            from ..provenance import environment_record, snapshot_code

            if spec.snapshot:
                spec = snapshot_code(spec, run.path, run.code)
            atomic_write_bytes(run.spec_file, spec.to_json(indent=2).encode())
            environment, diff = environment_record(spec)
            atomic_write_json(run.environment_file, environment)
            if diff:
                atomic_write_bytes(run.diff_file, diff.encode())
        except OSError as exc:
            raise UsageError(f"cannot create the run directory {target}: {exc.strerror or exc}") from None
        return run

    def _submit_failed(self) -> bool:
        try:
            return self.read_status().get("state") == JobState.SUBMIT_FAILED
        except (OSError, ValueError):
            return False

    def _clear_failed_submission(self) -> None:
        """Remove what jaxlaunch wrote for a submission sbatch refused and `create` would not write
        again itself: its status.json (else the retry would inherit the error), git.diff and the
        code/ snapshot (copies: the job's own files are elsewhere). The rest is overwritten."""
        for path in (self.status_file, self.diff_file):
            path.unlink(missing_ok=True)
        shutil.rmtree(self.code, ignore_errors=True)

    def write_files(self, files: dict[str, bytes] | None) -> None:
        """Write `files` ({relative path: bytes}) into the run directory, each atomically (a
        function job's pickled call goes in before the job starts)."""
        for name, data in (files or {}).items():
            target = self.path / name
            target.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(target, data)

    @classmethod
    def preview(cls, spec: JobSpec, path: str | Path | None = None) -> "RunDirectory":
        """The run directory a run started now would use, for --dry-run and render; nothing is created."""
        return cls(cls.expand(cls.template(spec, path), spec, time.strftime("%Y%m%d-%H%M%S")))

    def read_spec(self) -> "JobSpec":
        from ..spec import JobSpec

        return JobSpec.from_json(self.spec_file.read_text())

    def read_status(self) -> dict:
        """status.json as written (see `status()` for the typed record); {} before it exists."""
        try:
            return json.loads(self.status_file.read_text())
        except FileNotFoundError:
            return {}

    def status(self) -> StatusRecord:
        """status.json as a StatusRecord (state PENDING before anything wrote it)."""
        return StatusRecord.from_dict(self.read_status())

    def update_status(self, **fields) -> dict:
        """Change `fields` of status.json (atomically); a name StatusRecord does not have is a
        TypeError, so every writer spells the record the same way."""
        record = self.status().updated(**fields)
        atomic_write_json(self.status_file, _drop_empty(record.to_dict()))
        return self.read_status()

    def failed_ranks(self) -> list[int]:
        return sorted(int(p.stem.split("-")[1]) for p in self.logs.glob(names.every_rank(names.RANK_ERROR)))

    def log_event(self, event: str, **fields) -> None:
        """Append one line to events.jsonl, the run's timeline (notices, checkpoints, requeues,
        resumes). One write of one short line with O_APPEND, so writers on several ranks interleave
        whole lines."""
        line = json.dumps({"time": time.time(), "event": event, **fields}, sort_keys=True) + "\n"
        try:
            with open(self.events_file, "a") as handle:
                handle.write(line)
        except OSError:
            pass  # the timeline is for people; never fail a job over it

    def read_events(self) -> list[dict]:
        """events.jsonl's records, oldest first (launcher/rundir/jsonl.py: a torn or bad line is skipped)."""
        return read_jsonl(self.events_file)

    def read_json_files(self, folder: Path, pattern: str) -> list[dict]:
        """Every JSON file matching `pattern` in `folder` that parses (a half-written one is skipped)."""
        records = []
        for path in sorted(folder.glob(pattern)):
            try:
                records.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                continue
        return records

