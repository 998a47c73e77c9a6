"""What every launcher starts in each rank: its command (the bootstrap, in the spec's container
image when it has one: launcher/container.py) and the environment it starts with. Pure functions."""

from __future__ import annotations

from pathlib import Path

from .. import container
from ..spec import JobSpec

RANK_PROGRAM = ["-m", "launcher.rank.bootstrap"]
# Environment every rank starts with unless the spec's env sets the same names.
# glibc malloc: XLA allocates each output buffer fresh; above 32 MiB glibc serves them with mmap,
# so every large collective pays ~16k page faults per 64 MiB (measured: 64 MiB allreduce 93 ms
# against 33 ms with these settings, raw MPI 35-40 ms). Keeping large blocks in the heap lets
# freed buffers be reused. Cost: freed memory is not handed back to the OS until exit.
RANK_ENV_DEFAULTS = {
    "GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=4294967296:glibc.malloc.trim_threshold=4294967296",
}


def rank_command(spec: JobSpec, python: str, run_dir: Path, workdir: Path) -> list[str]:
    """The argv of one rank: `python` running the bootstrap, or the image's Python inside the
    spec's container. -P there: the working directory is mounted, and a jaxlaunch checkout in it
    must not shadow the image's own install (python -m puts the working directory first on sys.path)."""
    if spec.container is None:
        return [python, *RANK_PROGRAM]
    return container.wrap_rank(spec, [spec.container.python, "-P", *RANK_PROGRAM], run_dir, workdir)
