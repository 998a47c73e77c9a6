"""The run directory's one JSON Lines reader (launcher/rundir/jsonl.py), and the three places that
read through it: events.jsonl (RunDirectory.read_events), metrics.jsonl (rundir/metrics.read_lines)
and goodput."""

import json

from launcher.rundir.goodput import goodput
from launcher.rundir import RunDirectory, metrics
from launcher.rundir.jsonl import read_jsonl


def line(record) -> bytes:
    return (json.dumps(record) + "\n").encode()


def test_a_torn_last_line_is_skipped(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_bytes(line({"n": 1}) + line({"n": 2}) + b'{"n": 3, "ev')
    assert read_jsonl(path) == [{"n": 1}, {"n": 2}]


def test_a_last_line_without_its_newline_is_kept_when_whole(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_bytes(line({"n": 1}) + b'{"n": 2}')
    assert read_jsonl(path) == [{"n": 1}, {"n": 2}]


def test_a_bad_line_in_the_middle_costs_only_itself(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_bytes(line({"n": 1}) + b"not json\n" + b"[1, 2]\n" + b"7\n" + b"\n"
                     + b'{"n": "\xff"}\n' + b"[" * 100_000 + b"\n" + line({"n": 2}))
    # not JSON, JSON but not an object, an empty line, nested past what json reads: skipped; a byte
    # that is not UTF-8 is read as U+FFFD
    assert read_jsonl(path) == [{"n": 1}, {"n": "\ufffd"}, {"n": 2}]


def test_lines_end_with_a_newline_only(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_bytes(b'{"n": 1}\r\n' + '{"n": "a\u2028b"}\n'.encode())
    assert read_jsonl(path) == [{"n": 1}, {"n": "a\u2028b"}]


def test_a_missing_or_unreadable_file_has_no_records(tmp_path):
    assert read_jsonl(tmp_path / "none.jsonl") == []
    assert read_jsonl(tmp_path) == []  # a folder: an OSError like any other
    assert read_jsonl(tmp_path / "none.jsonl", tail_bytes=10) == []


def test_tail_bytes_skips_the_line_the_cut_goes_through(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [line({"n": n, "pad": "x" * 10}) for n in range(5)]
    path.write_bytes(b"".join(lines))
    size = len(lines[0])  # every line is as long
    assert read_jsonl(path, tail_bytes=2 * size + 3) == [{"n": 3, "pad": "x" * 10}, {"n": 4, "pad": "x" * 10}]
    assert read_jsonl(path, tail_bytes=size - 1) == []  # inside the last line


def test_tail_bytes_keeps_a_line_that_starts_at_the_cut(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [line({"n": n}) for n in range(5)]
    path.write_bytes(b"".join(lines))
    size = len(lines[0])
    assert [r["n"] for r in read_jsonl(path, tail_bytes=2 * size)] == [3, 4]
    assert [r["n"] for r in read_jsonl(path, tail_bytes=5 * size)] == [0, 1, 2, 3, 4]  # the whole file
    assert [r["n"] for r in read_jsonl(path, tail_bytes=50 * size)] == [0, 1, 2, 3, 4]
    assert read_jsonl(path, tail_bytes=0) == []


def test_tail_bytes_with_a_torn_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(line({"n": 1}) + line({"n": 2}) + b'{"n": 3')
    assert read_jsonl(path, tail_bytes=len(line({"n": 2})) + 7) == [{"n": 2}]


def test_events_metrics_and_goodput_read_through_it(tmp_path):
    run = RunDirectory(tmp_path)
    run.events_file.write_bytes(line({"time": 10.0, "event": "attempt_started", "attempt": 0}) + b"garbage\n"
                                + b"[1]\n" + line({"time": 20.0, "event": "attempt_ended", "attempt": 0})
                                + b'{"time": 30.0, "eve')
    run.metrics_file.write_bytes(line({"kind": "metrics", "step": "1", "time": 12.0, "metrics": {"loss": 1.0}})
                                 + b"{bad\n" + line({"kind": "metrics", "step": 2, "time": 14.0, "metrics": {}})
                                 + b'{"kind": "metrics", "st')
    run.status_file.write_text(json.dumps({"state": "COMPLETED", "submitted": 10.0, "ended": 20.0}))
    assert [e["event"] for e in run.read_events()] == ["attempt_started", "attempt_ended"]
    assert [(r["step"], r["time"]) for r in metrics.read_lines(run.metrics_file)] == [(1, 12.0), (2, 14.0)]
    assert [r["step"] for r in metrics.read_lines(run.metrics_file, tail_bytes=90)] == [2]
    result = goodput(tmp_path)
    assert result.wall_seconds == 10.0 and result.seconds["productive steps"] == 2.0
