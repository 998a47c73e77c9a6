"""`jaxlaunch init`'s templates run as written under the real `jaxlaunch run` (mpirun): each trains,
checkpoints, survives a preemption notice bit for bit and keeps its layout. Writing and rendering
the files is in tests/unit/test_scaffold.py and tests/unit/test_scaffold_templates.py."""

import json
import signal

import numpy as np
import pytest

from conftest import jaxlaunch
from launcher import load_result
from launcher.rundir.metrics import progress
from launcher.scaffold import job_file_name, write_job
from preemption_helpers import start, wait_for_checkpoint


def run_template(tmp_path, name, template, *extra):
    paths = write_job(name, template, tmp_path)
    assert [p.name for p in paths] == [f"{name}.yaml", job_file_name(name)]
    result = jaxlaunch("run", f"{name}.yaml", "--run-dir", tmp_path / "run", *extra, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads((tmp_path / "run" / "status.json").read_text())["state"] == "COMPLETED"
    return result, load_result(tmp_path / "run")


@pytest.mark.e2e
def test_minimal_runs_as_written(tmp_path):
    result, value = run_template(tmp_path, "hello", "minimal")
    assert value == {"processes": 2, "sum": 3.0, "devices_per_process": 1}
    assert json.loads(result.stdout) == value
    for rank in (0, 1):
        assert f"[rank {rank}] rank {rank} of 2 (node 0, local rank {rank}) drives [CpuDevice(id=0)]" in result.stderr


@pytest.mark.e2e
def test_data_parallel_trains_and_checkpoints(tmp_path):
    _, value = run_template(tmp_path, "train-mlp", "data-parallel")
    assert (tmp_path / "train_mlp.py").exists()
    assert value["devices"] == 4 and value["attempt"] == 0
    assert len(value["losses"]) == 40
    assert value["final_loss"] < value["first_loss"] / 3
    assert (tmp_path / "run" / "checkpoints" / "step-00000020" / "manifest.json").exists()
    reported = progress(tmp_path / "run")  # ctx.report: what jaxlaunch status shows
    assert (reported.step, reported.total, reported.metrics["loss"]) == (39, 40, value["final_loss"])


@pytest.mark.e2e
def test_data_parallel_layouts_compute_the_same_steps(tmp_path):
    """The global batch is split by global device index: 1 process x 1 device gives the same losses."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _, two_by_two = run_template(tmp_path / "a", "dp", "data-parallel", "--set", "params.steps=5")
    _, one_by_one = run_template(tmp_path / "b", "dp", "data-parallel", "--set", "params.steps=5",
                                 "--set", "processes_per_node=1", "--set", "devices_per_process=1")
    assert one_by_one["devices"] == 1 and two_by_two["devices"] == 4
    np.testing.assert_allclose(one_by_one["losses"], two_by_two["losses"], rtol=1e-5)


@pytest.mark.e2e
def test_data_parallel_survives_a_preemption_notice_bit_for_bit(tmp_path):
    """kill -USR2 mid-run: checkpoint and exit 75; --resume ends with the losses of an
    uninterrupted run, step for step."""
    # Long enough (about 3 s here) that the notice comes mid-run: with 120 steps (0.2 s) the run once
    # finished before the test saw its first checkpoint and sent SIGUSR2 (CI, a loaded 2-core machine).
    settings = ["--set", "params.steps=1500"]
    (tmp_path / "reference").mkdir()
    _, reference = run_template(tmp_path / "reference", "dp", "data-parallel", *settings)

    write_job("dp", "data-parallel", tmp_path)
    run_dir = tmp_path / "run"
    process = start("run", tmp_path / "dp.yaml", *settings, "--run-dir", run_dir)
    wait_for_checkpoint(run_dir, 20, process=process)
    process.send_signal(signal.SIGUSR2)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 75, err
    assert not (run_dir / "result.json").exists()

    resumed = jaxlaunch("run", "--resume", run_dir, timeout=240, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    result = load_result(run_dir)
    assert result["attempt"] == 1
    assert result["losses"] == reference["losses"]  # exactly, every step


@pytest.mark.e2e
def test_sharded_keeps_the_model_split_over_the_devices(tmp_path):
    _, value = run_template(tmp_path, "split-mlp", "sharded")
    assert value["w1_sharding"] == "P(None, 'devices')"
    assert value["w1"].shape == (16, 32) and value["w1"].dtype == np.float32
    assert value["w2"].shape == (32, 4)
    assert len(value["losses"]) == 20 and value["final_loss"] < value["first_loss"] / 3
    reported = progress(tmp_path / "run")
    assert (reported.step, reported.total, reported.metrics["loss"]) == (19, 20, value["final_loss"])
