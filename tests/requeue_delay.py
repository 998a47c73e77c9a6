"""How long stock Slurm keeps a requeued job from starting again: a throw-away local cluster with
Slurm's default credential lifetime (cred_expire 120 s, which requeue_delay follows before Slurm
25.11), a batch job with --requeue, `scontrol requeue` once it runs, then the seconds until it runs
again (and the EligibleTime Slurm gave it). Not a test (it takes over two minutes):

    .venv/bin/python tests/requeue_delay.py [CRED_EXPIRE_SECONDS]

docs/design/preemption.md quotes its figure.
"""
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from slurm_cluster import LocalSlurmCluster  # noqa: E402

cred_expire = int(sys.argv[1]) if len(sys.argv) > 1 else 120


def wait_state(cluster, job_id, wanted, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        record = cluster.show_job(job_id) or {}
        if record.get("JobState") == wanted:
            return record
        time.sleep(0.2)
    raise TimeoutError(f"job {job_id} not {wanted} after {timeout} s: {cluster.show_job(job_id)}")


with tempfile.TemporaryDirectory() as folder, LocalSlurmCluster(Path(folder) / "slurm", cred_expire=cred_expire) as cluster:
    version = cluster.run("scontrol", "--version").stdout.strip()
    job_id = cluster.sbatch("--requeue", "--nodes=1", "--wrap", "sleep 600", cwd=folder)
    wait_state(cluster, job_id, "RUNNING", 60)
    requeued = time.monotonic()
    cluster.run("scontrol", "requeue", str(job_id))
    pending = wait_state(cluster, job_id, "PENDING", 60)
    running = wait_state(cluster, job_id, "RUNNING", cred_expire + 120)
    waited = time.monotonic() - requeued
    subprocess.run(["scancel", str(job_id)], env=cluster.env, check=False)
    print(f"{version}, cred_expire={cred_expire}: requeued job {job_id} ran again {waited:.1f} s after "
          f"`scontrol requeue` (pending with Reason={pending.get('Reason')}, "
          f"SubmitTime={pending.get('SubmitTime')}, EligibleTime={pending.get('EligibleTime')})")
