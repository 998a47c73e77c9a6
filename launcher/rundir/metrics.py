"""RUN_DIR/metrics.jsonl, both halves: the lines the supervisor appends from the ranks' `ctx.report`
calls (`report_lines`, `append_lines`; the ranks' reporter is launcher/rank/progress.py), and what
is read back: how far a job has got (the step, the rate, the ETA, the latest metrics and each
rank's step time). The CLI's `status` and the API's `job.progress()` / `job.metrics()` read it."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from . import RunDirectory
from .jsonl import read_jsonl

RATE_WINDOW = 50          # steps per second over (at most) the last this many reports
TAIL_BYTES = 1 << 20      # status reads at most the last MiB of metrics.jsonl


def report_lines(rank: int, message: dict, reports: list[dict]) -> list[dict]:
    """The lines of one rank's progress message: one per rank-0 report (its metrics), and one for
    the rank's own step time."""
    lines = [{"kind": "metrics", "step": r["step"], "time": r["time"], "total": message.get("total"),
              "metrics": r["metrics"]} for r in reports]
    if message.get("step") is not None:
        lines.append({"kind": "rank", "rank": rank, "step": message["step"], "time": message.get("time"),
                      "total": message.get("total"), "step_seconds": message.get("step_seconds")})
    return lines


def append_lines(path: Path, lines: list[dict]) -> None:
    """Append `lines` to metrics.jsonl in one write (one line each)."""
    if not lines:
        return
    try:
        with open(path, "a") as out:
            out.write("".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines))
    except OSError:
        pass  # progress is for people; the job goes on


@dataclass
class Progress:
    step: int
    total: int | None
    time: float                         # of the latest report
    steps_per_second: float | None
    eta_seconds: float | None
    metrics: dict = field(default_factory=dict)          # the latest of rank 0's metrics
    rank_step_seconds: dict = field(default_factory=dict)  # rank -> its latest step time
    straggler: dict | None = None  # the slow rank, if one is named (launcher/stragglers.py)

    def steps_done(self) -> int:
        """Steps done by the latest report: steps count from 0, so step 79 of 80 is the 80th (never
        more than the total, for a job that counts from 1)."""
        done = self.step + 1
        return min(done, self.total) if self.total else done

    def line(self, ended: bool = False) -> str:
        """'step 420/1000 (42%), 12.3 steps/s, ETA 47 s; loss=0.123'; for a job that has `ended`,
        the steps it did: '1000/1000 steps (100%), 12.3 steps/s; loss=0.123'."""
        if ended:
            done = self.steps_done()
            where = (f"{done}/{self.total} steps ({100 * done / self.total:.0f}%)" if self.total
                     else f"{done} steps")
        else:
            where = f"step {self.step}" + (f"/{self.total} ({100 * self.step / self.total:.0f}%)" if self.total else "")
        parts = [where]
        if self.steps_per_second:
            parts.append(f"{self.steps_per_second:.3g} steps/s")
        if self.eta_seconds is not None and not ended:
            parts.append(f"ETA {format_seconds(self.eta_seconds)}")
        text = ", ".join(parts)
        if self.metrics:
            text += "; " + " ".join(f"{k}={_short(v)}" for k, v in self.metrics.items())
        return text

    def slow_line(self) -> str | None:
        from ..stragglers import describe

        return None if not self.straggler else "slow rank: " + describe(self.straggler, self.straggler.get("host"))

    def rank_lines(self) -> list[str]:
        return [f"  rank {rank}: {seconds * 1e3:.2f} ms/step" for rank, seconds in sorted(self.rank_step_seconds.items())]


def format_seconds(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def _short(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


# The fields of metrics.jsonl that hold numbers, with their type. jaxlaunch wrote a NumPy or JAX
# step as a string ("2") until 2026-11 (step_seconds too, for a JAX step): read back as numbers.
NUMBER_FIELDS = {"step": int, "total": int, "rank": int, "time": float, "step_seconds": float}
REQUIRED = ("step", "time")  # a line without these as numbers cannot be placed


def _number(text, kind):
    try:
        number = float(text)
    except (TypeError, ValueError):
        return None
    return int(number) if kind is int and number.is_integer() else number


def clean_line(line) -> dict | None:
    """A line of metrics.jsonl with its numbers as numbers (strings converted); None for a line
    that is not a record, or whose step or time is not a number."""
    if not isinstance(line, dict):
        return None
    for name, kind in NUMBER_FIELDS.items():
        value = line.get(name)
        if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)):
            continue
        line[name] = _number(value, kind)
        if line[name] is None and name in REQUIRED:
            return None
    return line


