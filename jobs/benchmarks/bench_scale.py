"""The control plane at 2-32 ranks, by simulation: a local Slurm cluster of 8 virtual nodes
(tests/slurm_cluster.py, Debian's slurmctld/slurmd/munge), every rank count in both launch modes
(srun and mpirun inside the batch job):

    jaxlaunch run jobs/benchmarks/bench_scale.yaml          (about 15 minutes on 2 cores)

Per rank count and mode (jobs/benchmarks/scale_probe.py runs in each job):
- start-up: `jaxlaunch submit` until the last rank's first line of main;
- fail-fast: a rank raises while the others wait in an allreduce, until the job is FAILED;
- hang report: a rank sleeps outside any collective; from then until the job is TIMEOUT with its
  hang report, less collective_timeout (3 s);
- should_stop(): the cost of a call (the median rank's mean over 200 calls);
- preemption round trip: `scancel --batch --signal=USR2` until every rank stopped at the agreed
  should_stop() (the supervisor's 'stopped' event).
And the supervisor's control server alone at 1,024 connections (the clients in another process):
its memory, the time for every rank to connect, to hear a stop, and for 1,024 'done' messages to
arrive. Writes jobs/benchmarks/bench_scale.json and jobs/benchmarks/bench_scale.png; returns the table.

All ranks share 2 cores here, so what grows with the rank count is mostly the CPU the ranks
compete for, not the design; docs/design/control-plane.md reads the per-rank growth and extrapolates on paper.
"""

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent  # jobs/benchmarks: the probe, and where the results go
ROOT = HERE.parent.parent
PROBE = HERE / "scale_probe.yaml"
COLLECTIVE_TIMEOUT = 3


def layout(ranks: int) -> tuple[int, int]:
    """(nodes, processes_per_node) on 8 nodes."""
    nodes = min(8, ranks)
    return nodes, ranks // nodes


class Cluster:
    def __init__(self, base: Path, cpus_per_node: int, rank_env: dict):
        self.rank_env = rank_env
        sys.path.insert(0, str(ROOT / "tests"))
        from slurm_cluster import LocalSlurmCluster

        self.cluster = LocalSlurmCluster(base / "slurm", nodes=8, cpus_per_node=cpus_per_node).start()
        self.env = self.cluster.make_env(JAXLAUNCH_HOME=str(base / "home"))
        self.jaxlaunch = str(Path(sys.executable).parent / "jaxlaunch")

    def submit(self, run_dir: Path, ranks: int, launch: str, probe: str, *settings: str) -> tuple[str, float]:
        nodes, per_node = layout(ranks)
        settings = (*settings, *(arg for key, value in self.rank_env.items() for arg in ("--set", f"env.{key}={value}")))
        argv = [self.jaxlaunch, "submit", str(PROBE), "--parsable", "--run-dir", str(run_dir),
                "--set", f"nodes={nodes}", "--set", f"processes_per_node={per_node}",
                "--set", "slurm.partition=wide", "--set", f"slurm.launch={launch}",
                "--set", f"params.probe={probe}", *settings]
        submitted = time.time()
        result = subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=120)
        if result.returncode != 0:
            raise RuntimeError(f"submit failed: {result.stderr}")
        return result.stdout.strip(), submitted

    def scancel(self, *args: str) -> None:
        subprocess.run(["scancel", *args], env=self.env, check=True, timeout=30)

    def stop(self) -> None:
        self.cluster.stop()


class ProbeFailed(Exception):
    """The job ended (or hung) before the probe got where it measures."""


def wait_for(path: Path, timeout: float) -> dict:
    """The probe's file; ProbeFailed when its job ended first (or it never came)."""
    deadline = time.monotonic() + timeout
    status_file = path.parent / "status.json"
    while not path.exists():
        try:
            status = json.loads(status_file.read_text())
        except (OSError, ValueError):
            status = {}
        if status.get("ended"):
            raise ProbeFailed(f"{path.parent.name} ended {status.get('state')} first: {status.get('reason')}")
        if time.monotonic() > deadline:
            raise ProbeFailed(f"{path.name} did not appear in {timeout:.0f} s")
        time.sleep(0.05)
    return json.loads(path.read_text())


