"""Programs as entrypoints on the real local Slurm cluster (tests/slurm_cluster.py): an mpi4jax script
run unchanged at 2 and 4 ranks, a script calling a bare jax.distributed.initialize() under both launch
modes, and a script's sys.exit(3) on one rank failing the job with exit code 3; and a script with its own
(JAX) preemption handler, preempted on 2 nodes, requeued and resumed bit for bit.

The five jobs are submitted together (`jaxlaunch submit ... --wait` each, in the background) when the
first test asks for them, and each test waits for its own: the file costs about as much as its slowest
job, not the sum of them. The preemptible script's test submits its own job (~35 s: Slurm restarts a
requeued job some 18 s after the requeue)."""

import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import EXAMPLES, TEST_JOBS, jaxlaunch

pytestmark = pytest.mark.slurm

SOLVER = EXAMPLES / "programs" / "mpi4jax_solver.yaml"  # its args: --size 64 --iterations 50
TRAIN = EXAMPLES / "programs" / "global_train.yaml"  # its args: --steps 20; 2 processes per node, 2 devices each
MISBEHAVE = TEST_JOBS / "programs" / "misbehave_script.py"  # a script as SPEC: every other key at its default
ITERATIONS, GRID = 10, 128  # the solver's: Jacobi sweeps and total grid points (64 x 2 ranks = 32 x 4 ranks)
STEPS = 5  # global_train's
JAXLAUNCH = os.path.join(os.path.dirname(sys.executable), "jaxlaunch")  # the console script of this venv


def solver_integral(points, iterations):
    """mpi4jax_solver.py's Jacobi iterations for -u'' = 1 on one process, in float64."""
    h, u = 1.0 / (points + 1), np.zeros(points)
    for _ in range(iterations):
        padded = np.concatenate([[0.0], u, [0.0]])
        u = 0.5 * (padded[:-2] + padded[2:] + h * h)
    return float(u.sum() * h)


def train_reference(processes, devices_per_process, steps, lr=0.1):
    """global_train.py's loss and weights on one process, in float64: each process's shard of the
    global batch comes from default_rng(process_index), and the gradient is the global batch's mean."""
    true_w = np.arange(1, 5, dtype=np.float32)
    x = np.concatenate([np.random.default_rng(p).normal(size=(8 * devices_per_process, 4)).astype(np.float32)
                        for p in range(processes)]).astype(np.float64)
    y, w = x @ true_w, np.zeros(4)
    for _ in range(steps):
        residual = x @ w - y
        loss, w = float(np.mean(residual ** 2)), w - lr * 2 * x.T @ residual / len(y)
    return loss, w


