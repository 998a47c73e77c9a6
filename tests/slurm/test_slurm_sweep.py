"""Sweeps on the real local Slurm cluster (tests/slurm_cluster.py): one job array for the whole
sweep, one run directory per task, a task cancelled alone, results collected into one table."""

import json
import subprocess
import time

import pytest

from conftest import EXAMPLES, TEST_JOBS, jaxlaunch
from preemption_helpers import interrupt_when, start

pytestmark = pytest.mark.slurm

SWEEP = EXAMPLES / "sweep_train.yaml"
FAST = ["--set", "params.steps=20"]


def squeue_ids(slurm_env):
    out = subprocess.run(["squeue", "-r", "--noheader", "--format=%i"], env=slurm_env, capture_output=True,
                         text=True, check=True, timeout=30).stdout
    return out.split()


def wait_for_array(sweep_dir, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            arrays = json.loads((sweep_dir / "sweep.json").read_text()).get("arrays")
        except (FileNotFoundError, ValueError):
            arrays = None
        if arrays:
            return arrays
        time.sleep(0.2)
    raise AssertionError("the sweep was not submitted")


def test_sweep_is_one_array_a_task_cancels_alone_and_results_collect(slurm_env, tmp_path):
    from launcher import load_result

    sweep_dir = tmp_path / "sweep"
    # --wait follows the whole array; the result table comes on stdout at the end
    waiting = start("submit", SWEEP, *FAST, "--run-dir", sweep_dir, "--wait", "--parsable", env=slurm_env)
    arrays = wait_for_array(sweep_dir)
    assert len(arrays) == 1 and arrays[0]["tasks"] == list(range(6))  # the 3 x 2 sweep: ONE array
    array_id = arrays[0]["job_id"]
    script = (sweep_dir / "array-0.sbatch").read_text()
    assert "#SBATCH --array=0-5%2\n" in script  # max_parallel: 2, from the spec
    assert f"#SBATCH --output={sweep_dir}/logs/slurm-%A_%a.out\n" in script
    # The last task waits (at most 2 run at once): cancel it alone; the others go on.
    cancelled = jaxlaunch("cancel", f"{array_id}_5", env=slurm_env)
    assert cancelled.returncode == 0, cancelled.stderr
    out, err = waiting.communicate(timeout=300)
    assert waiting.returncode == 1, err  # not every task COMPLETED: the cancelled one
    assert err.startswith(f"{array_id}\n") or f"\n{array_id}\n" in err

    record = json.loads((sweep_dir / "sweep.json").read_text())
    states = {}
    for task in record["tasks"]:
        run = sweep_dir / task["folder"]
        assert task["job_id"] == f"{array_id}_{task['index']}"
        status = json.loads((run / "status.json").read_text())
        states[task["index"]] = status["state"]
        if task["index"] != 5:
            result = load_result(run)
            # each task trained with its own configuration
            assert result["config"] == {"learning_rate": task["values"]["params.learning_rate"],
                                        "seed": task["values"]["params.seed"]}
            assert len(result["losses"]) == 20
    assert states == {**{i: "COMPLETED" for i in range(5)}, 5: "CANCELLED"}

    summary = jaxlaunch("status", array_id, "-v", env=slurm_env)
    assert summary.returncode == 0, summary.stderr
    assert f"arrays {array_id}): 1 CANCELLED, 5 COMPLETED" in summary.stdout
    assert len([line for line in summary.stdout.splitlines() if line.startswith("task-00")]) == 6
    assert jaxlaunch("status", sweep_dir, env=slurm_env).stdout.splitlines()[0] == summary.stdout.splitlines()[0]

    log = jaxlaunch("logs", f"{array_id}_2", env=slurm_env)
    assert log.returncode == 0 and "COMPLETED" in log.stdout
    assert (sweep_dir / "logs" / f"slurm-{array_id}_2.out").exists()

    results = jaxlaunch("results", sweep_dir, "--plot", "final_loss", "--best", "final_loss", env=slurm_env)
    assert results.returncode == 0, results.stderr
    rows = [line for line in results.stdout.splitlines() if line.strip()[:1].isdigit()]
    assert len(rows) == 6 and sum("CANCELLED" in row for row in rows) == 1
    assert (sweep_dir / "final_loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = json.loads((sweep_dir / "results.json").read_text())
    finals = {row["task"]: row["final_loss"] for row in table["rows"] if row["final_loss"] is not None}
    best = min(finals, key=finals.get)
    assert f"from task {best} " in results.stdout


def test_ctrl_c_while_run_follows_a_sweep_on_slurm_cancels_every_task(slurm_env, slurm_cluster, tmp_path):
    """`run --backend slurm --sweep`: the arrays are followed in the foreground, and Ctrl-C cancels
    them all (through the array id, as `jaxlaunch cancel ARRAY` does), running and pending tasks."""
    sweep_dir = tmp_path / "sweep"
    exe = start("run", TEST_JOBS / "fail_on_rank.yaml", "--backend", "slurm", "--set", "entrypoint=fail_on_rank.py:sleep",
                "--set", "processes_per_node=1", "--sweep", "params.seconds=300,301,302",
                "--max-parallel", "2", "--run-dir", sweep_dir, env=slurm_env)
    try:
        array_id = wait_for_array(sweep_dir)[0]["job_id"]
    except AssertionError:
        exe.kill()
        raise
    out, err = interrupt_when(exe, lambda: slurm_cluster.job_state(f"{array_id}_0") == "RUNNING", "no task started")
    assert exe.returncode == 130, err
    assert f"jaxlaunch: interrupted: cancelling job {array_id}" in err
    deadline = time.monotonic() + 30
    while any(task in squeue_ids(slurm_env) for task in (f"{array_id}_{i}" for i in range(3))):
        assert time.monotonic() < deadline, f"tasks of {array_id} still queued: {squeue_ids(slurm_env)}"
        time.sleep(0.2)


def test_sweep_with_an_invalid_value_submits_nothing(slurm_env, tmp_path):
    before = squeue_ids(slurm_env)
    result = jaxlaunch("submit", SWEEP, "--sweep", "processes_per_node=2,0", "--run-dir", tmp_path / "sweep",
                       env=slurm_env)
    assert result.returncode == 2
    assert "processes_per_node=0" in result.stderr and "nothing was run or submitted" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "sweep").exists()
    assert squeue_ids(slurm_env) == before


def test_max_array_size_is_read_from_the_cluster(slurm_env, monkeypatch):
    from launcher.backends.slurm.array import max_array_size

    for key, value in slurm_env.items():
        monkeypatch.setenv(key, value)
    config = subprocess.run(["scontrol", "show", "config"], env=slurm_env, capture_output=True, text=True,
                            check=True).stdout
    line = next(line for line in config.splitlines() if line.startswith("MaxArraySize"))
    assert max_array_size() == int(line.split("=")[1])


def test_a_sweep_in_several_arrays_by_resources_and_size_runs_every_task(slurm_env, tmp_path, monkeypatch):
    """Two node counts give two resource groups, and a MaxArraySize of 2 splits each group of 3:
    four real job arrays (2 + 1 tasks per group), each task in its own run directory, every one
    COMPLETED with its own configuration, status counting across the arrays. In process (CliRunner)
    so the cluster's MaxArraySize can be made small; sbatch, squeue and the jobs are real."""
    from click.testing import CliRunner

    from launcher import load_result
    from launcher.cli import main
    from launcher.backends.slurm import array

    for key, value in slurm_env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(array, "max_array_size", lambda: 2)
    sweep_dir = tmp_path / "sweep"
    submitted = CliRunner().invoke(main, ["submit", str(EXAMPLES / "trivial.yaml"), "--sweep", "nodes=1,2",
                                          "--sweep", "params.x=1,2,3", "--run-dir", str(sweep_dir)])
    assert submitted.exit_code == 0, submitted.output
    arrays = json.loads((sweep_dir / "sweep.json").read_text())["arrays"]
    # task order: nodes slowest, so tasks 0-2 have nodes 1 and 3-5 nodes 2
    assert [entry["tasks"] for entry in arrays] == [[0, 1], [2], [3, 4], [5]]
    assert "#SBATCH --array=0-1\n" in (sweep_dir / "array-0.sbatch").read_text()
    assert "#SBATCH --array=0-0\n" in (sweep_dir / "array-1.sbatch").read_text()
    assert "#SBATCH --nodes=2\n" in (sweep_dir / "array-2.sbatch").read_text()

    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        status = jaxlaunch("status", sweep_dir, env=slurm_env)
        if "6 COMPLETED" in status.stdout or "FAILED" in status.stdout or "CANCELLED" in status.stdout:
            break
        time.sleep(2)
    assert "6 COMPLETED" in status.stdout, status.stdout + status.stderr
    record = json.loads((sweep_dir / "sweep.json").read_text())
    for task in record["tasks"]:
        array_id = arrays[[i for i, entry in enumerate(arrays) if task["index"] in entry["tasks"]][0]]["job_id"]
        assert task["job_id"].startswith(f"{array_id}_")
        spec = json.loads((sweep_dir / task["folder"] / "spec.json").read_text())
        assert (spec["nodes"], spec["params"]["x"]) == (task["values"]["nodes"], task["values"]["params.x"])
        result = load_result(sweep_dir / task["folder"])
        assert result["devices"] == 1 and result["rank"] == 0
