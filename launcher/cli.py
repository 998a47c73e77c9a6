"""The `jaxlaunch` command. Each command is a thin shell over one library function; library
errors become click exceptions here and only here."""

from __future__ import annotations

import functools
import importlib.util
import sys

import click

from . import __version__

from .errors import JaxlaunchError


class _UserError(click.ClickException):
    """A library error shown as 'Error: ...' with its own exit code, never a traceback."""

    def __init__(self, error: JaxlaunchError):
        super().__init__(str(error))
        self.exit_code = error.exit_code


def _user_errors(command):
    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except JaxlaunchError as error:
            raise _UserError(error) from None
    return wrapper


def spec_options(command=None, *, required=True):
    """SPEC plus the --set overrides and --print-spec that every command reading a spec takes."""
    if command is None:
        return functools.partial(spec_options, required=required)

    @functools.wraps(command)
    @_user_errors
    def print_or_run(*args, print_spec, nodes, processes_per_node, module, **kwargs):
        # the short options are --set's shorthands, as torchrun's and srun's users type them
        shorthands = [f"{key}={value}" for key, value in (("nodes", nodes), ("processes_per_node", processes_per_node))
                      if value is not None]
        kwargs["overrides"] = (*shorthands, *kwargs["overrides"])
        kwargs["spec"] = _spec_or_module(kwargs["spec"], module, kwargs["overrides"])
        kwargs["program_args"] = list(kwargs["program_args"])
        if print_spec and kwargs["spec"] is None:
            raise click.UsageError("--print-spec needs SPEC")
        if print_spec:
            from .spec import describe_spec, load_spec
            # a sweep's spec prints without its swept values (the section is listed by --dry-run)
            click.echo(describe_spec(load_spec(kwargs["spec"], kwargs["overrides"], allow_sweep=True,
                                               program_args=kwargs["program_args"])))
            return None
        return command(*args, **kwargs)

    print_or_run = click.option("-m", "--module", metavar="MODULE", default=None,
                                help="Run a module as `python -m MODULE` does (instead of SPEC), every other key "
                                     "at its default: jaxlaunch run -m pytest -n 2 -- -q tests/")(print_or_run)
    print_or_run = click.option("--print-spec", is_flag=True,
                                help="Print every resolved spec value with its type, and exit.")(print_or_run)
    print_or_run = click.option("-n", "--processes-per-node", type=click.IntRange(min=1), default=None,
                                help="MPI processes per node (--set processes_per_node=N).")(print_or_run)
    print_or_run = click.option("-N", "--nodes", type=click.IntRange(min=1), default=None,
                                help="Number of nodes (--set nodes=N).")(print_or_run)
    print_or_run = click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
                                help="Override a spec key, dotted for nested keys (e.g. slurm.partition=gpu).")(print_or_run)
    # After `--`, the arguments of a script or module entrypoint (appended to the spec's args).
    print_or_run = click.argument("program_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- ARG...]")(print_or_run)
    return click.argument("spec", type=click.Path(dir_okay=False), required=required)(print_or_run)


def sweep_options(command):
    """--sweep and --max-parallel, for the commands that run a spec."""
    command = click.option("--max-parallel", type=click.IntRange(min=1), default=None,
                           help="Sweeps: configurations running at once (default: the spec's max_parallel; "
                                "locally 1).")(command)
    return click.option("--sweep", "sweeps", multiple=True, metavar="KEY=V1,V2,...",
                        help="Sweep a spec key over values, or 'range(start,stop[,step])'; repeat for the "
                             "cartesian product. Overrides the spec's sweep: section per key.")(command)


def _spec_or_module(spec, module, overrides):
    """What to load: SPEC, or `-m MODULE`'s spec of defaults; with neither, `--set entrypoint=X`
    alone stands for a spec of defaults too (`jaxlaunch run --set entrypoint=pytest -- -q`)."""
    from .spec.load import MODULE_SUFFIX

    if module is not None:
        if spec is not None:
            raise click.UsageError(f"give SPEC ({spec}) or -m {module}, not both")
        return f"{module}{MODULE_SUFFIX}"
    if spec is None:
        entry = next((o.partition("=")[2] for o in reversed(overrides) if o.startswith("entrypoint=")), None)
        if entry and ":" not in entry:
            return entry if entry.endswith(".py") else f"{entry}{MODULE_SUFFIX}"
    return spec


