"""How many scheduler commands `jaxlaunch submit --wait` runs while it follows a job of a given length:
a throw-away local cluster, a one-rank job that sleeps SECONDS (300 by default), and wrappers first on
PATH (squeue, scontrol, sacct, sbatch, scancel) that log each call, with the calls made inside the job
(its supervisor's: SLURM_JOB_ID set) counted apart. Not a test (it takes the job's length):

    .venv/bin/python tests/wait_call_count.py [SECONDS]

docs/reference/api.md quotes its figure (issue 45: at most 15 calls for a 5-minute job).
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from slurm_cluster import LocalSlurmCluster  # noqa: E402

seconds = int(sys.argv[1]) if len(sys.argv) > 1 else 300
COMMANDS = ("squeue", "scontrol", "sacct", "sbatch", "scancel", "sinfo")
jaxlaunch = str(Path(sys.executable).with_name("jaxlaunch"))

with tempfile.TemporaryDirectory() as folder, LocalSlurmCluster(Path(folder) / "slurm", nodes=2) as cluster:
    folder = Path(folder)
    shims, log = folder / "bin", folder / "calls.log"
    shims.mkdir()
    for name in COMMANDS:
        real = shutil.which(name)
        if real:
            (shims / name).write_text(f'#!/bin/sh\necho "{name} ${{SLURM_JOB_ID:+inside-the-job}}" >> "{log}"\n'
                                      f'exec "{real}" "$@"\n')
            (shims / name).chmod(0o755)
    (folder / "sleeper.py").write_text(f"import time\ntime.sleep({seconds})\nprint('slept {seconds} s')\n")
    (folder / "sleeper.yaml").write_text(f"name: sleeper\nentrypoint: sleeper.py\nnodes: 1\nprocesses_per_node: 1\n"
                                         f"timeout: {seconds + 300}\n")
    env = cluster.make_env(JAXLAUNCH_HOME=str(folder / "home"))
    env["PATH"] = f"{shims}{os.pathsep}{env['PATH']}"
    started = time.monotonic()
    done = subprocess.run([jaxlaunch, "submit", "sleeper.yaml", "--wait", "--run-dir", str(folder / "run")],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=seconds + 600)
    took = time.monotonic() - started
    lines = log.read_text().splitlines() if log.exists() else []
    client = Counter(line.split()[0] for line in lines if "inside-the-job" not in line)
    inside = Counter(line.split()[0] for line in lines if "inside-the-job" in line)
    print(f"submit --wait exited {done.returncode} after {took:.0f} s for a {seconds} s job: "
          f"{sum(client.values())} scheduler calls from the client {dict(client)}; "
          f"{sum(inside.values())} from inside the job {dict(inside)}")
    if done.returncode != 0:
        print(done.stdout[-2000:], done.stderr[-2000:])
