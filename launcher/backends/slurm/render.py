"""Pure rendering: JobSpec in, batch script text out. No I/O but reading the packaged template.

Every value from the spec reaches the script through `quote_sbatch` (on #SBATCH lines) or
`shlex.quote` (in shell lines). Newlines, CR and NUL are the only characters that could end a
`#SBATCH` comment line and start a command: spec validation refuses them in the spec's values, and
`quote_sbatch` refuses them in what does not come from the spec (the run directory, the working
directory). A `%` in a path is doubled where Slurm would expand it (--output, --error).
"""

from __future__ import annotations

import functools
import shlex
from importlib import resources
from pathlib import Path

import jinja2

from ... import __version__, container
from ...container import mounts as container_mounts
from ...errors import UsageError
from ...environment import ATTEMPT_ENV, CONTROL_ENV, CONTROL_TOKEN_ENV, OWNER_KEY_ENV, RUN_DIR_ENV
from ...launchers.mpirun import batch_mpirun_argv
from ...launchers.rank_start import RANK_ENV_DEFAULTS, rank_command
from ...launchers.srun import PMIX_SECURITY_DEFAULT, srun_argv
from ...spec import JobSpec, format_slurm_time

TEMPLATE = "batch.sh.j2"
SCRIPT_NAME = "job.sbatch"
# Without slurm.time, Slurm's limit is the spec's timeout plus this margin, so that the job's own
# supervisor stops it at `timeout` exactly, with its hang report, before Slurm kills everything.
SUPERVISOR_MARGIN_SECONDS = 60
SUPERVISOR_PROGRAM = ["-m", "launcher.backends.slurm.batch"]


def slurm_time_limit(spec: JobSpec) -> int | None:
    """Seconds for sbatch --time: slurm.time, else the timeout plus the supervisor's margin."""
    if spec.slurm.time:
        return spec.slurm.time
    return spec.timeout + SUPERVISOR_MARGIN_SECONDS if spec.timeout else None


@functools.cache  # submit renders twice (a preview before the run directory exists, then the script)
def _template() -> jinja2.Template:
    text = resources.files("launcher.templates").joinpath(TEMPLATE).read_text()
    environment = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                                     autoescape=False)
    return environment.from_string(text)