class _ProgramCommand(click.Command):
    """A command that runs a spec, whose program may take options of its own: everything after the
    first `--` is the program's (even `-q`, where SPEC could go), nothing before it is, and an unknown
    option says where it belongs."""

    def parse_args(self, ctx, args):
        args = list(args)
        program = []
        if "--" in args:
            at = args.index("--")
            args, program = args[:at], args[at + 1:]
        try:
            rest = super().parse_args(ctx, args)
        except click.NoSuchOption as error:
            error.message += (f"\n  fix: options of the job's own program go after `--`: "
                              f"jaxlaunch {ctx.info_name} SPEC -- {error.option_name} ...")
            raise
        before = list(ctx.params.get("program_args") or ())
        if before:
            spec = ctx.params.get("spec") or "SPEC"
            raise click.UsageError(f"{' '.join(before)}: an argument after {spec}, before `--`; the program's own "
                                   f"arguments go after `--`.\n  fix: jaxlaunch {ctx.info_name} {spec} -- "
                                   f"{' '.join(before)}", ctx=ctx)
        ctx.params["program_args"] = tuple(program)
        return rest


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(version=__version__, prog_name="jaxlaunch")  # also from a checkout that pip never installed
def main():
    """Run a JAX job spec locally under mpirun, or on Slurm."""


@main.command(cls=_ProgramCommand)
@spec_options(required=False)
@sweep_options
@click.option("--run-dir", type=click.Path(file_okay=False),
              help="Run directory (default: runs/NAME-TIME); for a sweep, the sweep directory.")
@click.option("--dry-run", is_flag=True, help="Print the command and environment; run nothing.")
@click.option("--resume", "resume_dir", type=click.Path(file_okay=False), metavar="RUN_DIR",
              help="Continue a preempted, failed or cancelled run in its own run directory (with its spec).")
@_user_errors
def run(spec, overrides, program_args, sweeps, max_parallel, run_dir, dry_run, resume_dir):
    """Run SPEC on this machine: nodes x processes_per_node processes under mpirun.
    With a sweep, every configuration, --max-parallel at a time. SPEC may be a script
    (`jaxlaunch run train.py -n 2 -- --lr 0.1`): it runs with every other key at its default."""
    from .backends import get_backend

    local = get_backend("local")
    if resume_dir is not None:
        if spec is not None or overrides or program_args or sweeps or run_dir is not None or dry_run:
            raise click.UsageError("--resume RUN_DIR runs the spec saved in RUN_DIR: give no SPEC, --set, "
                                   "--sweep, --run-dir or --dry-run with it")
        sys.exit(local.resume(resume_dir, echo=_progress, print_result=click.echo).exit_code())
    job = _job_or_sweep(spec, overrides, sweeps, max_parallel, program_args)
    if dry_run:
        click.echo(local.plan(job, run_dir).describe(), nl=False, color=True)
    elif _is_sweep(job):
        directory, code = local.start_sweep(job, run_dir, max_parallel, echo=_progress)
        _print_results_table(directory.path)
        sys.exit(code)
    else:
        sys.exit(local.run_here(job, run_dir, echo=_progress, print_result=click.echo).exit_code())


@main.command(cls=_ProgramCommand)
@spec_options
@click.option("--faults", default=None,
              help="Faults to inject, comma-separated: kill (a rank SIGKILLed), preempt (a preemption notice), "
                   "hang (a rank stopped, alive), repeat (the program's own hang at one step on every attempt: the "
                   "governor must stop it after two), node (--target slurm: a rank's node set DOWN). "
                   "[default: kill,preempt,hang; on slurm also node]")