def read_lines(path: Path, tail_bytes: int | None = None) -> list[dict]:
    """metrics.jsonl's lines (of its last `tail_bytes` only, if given), cleaned (`clean_line`): the
    run directory's one JSONL reader (launcher/rundir/jsonl.py) skips a torn or bad line."""
    return [record for record in map(clean_line, read_jsonl(path, tail_bytes)) if record is not None]


def metrics(run_dir, tail_bytes: int | None = None) -> list[dict]:
    """Every rank-0 report: {'step', 'time', **metrics}, oldest first (with `tail_bytes`: of the
    file's last bytes only)."""
    return [{"step": r["step"], "time": r["time"], **r.get("metrics", {})}
            for r in read_lines(RunDirectory(run_dir).metrics_file, tail_bytes) if r.get("kind") == "metrics"]


def progress(run_dir) -> Progress | None:
    """The job's progress now, or None before its first report."""
    lines = read_lines(RunDirectory(run_dir).metrics_file, TAIL_BYTES)
    reports = [r for r in lines if r.get("kind") == "metrics"]
    ranks = {}
    total = None
    straggler = None
    for line in lines:
        if line.get("kind") == "straggler":
            straggler = line if line.get("rank") is not None else None
        if line.get("kind") == "rank":
            if line.get("step_seconds") is not None:
                ranks[line["rank"]] = line["step_seconds"]
        if line.get("total") is not None:
            total = line["total"]
    latest = reports[-1] if reports else max((r for r in lines if r.get("kind") == "rank"),
                                             key=lambda r: r.get("step") or 0, default=None)
    if latest is None:
        return None
    rate = None
    window = [r for r in reports[-RATE_WINDOW:]]
    # Only since the latest restart: steps go back after a resume.
    while len(window) > 1 and any(b["step"] < a["step"] for a, b in zip(window, window[1:])):
        cut = max(i for i, (a, b) in enumerate(zip(window, window[1:])) if b["step"] < a["step"])
        window = window[cut + 1:]
    if len(window) > 1 and window[-1]["time"] > window[0]["time"]:
        rate = (window[-1]["step"] - window[0]["step"]) / (window[-1]["time"] - window[0]["time"])
    elif ranks:
        rate = 1 / statistics.median(ranks.values()) if statistics.median(ranks.values()) > 0 else None
    step = latest["step"]
    eta = (total - step - 1) / rate if total and rate else None
    return Progress(step=step, total=total, time=latest["time"], steps_per_second=rate,
                    eta_seconds=None if eta is None else max(0.0, eta),
                    metrics=dict(latest.get("metrics", {})), rank_step_seconds=ranks, straggler=straggler)


def plot_metric(run_dir, metric: str, path: Path, x: str = "step") -> int:
    """A PNG of one of rank 0's metrics against the step (the latest value of each step: a restart's
    recomputed steps replace the first ones) or the time since the first report. Returns the points."""
    reports = [r for r in metrics(run_dir) if isinstance(r.get(metric), (int, float))]
    if not reports:
        raise ValueError(f"no report of {run_dir} has a number named {metric!r}")
    if x == "step":
        by_step = {r["step"]: r[metric] for r in reports}
        xs, ys = sorted(by_step), [by_step[s] for s in sorted(by_step)]
    else:
        start = reports[0]["time"]
        xs, ys = [r["time"] - start for r in reports], [r[metric] for r in reports]
    from matplotlib.figure import Figure  # a bare Figure: no pyplot state, no GUI backend

    figure = Figure(figsize=(7, 4))
    axis = figure.subplots()
    axis.plot(xs, ys, linewidth=1.2)
    axis.set_xlabel("step" if x == "step" else "seconds since the first report")
    axis.set_ylabel(metric)
    axis.set_title(f"{Path(run_dir).name}: {metric}")
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    return len(xs)
