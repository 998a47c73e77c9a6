"""The preemption tests' shared pieces: the training job, set up to be interrupted, and checks
that a run interrupted any number of times ends with the same bits as one that was not."""

import json
import subprocess
import time
from pathlib import Path

import numpy as np

from conftest import EXAMPLES, jaxlaunch

TRAIN = EXAMPLES / "train_data_parallel.yaml"
# Slow enough to be interrupted mid-run (about 0.1 s a step), with a periodic checkpoint.
TRAIN_SETTINGS = ["--set", "params.steps=80", "--set", "params.step_seconds=0.1",
                  "--set", "params.checkpoint_every=20"]


def load_result(run_dir: Path) -> dict:
    from launcher import load_result as load

    return load(run_dir)


def reference_result(tmp_path_factory) -> dict:
    """The training job run once, uninterrupted, locally (2 processes x 2 devices, as on Slurm)."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    result = jaxlaunch("run", TRAIN, *TRAIN_SETTINGS, "--set", "params.step_seconds=0", "--run-dir", run_dir,
                       timeout=240)
    assert result.returncode == 0, result.stderr
    return load_result(run_dir)


def assert_same_training(result: dict, reference: dict) -> None:
    """Bit for bit: the final parameters and every step's loss."""
    assert len(result["losses"]) == len(reference["losses"]) == 80
    assert result["losses"] == reference["losses"]  # floats compared exactly, step for step
    for name, value in reference["params"].items():
        assert result["params"][name].dtype == value.dtype
        assert np.array_equal(result["params"][name], value), name
    assert result["replicas_in_sync"]
    assert result["losses"][-1] < result["losses"][0]


def wait_for_checkpoint(run_dir: Path, step: int, timeout: float = 120, process=None) -> None:
    """Wait until the run has a checkpoint of `step` or later (the job is mid-run)."""
    deadline = time.monotonic() + timeout
    while True:
        steps = [int(p.name.split("-")[1]) for p in (run_dir / "checkpoints").glob("step-*")]
        if steps and max(steps) >= step:
            return
        assert process is None or process.poll() is None, "the job ended before its checkpoint"
        assert time.monotonic() < deadline, f"no checkpoint of step {step} within {timeout} s"
        time.sleep(0.1)


def wait_for_end(slurm_env: dict, job_id: str, timeout: float = 240) -> str:
    """Follow the job to its end (through requeues) with `jaxlaunch status`; its final state."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = jaxlaunch("status", job_id, env=slurm_env).stdout.splitlines()
        state = rows[2].split()[1] if len(rows) > 2 else ""
        if state in ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED"):
            return state
        time.sleep(1)
    raise AssertionError(f"job {job_id} did not end within {timeout} s")


def what_happened(run_dir: Path, lines: int = 40) -> str:
    """For an assertion's message when a job ended otherwise than expected: failure.json's summary,
    the end of the batch script's output (the supervisor's and every rank's lines) and the last
    events."""
    parts = []
    failure = run_dir / "failure.json"
    if failure.exists():
        parts.append("failure.json: " + json.loads(failure.read_text()).get("summary", "?"))
    for output in sorted(run_dir.glob("slurm-*.out")):
        parts += [f"--- the end of {output.name}:", *output.read_text(errors="replace").splitlines()[-lines:]]
    if (run_dir / "events.jsonl").exists():
        parts += ["--- the last events:", *(run_dir / "events.jsonl").read_text().splitlines()[-10:]]
    return "\n".join(parts) or f"{run_dir} holds no record"


def events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def interrupt_when(process: subprocess.Popen, ready, what: str, timeout: float = 60) -> tuple[str, str]:
    """Ctrl-C to a started jaxlaunch once `ready()` is true (within `timeout`, while it still runs);
    its (stdout, stderr) once it has ended. It is killed if anything goes wrong on the way."""
    import signal

    try:
        deadline = time.monotonic() + timeout
        while not ready():
            assert process.poll() is None and time.monotonic() < deadline, what
            time.sleep(0.2)
        process.send_signal(signal.SIGINT)
        return process.communicate(timeout=timeout)
    finally:
        process.kill()


def start(*args, env=None) -> subprocess.Popen:
    """`jaxlaunch ARGS...` in the background, as from a terminal: with SIGINT at its default (`make
    test` runs the Slurm tier behind `&`, where the shell ignores SIGINT, and a child keeps that).
    coreutils' env resets it: a preexec_fn would fork a process JAX has made multithreaded."""
    import shutil
    import sys

    exe = shutil.which("jaxlaunch", path=str(Path(sys.executable).parent)) or "jaxlaunch"
    return subprocess.Popen(["env", "--default-signal=INT", exe, *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