@click.option("--target", type=click.Choice(["local", "slurm"]), default="local", show_default=True,
              help="Drill the job on this machine (jaxlaunch run) or on its Slurm cluster (jaxlaunch submit).")
@click.option("--count", type=click.IntRange(min=1), default=1, show_default=True, help="Runs per fault.")
@click.option("--seed", type=int, default=None, help="Chooses the points and ranks (default: random; in drill.json).")
@click.option("--tolerance", type=click.FloatRange(min=0), default=None,
              help="How far a faulted run's result may be from the clean run's, relative and absolute "
                   "(default: bit for bit).")
@click.option("--ignore", multiple=True, default=("attempt",), show_default=True, metavar="KEY",
              help="A result key not compared (a name anywhere, or a dotted path); repeat it; --ignore '' compares "
                   "everything.")
@click.option("--run-dir", type=click.Path(file_okay=False), help="Where the drill's runs go (default: "
                                                                   "runs/drill-NAME-TIME).")
@_user_errors
def drill(spec, overrides, program_args, faults, target, count, seed, tolerance, ignore, run_dir):
    """Rehearse failures on SPEC's own job: run it once clean, then once per fault injected at a random
    point of its run, and print a scorecard (detected, recovered, steps lost, same result). Exit code
    0 only when every fault passed; everything is in DRILL_DIR/drill.json."""
    import random
    import time
    from pathlib import Path

    from .drill import DEFAULT_FAULTS, FAULTS, SLURM_DEFAULT_FAULTS, SLURM_FAULTS, run_drill
    from .spec import load_spec

    known = SLURM_FAULTS if target == "slurm" else FAULTS
    default = SLURM_DEFAULT_FAULTS if target == "slurm" else DEFAULT_FAULTS
    wanted = [f.strip() for f in (faults or ",".join(default)).split(",") if f.strip()]
    unknown = [f for f in wanted if f not in known]
    if unknown or not wanted:
        hint = " (node: with --target slurm)" if "node" in unknown else ""
        raise click.BadParameter(f"{', '.join(unknown) or 'none'}: choose from {', '.join(known)}{hint}",
                                 param_hint="--faults")
    job = load_spec(spec, overrides, program_args=program_args)  # checked once, before any run
    seed = random.randrange(1 << 30) if seed is None else seed
    folder = Path(run_dir) if run_dir else Path("runs") / f"drill-{job.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    passed = run_drill(spec, list(overrides), list(program_args), folder, wanted, count, seed, tolerance or 0.0,
                       job.num_processes, echo=_progress, ignore=ignore, target=target,
                       processes_per_node=job.processes_per_node, runs_program=job.runs_program)
    sys.exit(0 if passed else 1)


def _progress(message: str) -> None:
    """Progress goes to stderr: stdout is for the result."""
    click.echo(message, err=True)


def _job_or_sweep(spec, overrides, sweeps, max_parallel, program_args=()):
    """The JobSpec, or the Sweep, that SPEC with --set, --sweep and `-- ARG...` describes."""
    from .sweeps.plan import load_job_or_sweep

    if spec is None:
        raise click.UsageError("missing SPEC (or --resume RUN_DIR)")
    job = load_job_or_sweep(spec, overrides, sweeps, program_args)
    if max_parallel is not None and not _is_sweep(job):
        raise click.UsageError("--max-parallel is for sweeps (give --sweep KEY=V1,V2 or a spec with sweep:)")
    return job


def _is_sweep(job) -> bool:
    from .sweeps.plan import Sweep

    return isinstance(job, Sweep)


@main.command()
@spec_options
@click.option("--target", type=click.Choice(["local", "slurm"]), default="local", show_default=True,
              help="Ranks as `jaxlaunch run` starts them here, or as a Slurm job (checked against the cluster).")
