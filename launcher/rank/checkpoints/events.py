"""What a save or restore records in the run's events.jsonl (when it runs inside a job)."""

from __future__ import annotations

import os


def log_event(event: str, **fields) -> None:
    from ...environment import RUN_DIR_ENV

    if os.environ.get(RUN_DIR_ENV):
        from ...rundir import RunDirectory

        RunDirectory(os.environ[RUN_DIR_ENV]).log_event(event, **fields)
