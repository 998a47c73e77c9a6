"""What `jaxlaunch goodput` draws from the goodput record (launcher/rundir/goodput.py): the budget
table's headers, the timeline PNG, and a sweep's tasks summed."""

from __future__ import annotations

from pathlib import Path

from ..rundir.goodput import CATEGORIES, Goodput, goodput

BUDGET_HEADERS = ["QUEUE", "LAUNCH", "MPI", "JAX.DIST", "DEVICES", "PREFLIGHT", "RESTORE", "COMPILE", "1ST STEP"]


COLORS = {"queued": "#bbbbbb", "start-up": "#f2b134", "first step": "#ed553b", "productive steps": "#3caea3",
          "checkpoint blocking": "#20639b", "work lost": "#8e44ad", "wind-down": "#7f8c8d",
          "between attempts": "#dddddd"}


def plot(result: Goodput, path: Path, title: str = "") -> None:
    """A timeline PNG: one bar, each attempt's intervals coloured by category, and the totals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    origin = result.submitted or 0.0
    figure, (axis, totals) = plt.subplots(2, 1, figsize=(10, 3.6), gridspec_kw={"height_ratios": [1, 1.3]})

    def span(start, end, category):
        if end is not None and start is not None and end > start:
            axis.barh(0, end - start, left=start - origin, color=COLORS[category], edgecolor="none")

    if result.attempts:
        span(origin, result.attempts[0]["start"], "queued")
    for index, a in enumerate(result.attempts):
        main = a["main"] or a["end"]
        span(a["start"], main, "start-up")
        if a["first"] is not None:
            span(main, a["first"], "first step")
            span(a["first"], a["last"] - a["lost"], "productive steps")
            span(a["last"] - a["lost"], a["last"], "work lost")
            span(a["last"], a["end"], "wind-down")
        if index + 1 < len(result.attempts):
            span(a["end"], result.attempts[index + 1]["start"], "between attempts")
    axis.set_yticks([])
    axis.set_xlabel("seconds since submission")
    axis.set_title(title or f"goodput {100 * result.goodput:.0f}% of {result.wall_seconds:.0f} s")
    left = 0.0
    for name in CATEGORIES:
        width = result.seconds.get(name, 0.0)
        totals.barh(0, width, left=left, color=COLORS[name], label=f"{name} {width:.1f} s")
        left += width
    totals.set_yticks([])
    totals.set_xlabel("seconds, by category")
    totals.legend(loc="upper center", bbox_to_anchor=(0.5, -0.45), ncol=4, fontsize=8, frameon=False)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def sweep_goodput(sweep_dir) -> Goodput:
    """The tasks of a sweep, summed: their wall times, seconds per category and steps recomputed
    (the timeline is not drawn for a sum: `plot` shows the totals only)."""
    from ..sweeps.directory import SweepDirectory

    total = Goodput(wall_seconds=0.0, seconds={name: 0.0 for name in CATEGORIES})
    for _, run in SweepDirectory(sweep_dir).task_runs():
        if not run.status_file.exists():
            continue  # not started yet
        part = goodput(run.path)
        total.wall_seconds += part.wall_seconds
        total.steps_recomputed += part.steps_recomputed
        for name, seconds in part.seconds.items():
            total.seconds[name] += seconds
    return total