class Submitted:
    """`jaxlaunch submit SPEC ARGS --wait --run-dir RUN_DIR`, running in the background."""

    def __init__(self, env, folder, name, spec, *args, out=True):
        self.run_dir, self.out = folder / name, folder / f"{name}.json"
        command = [*args, "--out", self.out] if out else list(args)  # --out: the last of the program's args
        self.process = subprocess.Popen([JAXLAUNCH, "submit", str(spec), "--wait", "--run-dir", str(self.run_dir),
                                         *map(str, command)],
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.stdout = self.stderr = None

    def wait(self, timeout=180):
        if self.stderr is None:
            self.stdout, self.stderr = self.process.communicate(timeout=timeout)
        return self

    @property
    def returncode(self):
        return self.process.returncode

    @property
    def job_id(self):
        return re.search(r"Submitted job (\S+?);", self.stderr).group(1)  # after any warning

    def status(self):
        return json.loads((self.run_dir / "status.json").read_text())

    def result(self):
        return json.loads(self.out.read_text())

    def rank_log(self, rank):
        return (self.run_dir / "logs" / f"rank-{rank}.log").read_text()

    def why(self):
        return f"exit {self.returncode}\n--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"


@pytest.fixture(scope="module")
def jobs(slurm_cluster, tmp_path_factory):
    """Every job of this file, submitted at once; output files in a folder the nodes see (this machine's)."""
    folder = tmp_path_factory.mktemp("programs")
    env = slurm_cluster.make_env(JAXLAUNCH_HOME=str(folder / "home"))
    submitted = {
        "solver2": Submitted(env, folder, "solver2", SOLVER, "-N", "2", "-n", "1",
                             "--", "--size", GRID // 2, "--iterations", ITERATIONS),
        "solver4": Submitted(env, folder, "solver4", SOLVER, "--nodes", "2", "--processes-per-node", "2",
                             "--", "--size", GRID // 4, "--iterations", ITERATIONS),
        "train-mpirun": Submitted(env, folder, "train-mpirun", TRAIN, "-N", "2", "-n", "1",
                                  "--set", "slurm.launch=mpirun", "--", "--steps", STEPS),
        # srun's --mpi plugin: the spec's default (pmix), as every srun test of this tier uses
        "train-srun": Submitted(env, folder, "train-srun", TRAIN, "-N", "2", "-n", "1",
                                "--set", "slurm.launch=srun", "--", "--steps", STEPS),
        "exit3": Submitted(env, folder, "exit3", MISBEHAVE, "-N", "2", "-n", "1", "--set", "timeout=3m",
                           "--", "--mode", "exit", "--rank", "1", "--code", "3", out=False),
    }
    submitted["env"] = env
    yield submitted
    for job in submitted.values():  # a test that failed early leaves the others' jobs: cancel them
        if isinstance(job, Submitted) and job.process.poll() is None:
            job.process.kill()  # the `jaxlaunch submit --wait` this fixture started, by its Popen
            job.process.wait(timeout=10)
            try:
                job_id = job.status().get("job_id")
            except (OSError, ValueError):
                job_id = None
            if job_id:
                subprocess.run(["scancel", str(job_id)], env=env, timeout=30, check=False)


def test_an_mpi4jax_script_runs_unchanged_at_2_and_4_ranks_with_its_args(jobs):
    runs = {ranks: jobs[f"solver{ranks}"].wait() for ranks in (2, 4)}
    expected = solver_integral(GRID, ITERATIONS)  # the spec's own args (64 per rank, 50 sweeps) give others
    assert abs(expected - solver_integral(64 * 4, ITERATIONS)) > 1e-2 * expected
    assert abs(expected - solver_integral(GRID, 50)) > 1e-2 * expected
    for ranks, run in runs.items():
        assert run.returncode == 0, run.why()
        assert f"job {run.job_id}: COMPLETED" in run.stderr, run.why()
        assert run.status()["state"] == "COMPLETED" and run.status()["exit_code"] == 0, run.status()
        assert not (run.run_dir / "result.json").exists()  # a script sets no result
        spec = json.loads((run.run_dir / "spec.json").read_text())
        assert spec["nodes"] == 2 and spec["processes_per_node"] == ranks // 2
        assert spec["args"] == ["--size", "64", "--iterations", "50", "--size", str(GRID // ranks),
                                "--iterations", str(ITERATIONS), "--out", str(run.out)]
        result = run.result()  # only the args after `--` name this file
        assert result["ranks"] == ranks, result
        # the args after `--` reached every rank: the integral is that of GRID points after ITERATIONS sweeps
        assert result["integral"] == pytest.approx(expected, rel=1e-4), (result, expected)
        for rank in range(ranks):
            assert f"rank {rank} of {ranks}: integral of u = " in run.rank_log(rank), run.rank_log(rank)
        assert not (run.run_dir / "logs" / f"rank-{ranks}.log").exists()
    integrals = [runs[ranks].result()["integral"] for ranks in (2, 4)]
    assert integrals[1] == pytest.approx(integrals[0], rel=1e-5)


def test_a_bare_jax_distributed_initialize_trains_on_two_nodes_under_mpirun_and_srun(jobs):
    runs = {launch: jobs[f"train-{launch}"].wait() for launch in ("mpirun", "srun")}
    loss, weights = train_reference(processes=2, devices_per_process=2, steps=STEPS)
    for launch, run in runs.items():
        assert run.returncode == 0, (launch, run.why())
        assert f"job {run.job_id}: COMPLETED" in run.stderr, run.why()
        assert run.status()["state"] == "COMPLETED", run.status()
        script = (run.run_dir / "job.sbatch").read_text()
        assert ("srun --mpi=pmix" in script) == (launch == "srun"), script
        result = run.result()
        # one global mesh: both processes' devices, and the mean over both processes' shards of the batch
        assert result["processes"] == 2 and result["devices"] == 4, (launch, result)
        assert result["loss"] == pytest.approx(loss, rel=1e-4), (launch, result, loss)
        np.testing.assert_allclose(result["w"], weights, rtol=1e-4)
        for rank in range(2):
            assert f"process {rank} of 2: loss " in run.rank_log(rank), run.rank_log(rank)
        out = (run.run_dir / f"slurm-{run.job_id}.out").read_text()
        assert "[rank 0]" in out and "[rank 1]" in out
    assert runs["mpirun"].result()["loss"] == pytest.approx(runs["srun"].result()["loss"], rel=1e-6)


def test_a_scripts_sys_exit_3_on_rank_1_fails_the_job_with_exit_code_3(jobs):
    run = jobs["exit3"].wait()
    assert run.returncode == 3, run.why()
    # rank 1 is on node2: the debug partition's second node
    assert "FAILED: rank 1 on node2 failed first: SystemExit: sys.exit(3) called" in run.stderr, run.why()
    status = run.status()
    assert status["state"] == "FAILED" and status["exit_code"] == 3, status
    failure = json.loads((run.run_dir / "failure.json").read_text())
    assert failure["first_failure"]["rank"] == 1 and failure["first_failure"]["exit_code"] == 3, failure
    assert [r["rank"] for r in failure["failed_ranks"]] == [1], failure
    shown = jaxlaunch("status", run.job_id, env=jobs["env"])
    assert shown.returncode == 0, shown.stderr
    row = shown.stdout.splitlines()[2].split()
    assert row[:2] == [run.job_id, "FAILED"], shown.stdout
    assert f"job {run.job_id} FAILED: rank 1 on node2 failed first: SystemExit: sys.exit(3) called" in shown.stdout, \
        shown.stdout
    assert "rank 0 done" in run.rank_log(0) and "rank 1 done" not in run.rank_log(1)


PREEMPTIBLE = EXAMPLES / "programs" / "preemptible_train.yaml"  # preemption_signal: SIGTERM; its own JAX handler
PREEMPTIBLE_STEPS = 60


def events_of(run_dir):
    path = run_dir / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_scripts_own_preemption_handler_hears_the_notice_as_sigterm_and_is_requeued_bit_identically(
        slurm_env, tmp_path):
    """jobs/examples/programs/preemptible_train.yaml (orbax-style: JAX's preemption sync point, which listens for
    SIGTERM) on 2 nodes: the notice sbatch --signal=B:USR2@T sends the batch step (the supervisor), given
    with `scancel --batch --signal=USR2`, reaches both ranks as SIGTERM (preemption_signal); they save
    checkpoint.npz at one agreed step and exit 0; jaxlaunch requeues the job (same id), which resumes from
    that step and ends COMPLETED with a final.npy equal, byte for byte, to an uninterrupted run's (run
    locally on 2 processes meanwhile: the same computation)."""
    program = ["--", "--steps", PREEMPTIBLE_STEPS, "--step-seconds", "0.1"]
    clean_dir = tmp_path / "clean"
    clean = subprocess.Popen([JAXLAUNCH, "run", str(PREEMPTIBLE), "-n", "2", "--run-dir", str(clean_dir),
                              *map(str, program)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run = Submitted(slurm_env, tmp_path, "preempted", PREEMPTIBLE, "-N", "2", "-n", "1", "--set", "timeout=3m",
                    *program, out=False)
    job_id = None
    try:
        # The notice only once the program's jax.distributed.initialize() returned (only then is JAX's
        # SIGTERM notifier listening), and a few of its 0.1 s steps in.
        deadline = time.monotonic() + 90
        while not any(e["event"] == "jax_distributed" for e in events_of(run.run_dir)):
            assert run.process.poll() is None, run.wait().why()
            assert time.monotonic() < deadline, f"jax.distributed never started: {events_of(run.run_dir)}"
            time.sleep(0.1)
        job_id = run.status()["job_id"]
        time.sleep(1.5)
        subprocess.run(["scancel", "--batch", "--signal=USR2", str(job_id)], env=slurm_env, check=True, timeout=30)
        run.wait(timeout=150)
        clean_err = clean.communicate(timeout=120)[1]
    finally:
        for process in (run.process, clean):
            if process.poll() is None:  # a failure above: stop what this test started
                process.kill()
                process.wait(timeout=10)
        if job_id is not None and run.process.returncode != 0:
            subprocess.run(["scancel", str(job_id)], env=slurm_env, timeout=30, check=False)
    assert clean.returncode == 0, clean_err
    assert run.returncode == 0, run.why()
    assert f"job {run.job_id}: COMPLETED" in run.stderr, run.why()
    status = run.status()
    out = (run.run_dir / f"slurm-{job_id}.out").read_text()  # --open-mode=append: both allocations' output
    # requeues 0: the notice never stopped the program (it ran to its end), e.g. no SIGTERM reached JAX
    assert (status["state"], status["requeues"], run.job_id) == ("COMPLETED", 1, job_id), (status, out)
    timeline = events_of(run.run_dir)
    attempts = [e for e in timeline if e["event"] == "attempt_ended"]
    assert [e["state"] for e in attempts] == ["PREEMPTED", "COMPLETED"], timeline
    assert [e["event"] for e in timeline].count("requeue") == 1, timeline
    stopped = next(e for e in timeline if e["event"] == "stopped")
    assert stopped["at_agreed_point"] and stopped["sources"] == ["supervisor"], stopped
    first = {rank: (run.run_dir / "logs" / "attempt-0" / f"rank-{rank}.log").read_text() for rank in range(2)}
    for rank, log in first.items():
        assert "SIGTERM caught" in log, log  # JAX's notifier heard the notice: preemption_signal delivered it
        assert "finished" not in log, log
    saved = [int(line.rsplit(" ", 1)[1]) for log in first.values() for line in log.splitlines()
             if "preempted: saved step " in line]
    assert len(saved) == 2 and saved[0] == saved[1], first  # both ranks stopped at the one agreed step
    step = saved[0]
    assert 0 < step < PREEMPTIBLE_STEPS, first
    for rank in range(2):  # the requeued attempt's logs
        log = run.rank_log(rank)
        assert f"resumed from step {step}\n" in log and f"finished {PREEMPTIBLE_STEPS} steps" in log, log
    assert (run.run_dir / "final.npy").read_bytes() == (clean_dir / "final.npy").read_bytes()