@click.option("--run-dir", type=click.Path(file_okay=False), help="Run directory to show paths for.")
@_user_errors
def explain(spec, overrides, program_args, target, run_dir):
    """Show each rank's node, local rank, devices, environment and mesh, the resources requested,
    and (--target slurm) whether the request fits the cluster; exit 2 if it cannot."""
    from .backends import get_backend
    from .explain import format_explain
    from .rundir import RunDirectory
    from .spec import load_spec

    backend = get_backend(target)
    job = load_spec(spec, overrides, program_args=program_args)
    problems, warnings = backend.check_fit(job)
    click.echo(format_explain(job, backend, RunDirectory.preview(job, run_dir).path, problems, warnings,
                              requeue=backend.requeue_policy(job)), nl=False)
    if problems:
        sys.exit(2)


# render's --target names a backend by what it prints: the batch script, or the local mpirun command.
RENDER_TARGETS = {"mpirun": "local"}


@main.command()
@spec_options
@click.option("--target", type=click.Choice(["slurm", "mpirun"]), default="slurm", show_default=True,
              help="A Slurm batch script, or the local mpirun command.")
@click.option("--run-dir", type=click.Path(file_okay=False), help="Run directory to render paths for.")
@_user_errors
def render(spec, overrides, program_args, target, run_dir):
    """Print the batch script (or mpirun command) for SPEC, without running anything."""
    from .backends import get_backend
    from .spec import load_spec

    backend = get_backend(RENDER_TARGETS.get(target, target))
    # color=True: click would strip escape sequences when stdout is not a terminal, and the
    # script shown must be byte for byte the one submit writes.
    click.echo(backend.plan(load_spec(spec, overrides, program_args=program_args), run_dir).describe(), nl=False, color=True)


@main.command(cls=_ProgramCommand)
@spec_options
@sweep_options
@click.option("--run-dir", type=click.Path(file_okay=False),
              help="Run directory (default: runs/NAME-TIME); for a sweep, the sweep directory.")
@click.option("--dry-run", is_flag=True, help="Print the batch script; submit nothing.")
@click.option("--wait", is_flag=True, help="Follow the job (or every task of a sweep) until it ends; exit 0 only "
                                           "if all COMPLETED.")
@click.option("--parsable", is_flag=True, help="Print only the job id (for a sweep, the array ids).")
@click.option("--no-check", is_flag=True, help="Do not check the request against the cluster before sbatch.")
@_user_errors
def submit(spec, overrides, program_args, sweeps, max_parallel, run_dir, dry_run, wait, parsable, no_check):
    """Submit SPEC to Slurm with sbatch; a sweep as one job array."""
    from .backends import get_backend

    backend, job = get_backend("slurm"), _job_or_sweep(spec, overrides, sweeps, max_parallel, program_args)
    if dry_run:
        click.echo(backend.plan(job, run_dir, max_parallel).describe(), nl=False, color=True)
    elif _is_sweep(job):
        _submit_sweep(backend, job, max_parallel, run_dir, wait, parsable, no_check)
    else:
        handle = backend.start(job, run_dir, check=not no_check)
        for warning in handle.warnings:
            _progress(f"warning: {warning}")
        # With --wait, stdout is for the result, as with `run`; the job id goes to stderr with the progress.
        click.echo(handle.id if parsable else f"Submitted job {handle.id}; run directory: {handle.run_dir}", err=wait)
        if wait:
            from .job_tables import wait_for
            from .supervisor import result_text

            if wait_for(handle, _progress) == "COMPLETED" and result_text(handle.run) is not None:
                click.echo(result_text(handle.run))
            sys.exit(handle.exit_code())


def _submit_sweep(backend, sweep, max_parallel, run_dir, wait, parsable, no_check):
    directory, ids = backend.start_sweep(sweep, run_dir, max_parallel, echo=_progress, check=not no_check)
    if parsable:
        click.echo(",".join(ids), err=wait)
    else:
        click.echo(f"Submitted sweep of {len(sweep.configurations)} configurations as job array"
                   f"{'s' if len(ids) > 1 else ''} {', '.join(ids)}; sweep directory: {directory.path}", err=wait)
    if wait:
        states = backend.wait_for_sweep(directory, echo=_progress)
        _print_results_table(directory.path)
        sys.exit(0 if all(t.state == "COMPLETED" for t in states) else 1)


