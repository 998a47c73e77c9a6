"""Launch and submit overheads: jaxlaunch against the bare commands, side by side in one run.

Pairs, run alternately (so drift in the machine's load hits both alike), medians reported:
  launch   `mpirun -n 2 python -c "import jax, mpi4jax; jax.devices()"`  against
           `jaxlaunch run` of a 2-process job that imports mpi4jax and returns (jobs/examples/trivial.yaml);
  submit   `sbatch --parsable` of a rendered batch script  against  `jaxlaunch submit --parsable`
           of the same spec (only with params.submit: true and a reachable Slurm; both jobs are
           cancelled right away: what is timed is the submission).

The children get this process's environment without the MPI launcher's and jaxlaunch's own
variables, so the nested mpirun starts a fresh job. Runs as one process (nodes: 1,
processes_per_node: 1); rank 0 writes bench.json and prints the table.
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from launcher.rundir import atomic_write_bytes

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"  # trivial.yaml, the job it launches
INHERITED_PREFIXES = ("OMPI_", "PMIX_", "PRTE_", "JAXLAUNCH_", "SLURM_JOB", "SLURM_STEP", "SLURM_PROC")


def clean_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(INHERITED_PREFIXES)}
    env.pop("XLA_FLAGS", None)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def timed(argv, env, cwd) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return seconds, done.stdout


def launch_pair(repeats, env, scratch):
    bin_dir = Path(sys.executable).parent
    mpirun = str(bin_dir / "mpirun") if (bin_dir / "mpirun").exists() else shutil.which("mpirun")
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    bare = [mpirun, "-n", "2", "--oversubscribe", "--bind-to", "none", *root, sys.executable, "-c",
            "import jax, mpi4jax; jax.devices()"]
    jaxlaunch = [str(bin_dir / "jaxlaunch"), "run", str(EXAMPLES / "trivial.yaml")]
    times = {"mpirun + import jax, mpi4jax": [], "jaxlaunch run": []}
    for i in range(repeats + 1):  # the first pair warms the page cache; not counted
        t_bare, _ = timed(bare, env, scratch)
        t_run, _ = timed([*jaxlaunch, "--run-dir", str(scratch / f"run-{i}")], env, scratch)
        if i:
            times["mpirun + import jax, mpi4jax"].append(t_bare)
            times["jaxlaunch run"].append(t_run)
    return times


def submit_pair(repeats, env, scratch):
    bin_dir = Path(sys.executable).parent
    jaxlaunch = str(bin_dir / "jaxlaunch")
    times = {"sbatch": [], "jaxlaunch submit": []}
    env = {**env, "JAXLAUNCH_HOME": str(scratch / "home")}
    # The same script sbatch will get: the one jaxlaunch renders for the spec.
    script = scratch / "bare.sbatch"
    _, text = timed([jaxlaunch, "render", str(EXAMPLES / "trivial.yaml"), "--run-dir", str(scratch / "bare")], env, scratch)
    (scratch / "bare" / "logs").mkdir(parents=True, exist_ok=True)
    script.write_text(text)
    ids = []
    for i in range(repeats + 1):
        t_bare, out = timed(["sbatch", "--parsable", str(script)], env, scratch)
        ids.append(out.strip().split(";")[0])
        t_submit, out = timed([jaxlaunch, "submit", str(EXAMPLES / "trivial.yaml"), "--parsable", "--run-dir",
                               str(scratch / f"submit-{i}")], env, scratch)
        ids.append(out.strip())
        subprocess.run(["scancel", *ids[-2:]], env=env, capture_output=True, timeout=60)
        if i:
            times["sbatch"].append(t_bare)
            times["jaxlaunch submit"].append(t_submit)
    return times


def main(ctx):
    repeats = int(ctx.params.get("repeats", 10))
    env = clean_env()
    rows = {}
    with tempfile.TemporaryDirectory(prefix="bench-launch-") as folder:
        scratch = Path(folder)
        rows["launch"] = launch_pair(repeats, env, scratch)
        if ctx.params.get("submit"):
            rows["submit"] = submit_pair(repeats, env, scratch)
    report = {"repeats": repeats, "cpus": os.cpu_count(),
              "medians": {kind: {name: statistics.median(ts) for name, ts in pair.items()} for kind, pair in rows.items()},
              "all": rows}
    lines = ["| pair | bare | jaxlaunch | ratio | difference |", "|---|---|---|---|---|"]
    for kind, medians in report["medians"].items():
        (bare_name, bare), (ours_name, ours) = medians.items()
        lines.append(f"| {kind}: {bare_name} vs {ours_name} | {bare:.3f} s | {ours:.3f} s | {ours / bare:.2f}x "
                     f"| {ours - bare:+.3f} s |")
    table = "\n".join(lines)
    print(f"median of {repeats} alternating pairs\n{table}", flush=True)
    atomic_write_bytes(ctx.run_dir / "bench.json", json.dumps(report, indent=2).encode())
    return {"medians": report["medians"], "table": table}
