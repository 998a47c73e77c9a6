"""`jaxlaunch watch JOBID|RUN_DIR`: a live view of a running job, redrawn every few seconds until it
ends: its state, a progress bar with the rate and ETA, the latest metrics with a small history, each
rank's step time and the slow rank if one is named. rich draws it (only this command imports it;
never a rank)."""

from __future__ import annotations

import time
from ..states import JobState

SPARK = "▁▂▃▄▅▆▇█"
HISTORY = 40


def sparkline(values: list[float]) -> str:
    numbers = [v for v in values if isinstance(v, (int, float))]
    if not numbers:
        return ""
    low, high = min(numbers), max(numbers)
    span = (high - low) or 1.0
    return "".join(SPARK[min(len(SPARK) - 1, int((v - low) / span * (len(SPARK) - 1) + 0.5))] for v in numbers)


def render(job, state, progress, history: list[dict]):
    from rich.console import Group
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    header = Text(f"{job.backend} job {job.id}  ", style="bold")
    header.append(str(state), style="green" if str(state) in (JobState.RUNNING, JobState.COMPLETED) else "yellow")
    if job.run_dir is not None:
        header.append(f"  {job.run_dir}", style="dim")
    parts = [header]
    if progress is None:
        parts.append(Text("no progress reported yet (ctx.report)", style="dim"))
        return Group(*parts)
    if progress.total:
        bar = Table.grid(padding=(0, 1))
        bar.add_row(ProgressBar(total=progress.total, completed=progress.steps_done(), width=50),
                    Text(f"{progress.steps_done()}/{progress.total}"))
        parts.append(bar)
    parts.append(Text(progress.line(ended=state.final)))
    metrics = Table(box=None, show_header=True, header_style="bold", padding=(0, 2))
    metrics.add_column("metric")
    metrics.add_column("latest", justify="right")
    metrics.add_column(f"last {HISTORY} reports")
    for name, value in progress.metrics.items():
        shown = f"{value:.5g}" if isinstance(value, float) else str(value)
        metrics.add_row(name, shown, sparkline([r.get(name) for r in history[-HISTORY:]]))
    if progress.metrics:
        parts.append(metrics)
    if progress.rank_step_seconds:
        times = "  ".join(f"{rank}: {seconds * 1e3:.1f} ms" for rank, seconds in
                          sorted(progress.rank_step_seconds.items())[:16])
        parts.append(Text(f"step time per rank  {times}", style="dim"))
    slow = progress.slow_line()
    if slow:
        parts.append(Text(slow, style="bold red"))
    return Group(*parts)


def watch(job, interval: float = 2.0, console=None) -> object:
    """Redraw until the job ends; its final state. UnknownJobError once the job's backend no
    longer knows it (Slurm forgot it before its end was seen): it would never end."""
    from rich.console import Console
    from rich.live import Live

    from ..backends.records import ForgottenJobError
    from ..rundir.metrics import metrics
    from ..states import JobState

    def history():
        return [] if job.run_dir is None else metrics(job.run_dir, tail_bytes=64_000)

    console = console or Console()
    state = job.state()
    with Live(render(job, state, job.progress(), history()), console=console, auto_refresh=False,
              transient=False) as live:
        while not state.final:
            if state == JobState.UNKNOWN:
                raise ForgottenJobError(job.id, job.backend, job.scheduler_name, job.run_dir)
            time.sleep(interval)
            state = job.state()
            live.update(render(job, state, job.progress(), history()), refresh=True)
    return state