def _print_results_table(sweep_dir) -> None:
    from .sweeps.table import collect, format_table

    click.echo(format_table(collect(sweep_dir)))


def _job_or_sweep_or_run_dir(ctx, param, value):
    from .sweeps.directory import SweepDirectory

    if SweepDirectory.holds_a_sweep(value):
        return value
    return _job_id_or_run_dir(ctx, param, value)


def _sweep_or_job_ids(ctx, param, value):
    """Job ids, array ids, sweep directories (a folder holding sweep.json) or run directories."""
    from .backends import claimant, id_words
    from .rundir import RunDirectory
    from .sweeps.directory import SweepDirectory

    for item in value:
        if (claimant(item) is None and not SweepDirectory.holds_a_sweep(item)
                and not RunDirectory(item).status_file.is_file()):
            raise click.BadParameter(f"{item!r} is not {_or_comma(id_words())}a sweep directory (a folder with "
                                     f"sweep.json) nor a run directory (a folder with status.json)")
    return value


def _or_comma(words: str) -> str:
    return f"{words}, " if words else ""


@main.command()
@click.argument("job_ids", nargs=-1, callback=_sweep_or_job_ids, metavar="[JOB_ID|ARRAY_ID|SWEEP_DIR|RUN_DIR]...")
@click.option("-v", "--verbose", is_flag=True, help="For a sweep: one row per task; for a job: each rank's step time.")
@_user_errors
def status(job_ids, verbose):
    """Show state, elapsed time, nodes and run directory of jobs (default: those jaxlaunch submitted,
    and the recent local runs in runs/). For a sweep (its array id or directory): the count of tasks
    in each state."""
    from .job_tables import print_status

    print_status(list(job_ids), verbose, echo=click.echo)


def _job_id_or_run_dir(ctx, param, value):
    from .backends import claimant, id_words
    from .rundir import RunDirectory

    if claimant(value) is not None or RunDirectory(value).spec_file.is_file():
        return value
    words = id_words()
    raise click.BadParameter(f"{value!r} is not {words + ' nor ' if words else ''}a run directory "
                             f"(a folder with spec.json)")


@main.command()
@click.argument("job_id", callback=_job_id_or_run_dir, metavar="JOB_ID|RUN_DIR")
@click.argument("metric")
@click.option("--x", "x_axis", type=click.Choice(["step", "time"]), default="step", show_default=True,
              help="Against the step, or the seconds since the first report.")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default=None,
              help="Where to write the PNG (default: RUN_DIR/METRIC.png).")
@_user_errors
def plot(job_id, metric, x_axis, out_path):
    """A PNG of a metric the job reported with ctx.report (needs matplotlib: pip install -e '.[bench]')."""
    from pathlib import Path

    from .errors import UsageError
    from .job_tables import find_known_job
    from .rundir.metrics import plot_metric

    if importlib.util.find_spec("matplotlib") is None:
        raise UsageError("jaxlaunch plot needs matplotlib: pip install -e '.[bench]'")
    job = find_known_job(job_id, needs_run_dir=True)
    path = Path(out_path) if out_path else job.run_dir / f"{metric}.png"
    try:
        points = plot_metric(job.run_dir, metric, path, x_axis)
    except ValueError as exc:
        names = sorted({k for r in job.metrics() for k in r if k not in ("step", "time")})
        raise UsageError(f"{exc}; its metrics: {', '.join(names) or 'none (the job never called ctx.report)'}") \
            from exc
    click.echo(f"{path} ({points} points)")


@main.command()
@click.argument("job_id", callback=_job_id_or_run_dir, metavar="JOB_ID|RUN_DIR")
@click.option("--interval", type=click.FloatRange(min=0.2), default=2.0, show_default=True,
              help="Seconds between redraws.")