def quote_sbatch(value) -> str:
    """Quote a value for a #SBATCH line. sbatch splits these lines itself (not the shell): it keeps
    a double-quoted string whole and drops the quotes, so quote whenever there is anything but
    plain characters."""
    text = str(value)
    if any(c in text for c in "\n\r\0"):
        raise UsageError(f"{text!r} cannot go on an #SBATCH line: it holds a line break or NUL (which would "
                         f"end the line and start a command in the batch script).\n"
                         f"  fix: use a run directory (and working directory) without line breaks")
    if text and all(c.isalnum() or c in "-_.,:/=@%+" for c in text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def slurm_filename(path: Path) -> str:
    """An --output path: the folder's `%` doubled (Slurm would read `%j`, `%u`... in it as
    replacement symbols), the file name's patterns (slurm-%j.out) kept."""
    return str(Path(str(path.parent).replace("%", "%%")) / path.name)


def sbatch_directives(spec: JobSpec, run_dir: Path, workdir: Path, output: Path | None = None,
                      expedite: bool = False) -> list[str]:
    """The #SBATCH options; `output` replaces RUN_DIR/slurm-%j.out (a job array's tasks share one script).
    `expedite`: the cluster allows Slurm 25.11's expedited requeue (requeue_policy.py)."""
    slurm = spec.slurm
    options = [
        ("job-name", spec.name),
        ("nodes", spec.nodes + slurm.spare_nodes),  # the ranks run on spec.nodes of them (spares.py)
        ("ntasks-per-node", spec.processes_per_node),
        ("cpus-per-task", slurm.cpus_per_task),
        ("time", format_slurm_time(slurm_time_limit(spec)) if slurm_time_limit(spec) else None),
        ("partition", slurm.partition),
        ("account", slurm.account),
        ("qos", slurm.qos),
        ("chdir", workdir),
        ("output", slurm_filename(output or run_dir / "slurm-%j.out")),
        ("error", slurm_filename(output or run_dir / "slurm-%j.out")),  # one stream, as `jaxlaunch logs` shows it
        # A requeued job runs the script again: keep the earlier allocations' output.
        ("open-mode", "append"),
        # B: the batch shell is the supervisor (exec), which tells every rank; USR1 is NCCL's.
        ("signal", f"B:USR2@{slurm.checkpoint_notice}"),
    ]
    if spec.platform == "gpu":
        if slurm.gres:
            options.append(("gres", slurm.gres))
        else:
            options.append(("gpus-per-node", slurm.gpus_per_node or spec.processes_per_node * spec.devices_per_process))
    lines = [f"--{key}={quote_sbatch(value)}" for key, value in options if value is not None]
    # Expedited: a requeued job may start again at once, at top priority, instead of after
    # requeue_delay (120 s by default) and the queue.
    lines.append(("--requeue=expedite" if expedite else "--requeue") if slurm.max_requeues else "--no-requeue")
    if slurm.max_requeues or slurm.spare_nodes:
        # A node failure ends the job step, not the job: the supervisor then restarts it on a spare
        # node (spares.py) or requeues it without that node (nodes.py), where Slurm would requeue
        # it anywhere.
        lines.append("--no-kill")
    for extra in slurm.extra:  # one option each (spec check): its value quoted whole
        if extra.startswith("--"):
            key, sep, value = extra.partition("=")
            lines.append(f"{key}={quote_sbatch(value)}" if sep else key)
        else:  # -C gpu, -Cgpu
            key, value = extra[:2], extra[2:].strip()
            lines.append(f"{key} {quote_sbatch(value)}" if value else key)
    return lines


def launch_line(spec: JobSpec, run_dir: Path, workdir: Path, python: str, mpirun: str | None, is_root: bool,
                exported: list[str]) -> str:
    """The supervisor (exec'd: it becomes the batch shell; always on the host, never in the
    spec's container) and, after `--`, the launcher it runs."""
    program = rank_command(spec, python, Path(run_dir), Path(workdir))
    if spec.slurm.launch == "srun":
        argv = srun_argv(spec, pyxis_options(spec, Path(run_dir), Path(workdir), exported), program)
    else:
        if mpirun is None:
            raise ValueError("launch: mpirun needs the path of mpirun")
        # The supervisor adds the attempt number and its address to what the batch script exports.
        forwarded = [*exported, ATTEMPT_ENV, CONTROL_ENV, CONTROL_TOKEN_ENV, OWNER_KEY_ENV]
        argv = batch_mpirun_argv(mpirun, spec, is_root, forwarded, program)
    return "exec " + shlex.join([python, *SUPERVISOR_PROGRAM, str(run_dir), "--", *argv])


def batch_environment(spec: JobSpec, run_dir: Path) -> dict[str, str]:
    """The variables the batch script exports for every rank."""
    return {**RANK_ENV_DEFAULTS, **(PMIX_SECURITY_DEFAULT if spec.slurm.launch == "srun" else {}), **spec.env,
            RUN_DIR_ENV: str(run_dir), **container.rank_environment(spec)}


def render_batch_script(spec: JobSpec, run_dir: Path, workdir: Path, python: str, mpirun: str | None,
                        is_root: bool = False, expedite: bool = False) -> str:
    """The sbatch script for `spec`. Pure: the same arguments give the same text. `mpirun` may be
    None when the spec launches with srun; `expedite` as for sbatch_directives."""
    env = batch_environment(spec, run_dir)
    exports = [f"{name}={shlex.quote(value)}" for name, value in env.items()]
    return _template().render(
        version=__version__,
        job_name=spec.name,
        directives=sbatch_directives(spec, Path(run_dir), Path(workdir), expedite=expedite),
        setup=spec.setup,
        exports=exports,
        launch_line=launch_line(spec, run_dir, workdir, python, mpirun, is_root, list(env)),
    )


ARRAY_TEMPLATE = "array.sh.j2"
ARRAY_OUTPUT = "slurm-%A_%a.out"


def render_array_script(spec: JobSpec, sweep_dir: Path, folders: list[str], workdir: Path,
                        max_parallel: int | None, first_index: int = 0) -> str:
    """One Slurm job array over sweep tasks that need the same resources. Array task i runs the
    batch script of task folder folders[i] (each a complete job.sbatch, rendered by
    render_batch_script, whose #SBATCH lines are then mere comments). Pure."""
    directives = sbatch_directives(spec, Path(sweep_dir), Path(workdir), output=Path(sweep_dir) / "logs" / ARRAY_OUTPUT)
    last = len(folders) - 1
    directives.insert(1, f"--array=0-{last}" + (f"%{max_parallel}" if max_parallel else ""))
    environment = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False)
    text = resources.files("launcher.templates").joinpath(ARRAY_TEMPLATE).read_text()
    return environment.from_string(text).render(
        version=__version__, job_name=spec.name, directives=directives, sweep_dir=shlex.quote(str(sweep_dir)),
        tasks=" ".join(shlex.quote(folder) for folder in folders), count=len(folders), first_index=first_index,
        script=SCRIPT_NAME)


def pyxis_options(spec: JobSpec, run_dir: Path, workdir: Path, env_names: list[str]) -> list[str]:
    """pyxis: the srun options that start every task in the image; none for the other runtimes.
    --container-env: the launcher's and the spec's variables win over the image's own values
    (pyxis otherwise keeps the image's). GPUs need no flag: enroot's NVIDIA hook gives them to
    images that set NVIDIA_VISIBLE_DEVICES, as CUDA images do."""
    image = spec.container
    if image is None or image.runtime != "pyxis":
        return []
    binds = ",".join(f"{source}:{target}" for source, target in container_mounts(spec, run_dir, workdir))
    return [f"--container-image={image.image}", f"--container-mounts={binds}",
            f"--container-workdir={workdir}", *([f"--container-env={','.join(env_names)}"] if env_names else []),
            *image.options]
