"""The checks of a command's arguments when the command line is parsed: a job id that a backend
claims or a run directory, a sweep directory, and a backend's name from the registry."""

from __future__ import annotations

import click


def job_or_sweep_or_run_dir(ctx, param, value):
    from ..sweeps.directory import SweepDirectory

    if SweepDirectory.holds_a_sweep(value):
        return value
    return job_id_or_run_dir(ctx, param, value)


def sweep_or_job_ids(ctx, param, value):
    """Job ids, array ids, sweep directories (a folder holding sweep.json) or run directories."""
    from ..backends import claimant, id_words
    from ..rundir import RunDirectory
    from ..sweeps.directory import SweepDirectory

    for item in value:
        if (claimant(item) is None and not SweepDirectory.holds_a_sweep(item)
                and not RunDirectory(item).status_file.is_file()):
            raise click.BadParameter(f"{item!r} is not {or_comma(id_words())}a sweep directory (a folder with "
                                     f"sweep.json) nor a run directory (a folder with status.json)")
    return value


def or_comma(words: str) -> str:
    return f"{words}, " if words else ""


def job_id_or_run_dir(ctx, param, value):
    from ..backends import claimant, id_words
    from ..rundir import RunDirectory

    if claimant(value) is not None or RunDirectory(value).spec_file.is_file():
        return value
    words = id_words()
    raise click.BadParameter(f"{value!r} is not {words + ' nor ' if words else ''}a run directory "
                             f"(a folder with spec.json)")


class BackendName(click.ParamType):
    """A backend's name, checked against the registry (launcher/backends/__init__.py: the entry-point
    group jaxlaunch.backends and JAXLAUNCH_BACKENDS) when the command line is parsed, not when this
    module is imported: listing the entry points costs every command's start. `aliases` maps other
    words to backend names (render's `mpirun` for the local backend)."""

    name = "backend"

    def __init__(self, aliases: dict[str, str] | None = None):
        self.aliases = dict(aliases or {})

    def convert(self, value, param, ctx):
        from ..backends import names

        known = [*names(), *self.aliases]
        if value not in known:
            self.fail(f"{value!r}: choose from {', '.join(known)}", param, ctx)
        return value

    def get_metavar(self, param, ctx=None):
        return "NAME"

    def shell_complete(self, ctx, param, incomplete):
        from click.shell_completion import CompletionItem

        from ..backends import names

        return [CompletionItem(n) for n in [*names(), *self.aliases] if n.startswith(incomplete)]
