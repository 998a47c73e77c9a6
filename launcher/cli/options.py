"""What the commands share: library errors shown as `Error: ...` with their exit code, the options of
every command that reads a spec (SPEC, --set, -N/-n, -m, --print-spec, `-- ARG...`) and the sweep
options. The checks of an argument (a job id, a run or sweep directory, a backend's name) are in
arguments.py."""

from __future__ import annotations

import functools

import click

from ..errors import JaxlaunchError


class ShownError(click.ClickException):
    """A library error shown as 'Error: ...' with its own exit code, never a traceback."""

    def __init__(self, error: JaxlaunchError):
        super().__init__(str(error))
        self.exit_code = error.exit_code


def user_errors(command):
    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except JaxlaunchError as error:
            raise ShownError(error) from None
    return wrapper


def spec_options(command=None, *, required=True):
    """SPEC plus the --set overrides and --print-spec that every command reading a spec takes."""
    if command is None:
        return functools.partial(spec_options, required=required)

    @functools.wraps(command)
    @user_errors
    def print_or_run(*args, print_spec, nodes, processes_per_node, module, **kwargs):
        # the short options are --set's shorthands, as torchrun's and srun's users type them
        shorthands = [f"{key}={value}" for key, value in (("nodes", nodes), ("processes_per_node", processes_per_node))
                      if value is not None]
        kwargs["overrides"] = (*shorthands, *kwargs["overrides"])
        kwargs["spec"] = spec_or_module(kwargs["spec"], module, kwargs["overrides"])
        kwargs["program_args"] = list(kwargs["program_args"])
        if print_spec and kwargs["spec"] is None:
            raise click.UsageError("--print-spec needs SPEC")
        if print_spec:
            from ..spec import describe_spec, load_spec
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


def spec_or_module(spec, module, overrides):
    """What to load: SPEC, or `-m MODULE`'s spec of defaults; with neither, `--set entrypoint=X`
    alone stands for a spec of defaults too (`jaxlaunch run --set entrypoint=pytest -- -q`)."""
    from ..spec.load import MODULE_SUFFIX

    if module is not None:
        if spec is not None:
            raise click.UsageError(f"give SPEC ({spec}) or -m {module}, not both")
        return f"{module}{MODULE_SUFFIX}"
    if spec is None:
        entry = next((o.partition("=")[2] for o in reversed(overrides) if o.startswith("entrypoint=")), None)
        if entry and ":" not in entry:
            return entry if entry.endswith(".py") else f"{entry}{MODULE_SUFFIX}"
    return spec


class ProgramCommand(click.Command):
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


def progress(message: str) -> None:
    """Progress goes to stderr: stdout is for the result."""
    click.echo(message, err=True)


def job_or_sweep(spec, overrides, sweeps, max_parallel, program_args=()):
    """The JobSpec, or the Sweep, that SPEC with --set, --sweep and `-- ARG...` describes."""
    from ..sweeps.plan import load_job_or_sweep

    if spec is None:
        raise click.UsageError("missing SPEC (or --resume RUN_DIR)")
    job = load_job_or_sweep(spec, overrides, sweeps, program_args)
    if max_parallel is not None and not is_sweep(job):
        raise click.UsageError("--max-parallel is for sweeps (give --sweep KEY=V1,V2 or a spec with sweep:)")
    return job


def is_sweep(job) -> bool:
    from ..sweeps.plan import Sweep

    return isinstance(job, Sweep)


def print_results_table(sweep_dir) -> None:
    from ..sweeps.table import collect, format_table

    click.echo(format_table(collect(sweep_dir)))