def wait_for_end(run_dir: Path, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        try:
            status = json.loads((run_dir / "status.json").read_text())
            if status.get("ended"):
                return status
        except (OSError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{run_dir} did not end in {timeout} s")
        time.sleep(0.05)


def events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def measure(cluster: Cluster, base: Path, ranks: int, launch: str) -> dict:
    timeout = 120 + 10 * ranks
    row = {"ranks": ranks, "launch": launch}
    run_dir = base / f"{launch}-{ranks}-failfast"
    job, submitted = cluster.submit(run_dir, ranks, launch, "failfast", "--set", "slurm.max_requeues=0")
    probe = wait_for(run_dir / "probe.json", timeout)
    raised = wait_for(run_dir / "raised.json", timeout)
    status = wait_for_end(run_dir, 60)
    costs = sorted(probe["should_stop_seconds"])
    row.update(startup_s=max(probe["main_began"]) - submitted, failfast_s=status["ended"] - raised["time"],
               failfast_state=status["state"], should_stop_us=costs[len(costs) // 2] * 1e6)

    run_dir = base / f"{launch}-{ranks}-hang"
    cluster.submit(run_dir, ranks, launch, "hang", "--set", f"collective_timeout={COLLECTIVE_TIMEOUT}",
                   "--set", "slurm.max_requeues=0")
    hung = wait_for(run_dir / "hang.json", timeout)
    status = wait_for_end(run_dir, 60)
    failure = json.loads((run_dir / "failure.json").read_text())
    row.update(hang_report_s=status["ended"] - hung["time"] - COLLECTIVE_TIMEOUT, hang_state=status["state"],
               hang_named=failure.get("hang", {}).get("never_arrived"))

    run_dir = base / f"{launch}-{ranks}-preempt"
    job, _ = cluster.submit(run_dir, ranks, launch, "preempt", "--set", "slurm.max_requeues=0")
    wait_for(run_dir / "polling.json", timeout)
    noticed = time.time()
    cluster.scancel("--batch", "--signal=USR2", job)
    wait_for_end(run_dir, 60)
    stopped = next(e for e in events(run_dir) if e["event"] == "stopped")
    row.update(preempt_round_trip_s=stopped["time"] - noticed, preempt_agreed=stopped["at_agreed_point"])
    return row


# --- the control server alone, at 1,024 connections ------------------------------------------------

def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def control_server_at(connections: int) -> dict:
    from launcher import channel
    from launcher import environment
    from launcher.supervisor import channel as supervisor_channel
    from launcher.rundir import RunDirectory

    with tempfile.TemporaryDirectory() as folder:
        run = RunDirectory(Path(folder))
        run.logs.mkdir()
        before = _rss_kib()
        server = supervisor_channel.ControlServer(run).start()
        env = server.env()
        clients = subprocess.Popen([sys.executable, __file__, "clients", env[environment.CONTROL_ENV],
                                    env[environment.CONTROL_TOKEN_ENV], str(connections)],
                                   stdout=subprocess.PIPE, text=True)
        started = time.perf_counter()
        while server.connected() < connections:
            time.sleep(0.001)
        connected = time.perf_counter() - started
        rss = _rss_kib() - before
        assert clients.stdout.readline().strip() == "connected"
        stop_sent = time.perf_counter()
        server.request_stop(channel.StopRequest("timeout", time.time()))
        heard = float(clients.stdout.readline())  # the clients' own perf_counter is another clock:
        stop_heard = time.perf_counter() - stop_sent  # so time it here, when they say they all have it
        started = time.perf_counter()
        while len(server.done()) < connections:
            time.sleep(0.0005)
        done_seconds = time.perf_counter() - started
        clients.wait(timeout=60)
        server.close()
    return {"connections": connections, "server_rss_mib": rss / 1024, "connect_all_s": connected,
            "stop_to_all_s": stop_heard, "clients_spent_s": heard, "done_from_all_s": done_seconds}


def _clients(address: str, token: str, count: int) -> None:
    """Another process: `count` ranks' connections; say when all heard the stop, then send done."""
    import selectors

    from launcher.rank.channel import ControlClient

    clients = [ControlClient.connect(address, token, rank) for rank in range(count)]
    print("connected", flush=True)
    selector = selectors.DefaultSelector()
    for client in clients:
        selector.register(client.sock, selectors.EVENT_READ, client)
    started, waiting = time.perf_counter(), set(range(count))
    while waiting:
        for key, _ in selector.select(timeout=10):
            if key.data.rank in waiting and key.data.sock.recv(4096):
                waiting.discard(key.data.rank)
    print(time.perf_counter() - started, flush=True)
    for client in clients:
        client.send("done", {"collectives": 1, "time": time.time(), "stopped": None})
    time.sleep(1)


# --- report -----------------------------------------------------------------------------------------

COLUMNS = [("startup_s", "start-up to main (s)"), ("failfast_s", "fail-fast teardown (s)"),
           ("hang_report_s", "hang report past collective_timeout (s)"), ("should_stop_us", "should_stop() (us)"),
           ("preempt_round_trip_s", "preemption round trip (s)")]


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(COLUMNS), figsize=(4 * len(COLUMNS), 3.4))
    for axis, (key, title) in zip(axes, COLUMNS):
        for launch, marker in (("srun", "o"), ("mpirun", "s")):
            points = [(r["ranks"], r[key]) for r in rows if r["launch"] == launch and key in r]
            axis.plot([p[0] for p in points], [p[1] for p in points], marker=marker, label=launch)
        axis.set_xscale("log", base=2)
        axis.set_xticks([r for r in sorted({r["ranks"] for r in rows})])
        axis.set_xticklabels([str(r) for r in sorted({r["ranks"] for r in rows})])
        axis.set_title(title, fontsize=9)
        axis.set_xlabel("ranks (8 virtual nodes, 2 cores)")
        axis.grid(alpha=0.3)
    axes[0].legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main(ctx):
    try:  # before the work, not after it
        import matplotlib  # noqa: F401
        plotting = True
    except ImportError:
        print("bench_scale: matplotlib is not installed (pip install -e '.[bench]'): no PNG", flush=True)
        plotting = False
    sizes = [int(n) for n in ctx.params.get("sizes", [2, 4, 8, 16, 32])]
    launches = list(ctx.params.get("launches", ["srun", "mpirun"]))
    base = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    rows = []
    cluster = Cluster(base, cpus_per_node=max(layout(n)[1] for n in sizes), rank_env=dict(ctx.params.get("rank_env", {})))
    try:
        for ranks in sizes:
            for launch in launches:
                try:
                    row = measure(cluster, base, ranks, launch)
                except ProbeFailed as exc:  # reported as such, not hidden
                    row = {"ranks": ranks, "launch": launch, "error": str(exc)}
                print(json.dumps(row), flush=True)
                rows.append(row)
    finally:
        cluster.stop()
    server = control_server_at(int(ctx.params.get("connections", 1024)))
    print(json.dumps(server), flush=True)
    report = {"rows": rows, "control_server": server, "host": socket.gethostname(), "cores": os.cpu_count()}
    name = ctx.params.get("output", "bench_scale")
    report["rank_env"] = dict(ctx.params.get("rank_env", {}))
    (HERE / f"{name}.json").write_text(json.dumps(report, indent=1) + "\n")
    if plotting:
        plot(rows, HERE / f"{name}.png")
    return report


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "clients":
    _clients(sys.argv[2], sys.argv[3], int(sys.argv[4]))
