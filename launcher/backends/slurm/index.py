"""jaxlaunch's index of the Slurm jobs it submitted: job id -> run directory (or, for a sweep's
array id, its sweep directory), in ~/.jaxlaunch/jobs ($JAXLAUNCH_HOME). Commands take a job id
alone, and `logs` must still work after Slurm forgets the job (MinJobAge)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ...rundir import atomic_write_json

HOME_ENV = "JAXLAUNCH_HOME"


def jobs_index() -> Path:
    return Path(os.environ.get(HOME_ENV, "~/.jaxlaunch")).expanduser() / "jobs"


def record_job(job_id: str, run_dir: Path) -> None:
    jobs_index().mkdir(parents=True, exist_ok=True)
    atomic_write_json(jobs_index() / f"{job_id}.json", {"job_id": job_id, "run_dir": str(run_dir)})


def record_array(array_id: str, sweep_dir: Path) -> None:
    jobs_index().mkdir(parents=True, exist_ok=True)
    atomic_write_json(jobs_index() / f"{array_id}.json", {"job_id": array_id, "sweep_dir": str(sweep_dir)})


def lookup(job_id: str) -> dict | None:
    """The index entry of `job_id` ({"run_dir": ...} or {"sweep_dir": ...}), None if absent."""
    try:
        return json.loads((jobs_index() / f"{job_id}.json").read_text())
    except (FileNotFoundError, ValueError):
        return None


def known_job_ids() -> list[str]:
    """Jobs jaxlaunch submitted from this account, newest first (an array stands for its tasks)."""
    entries = sorted(jobs_index().glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    return [p.stem for p in entries if "_" not in p.stem]


def sweep_dir_of(job_id: str):
    """The sweep directory of an array id that jaxlaunch submitted, else None."""
    from ...sweeps.directory import SweepDirectory

    entry = lookup(job_id)
    return SweepDirectory(entry["sweep_dir"]) if entry and "sweep_dir" in entry else None