@_user_errors
def watch(job_id, interval):
    """A live view of a job until it ends: state, progress bar, rate and ETA, the latest metrics with
    their history, each rank's step time and the slow rank. Exits with the job's exit code."""
    from .job_tables import find_known_job
    from .watch import watch as live_view

    job = find_known_job(job_id)
    try:
        live_view(job, interval)
    except KeyboardInterrupt:
        sys.exit(130)
    sys.exit(job.exit_code())


@main.command()
@click.argument("job_id", callback=_job_or_sweep_or_run_dir, metavar="JOB_ID|RUN_DIR|SWEEP_DIR")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the timeline as a PNG here (needs matplotlib: pip install -e '.[bench]').")
@_user_errors
def goodput(job_id, plot_path):
    """Where a job's wall time went, over every attempt and requeue: queued, start-up, first step,
    productive steps, checkpoint blocking, work lost, wind-down, between attempts; then each
    attempt's start-up budget: queue wait, launch, imports and MPI, jax.distributed, JAX and
    devices, preflight, restore, compile and first step. For a sweep directory: summed over its
    tasks."""
    from pathlib import Path

    from tabulate import tabulate

    from .errors import UsageError
    from .job_tables import find_known_job

    if plot_path and importlib.util.find_spec("matplotlib") is None:  # checked before the work, not after
        raise UsageError("--plot needs matplotlib: pip install -e '.[bench]'")
    from .sweeps.directory import SweepDirectory

    if SweepDirectory.holds_a_sweep(job_id):
        from .goodput import sweep_goodput

        result, name = sweep_goodput(job_id), Path(job_id).name
    else:
        job = find_known_job(job_id, needs_run_dir=True)
        result, name = job.goodput(), job.id
    click.echo(tabulate(result.rows(), headers=["", "SECONDS", "SHARE"]))
    if result.reported:
        click.echo(f"goodput: {100 * result.goodput:.1f}% of the wall time was productive steps")
    else:  # not 0%: there were no steps to count, and the program's whole run reads as wind-down above
        click.echo("goodput: not measured: the job never reported a step, so its time after start-up counts as "
                   "wind-down above; launcher.context().report(step) in the program's loop gives goodput its steps")
    if result.governor:
        click.echo(f"not tried again: {result.governor}")
    if result.budgets:
        from .goodput import BUDGET_HEADERS

        click.echo("\nstart-up budget, seconds to each attempt's first report (MPI: imports, MPI_Init; "
                   "DEVICES: JAX and its devices):")
        click.echo(tabulate(result.budget_rows(), headers=["ATTEMPT", *BUDGET_HEADERS, "TOTAL"],
                            disable_numparse=True, stralign="right"))
    if plot_path:
        from .goodput import plot

        plot(result, Path(plot_path), title=f"{name}: goodput {100 * result.goodput:.0f}%")
        click.echo(f"timeline: {plot_path}")


@main.command()
@click.argument("job_id", callback=_job_id_or_run_dir, metavar="JOB_ID|RUN_DIR")
@click.option("--rank", type=int, help="Show this rank's full log instead of the job's combined output.")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new output until the job ends.")
@_user_errors
def logs(job_id, rank, follow):
    """Print a job's output: a Slurm job's, or a run directory's."""
    from .errors import UsageError
    from .job_tables import find_known_job

    job = find_known_job(job_id, needs_run_dir=True)
    missing = None if follow else job.no_log_yet(rank)
    if missing:
        raise UsageError(missing)
    if follow:
        job.follow_logs(rank, write=lambda text: click.echo(text, nl=False))
    else:
        click.echo(job.logs(rank), nl=False)
    for line in job.failure_lines():  # after the log, on stderr: the log stays clean
        click.echo(line, err=True)


@main.command()
@click.argument("job_id", callback=_job_id_or_run_dir, metavar="JOB_ID|RUN_DIR")
@_user_errors
def cancel(job_id):
    """Cancel a job, a whole job array (its id), one array task (ID_N), or a local run (RUN_DIR)."""
    from .backends import find_job

    job = find_job(job_id, to_cancel=True)
    job.cancel()
    click.echo(f"cancelled job {job_id}")


