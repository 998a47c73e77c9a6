"""The one reader of the run directory's JSON Lines files (events.jsonl, metrics.jsonl). Their
writers append one whole line per record while the job runs (RunDirectory.log_event,
metrics.append_lines), so a reader may meet a line still being written, and reads what it can."""

from __future__ import annotations

import json
import os
from pathlib import Path


def read_jsonl(path: str | Path, tail_bytes: int | None = None) -> list[dict]:
    """The records of `path`, oldest first: every line that holds a JSON object. Never raises for
    what a file being appended to, or a damaged one, can hold:
    - a missing or unreadable file: [];
    - a line that does not parse (the last line, torn while it is written; a damaged line in the
      middle) or parses to something other than an object: skipped, the lines around it kept;
    - bytes that are not UTF-8: read as U+FFFD, so a damaged line costs itself at most.
    With `tail_bytes`, only the file's last `tail_bytes` bytes are read (for a large file), and a
    line that the cut goes through is skipped; one that starts exactly at the cut is kept.
    A line ends with "\\n" (JSON Lines: a "\\r" or "\\u2028" splits nothing); a last line without one
    is kept when it parses (a torn object never does: its closing brace comes last)."""
    try:
        with open(path, "rb") as source:
            start = 0 if tail_bytes is None else max(0, source.seek(0, os.SEEK_END) - tail_bytes)
            if start == 0:
                source.seek(0)
                data = source.read()
            else:
                source.seek(start - 1)  # one byte before the cut: a newline there means no line is cut
                data = source.read()
                data = data[data.find(b"\n") + 1:] if b"\n" in data else b""
    except OSError:
        return []
    records = []
    for line in data.split(b"\n"):
        try:
            record = json.loads(line.decode(errors="replace"))
        except (ValueError, RecursionError):  # torn, damaged, or nested past what json can read
            continue
        if isinstance(record, dict):
            records.append(record)
    return records
