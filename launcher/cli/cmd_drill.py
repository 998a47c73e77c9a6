"""`jaxlaunch drill`: the job run clean, then once per fault, and scored (launcher/drill/ does it)."""

from __future__ import annotations

import sys

import click

from ..backends import RUN_DEFAULT
from .arguments import BackendName
from .options import ProgramCommand, progress, spec_options, user_errors



@click.command(cls=ProgramCommand)
@spec_options
@click.option("--faults", default=None,
              help="Faults to inject, comma-separated: kill (a rank SIGKILLed), preempt (a preemption notice), "
                   "hang (a rank stopped, alive), repeat (the program's own hang at one step on every attempt: the "
                   "governor must stop it after two), node (--target slurm: a rank's node set DOWN). "
                   "[default: those the target offers, but repeat]")
@click.option("--target", type=BackendName(), default=RUN_DEFAULT, show_default=True,
              help="Drill the job on this machine (local) or through a scheduler (slurm, or another backend); each "
                   "run is `jaxlaunch run --backend NAME`, which follows a scheduler's job to its end.")
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
@user_errors
def drill(spec, overrides, program_args, faults, target, count, seed, tolerance, ignore, run_dir):
    """Rehearse failures on SPEC's own job: run it once clean, then once per fault injected at a random
    point of its run, and print a scorecard (detected, recovered, steps lost, same result). Exit code
    0 only when every fault passed; everything is in DRILL_DIR/drill.json."""
    import random
    import time
    from pathlib import Path

    from ..backends import all_backends, get_backend
    from .drill_trials import ASKED_BY_NAME, run_drill
    from ..spec import load_spec

    known = get_backend(target).drill_faults
    if not known:
        raise click.BadParameter(f"the {target} backend injects no faults (Backend.drill_faults)", param_hint="--target")
    default = [f for f in known if f not in ASKED_BY_NAME]
    wanted = [f.strip() for f in (faults or ",".join(default)).split(",") if f.strip()]
    unknown = [f for f in wanted if f not in known]
    if unknown or not wanted:
        elsewhere = {fault: [b.name for b in all_backends() if b.name != target and fault in b.drill_faults]
                     for fault in unknown}
        hint = "".join(f" ({fault}: with --target {' or '.join(where)})" for fault, where in elsewhere.items() if where)
        raise click.BadParameter(f"{', '.join(unknown) or 'none'}: choose from {', '.join(known)}{hint}",
                                 param_hint="--faults")
    job = load_spec(spec, overrides, program_args=program_args)  # checked once, before any run
    seed = random.randrange(1 << 30) if seed is None else seed
    folder = Path(run_dir) if run_dir else Path("runs") / f"drill-{job.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    passed = run_drill(spec, list(overrides), list(program_args), folder, wanted, count, seed, tolerance or 0.0,
                       job.num_processes, echo=progress, ignore=ignore, target=target,
                       processes_per_node=job.processes_per_node, runs_program=job.runs_program)
    sys.exit(0 if passed else 1)