@main.command()
@spec_options(required=False)
def doctor(spec, overrides, program_args):
    """Check this machine's installation: MPI, mpi4py, mpi4jax, JAX, Slurm, the runs folder; with
    SPEC, also its container runtime and image (jaxlaunch and MPI there, against this host's)."""
    import os

    from .doctor import exit_code, format_checks, run_checks
    from .spec import load_spec

    checks = run_checks(os.environ, load_spec(spec, overrides, program_args=program_args) if spec else None)
    click.echo(format_checks(checks))
    sys.exit(exit_code(checks))


@main.command()
@click.argument("name")
@click.option("--template", type=click.Choice(["minimal", "data-parallel", "sharded"]), default="minimal",
              show_default=True, help="What the new job does.")
@_user_errors
def init(name, template):
    """Write NAME.yaml and NAME.py: a job that runs as written (`jaxlaunch run NAME.yaml`)."""
    from .scaffold import write_job

    for path in write_job(name, template):
        click.echo(f"wrote {path}")


@main.command()
@click.argument("sweep_dir", type=click.Path(file_okay=False, exists=True))
@click.option("--plot", "plot_metric", metavar="METRIC", help="Write METRIC_vs_KEY.png: METRIC against a swept key.")
@click.option("--x", "x_key", metavar="KEY", help="With --plot: the swept key on the x axis (default: the first).")
@click.option("--by", "by_key", metavar="KEY", help="With --plot: one line per value of this swept key "
                                                    "(default: the next one).")
@click.option("--curve", "curve_metric", metavar="METRIC",
              help="Write METRIC_curves.png: METRIC against the step, one line per configuration (ctx.report).")
@click.option("--best", "best_metric", metavar="METRIC", help="Name the configuration with the best METRIC.")
@click.option("--max", "maximize", is_flag=True, help="With --best: larger is better (default: smaller).")
@click.option("--min", "minimize", is_flag=True, help="With --best: smaller is better (the default).")
@_user_errors
def results(sweep_dir, plot_metric, x_key, by_key, curve_metric, best_metric, maximize, minimize):
    """Collect every task's result of a sweep into one table (also written as results.csv and
    results.json in SWEEP_DIR). Works while the sweep is still running."""
    from pathlib import Path

    from .sweeps.metrics import best, plot
    from .sweeps.table import collect, format_table, write_csv, write_json

    if maximize and minimize:
        raise click.UsageError("give --max or --min, not both")
    if (x_key or by_key) and not plot_metric:
        raise click.UsageError("--x and --by go with --plot METRIC")
    if (plot_metric or curve_metric) and importlib.util.find_spec("matplotlib") is None:
        raise click.UsageError("--plot and --curve need matplotlib: pip install -e '.[bench]'")
    table = collect(sweep_dir)
    click.echo(format_table(table))
    from .sweeps.directory import SweepDirectory

    folder, directory = Path(sweep_dir), SweepDirectory(sweep_dir)
    write_csv(table, directory.results_csv)
    write_json(table, directory.results_json)
    # the paths as the user named the sweep (SweepDirectory's are absolute)
    click.echo(f"wrote {folder / directory.results_csv.name} and {folder / directory.results_json.name}", err=True)
    if plot_metric:
        path = plot(table, plot_metric, folder / f"{plot_metric}.png", x=x_key, by=by_key)
        click.echo(f"wrote {path}", err=True)
    if curve_metric:
        from .sweeps.metrics import plot_curves

        path = plot_curves(sweep_dir, curve_metric, folder / f"{curve_metric}_curves.png")
        click.echo(f"wrote {path}", err=True)
    if best_metric:
        row = best(table, best_metric, minimize=not maximize)
        sweep_keys = table.columns[1:table.columns.index("state")]
        values = ", ".join(f"{k}={row.get(k)!r}" for k in sweep_keys)
        click.echo(f"best {best_metric} ({'max' if maximize else 'min'}): {row.get(best_metric)!r} "
                   f"from task {row.get('task')} ({values})")
