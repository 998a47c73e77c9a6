"""`jaxlaunch init` (launcher/scaffold.py): each template, written into an empty folder, runs as
written under the real `jaxlaunch run`; names and existing files are refused with exit code 2."""

import json
import signal

import numpy as np
import pytest

from conftest import jaxlaunch
from launcher import load_result
from launcher.errors import UsageError
from launcher.scaffold import TEMPLATES, job_file_name, render_job, write_job
from launcher.spec import load_spec
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


@pytest.mark.parametrize("template", list(TEMPLATES))
def test_every_spec_loads_and_says_how_to_run_it(tmp_path, template):
    spec_path, job_path = write_job("my-job", template, tmp_path)
    spec = load_spec(spec_path)
    assert spec.name == "my-job" and spec.entrypoint == f"{tmp_path / 'my_job.py'}:main"
    assert spec.nodes == 1 and spec.processes_per_node == 2
    text = spec_path.read_text()
    assert "\nentrypoint: my_job.py:main" in text
    assert "jaxlaunch run my-job.yaml" in text and "jaxlaunch submit my-job.yaml" in text
    assert job_path.name == "my_job.py" and "def main(ctx: launcher.JobContext):" in job_path.read_text()


@pytest.mark.parametrize("name, file", [("123", "123.py"), ("true", "true.py"), ("v1.2-rc", "v1_2_rc.py"),
                                        ("Null", "Null.py"), ("x" * 64, "x" * 64 + ".py")])
def test_names_that_yaml_could_misread_stay_strings(tmp_path, name, file):
    spec_path, job_path = write_job(name, "minimal", tmp_path)
    assert job_path.name == file
    assert load_spec(spec_path).name == name


@pytest.mark.parametrize("name", ["", "-job", ".job", "my job", "a/b", "../up", "x" * 65, "naïve", "job\n"])
def test_a_bad_name_is_a_usage_error(tmp_path, name):
    with pytest.raises(UsageError) as raised:
        write_job(name, "minimal", tmp_path)
    assert raised.value.exit_code == 2
    assert str(raised.value) == (f"{name!r} is not a valid job name.\n  fix: use letters, digits, '.', '_' or '-', "
                                 f"starting with a letter or digit, at most 64 characters (e.g. my-job)")
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_template_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError) as raised:
        write_job("job", "transformer", tmp_path)
    assert raised.value.exit_code == 2
    assert str(raised.value) == ("--template transformer: no such template.\n"
                                 "  fix: choose one of minimal, data-parallel, sharded")


@pytest.mark.parametrize("existing", ["job.yaml", "job.py"])
def test_existing_files_are_never_overwritten(tmp_path, existing):
    (tmp_path / existing).write_text("mine\n")
    with pytest.raises(UsageError) as raised:
        write_job("job", "minimal", tmp_path)
    assert raised.value.exit_code == 2
    assert str(raised.value) == (f"{tmp_path / existing} already exists; jaxlaunch init never overwrites a file.\n"
                                 f"  fix: choose another NAME, or move it away first")
    assert sorted(p.name for p in tmp_path.iterdir()) == [existing]  # the other file was not written either
    assert (tmp_path / existing).read_text() == "mine\n"


def test_a_name_whose_python_file_exists_is_refused(tmp_path):
    write_job("my_job", "minimal", tmp_path)
    with pytest.raises(UsageError, match=r"my_job.py already exists"):
        write_job("my-job", "minimal", tmp_path)  # would write my_job.py again
    assert not (tmp_path / "my-job.yaml").exists()


def test_both_existing_files_are_named(tmp_path):
    write_job("job", "sharded", tmp_path)
    with pytest.raises(UsageError) as raised:
        write_job("job", "minimal", tmp_path)
    assert str(raised.value).startswith(f"{tmp_path / 'job.yaml'} and {tmp_path / 'job.py'} already exist; ")
    assert "move them away first" in str(raised.value)


def test_a_missing_folder_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="no such folder"):
        write_job("job", "minimal", tmp_path / "missing")


def test_default_folder_is_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert write_job("here") == [tmp_path / "here.yaml", tmp_path / "here.py"]


def test_render_is_pure_and_complete():
    files = render_job("demo", "data-parallel")
    assert list(files) == ["demo.yaml", "demo.py"]
    assert "$" not in files["demo.yaml"] + files["demo.py"]  # every placeholder filled
    assert "name: demo\nentrypoint: demo.py:main\n" in files["demo.yaml"]
