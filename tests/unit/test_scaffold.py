"""`jaxlaunch init` (launcher/scaffold/): each template, written into an empty folder, loads as a
spec; names and existing files are refused with exit code 2. The templates run as written under the
real `jaxlaunch run` in tests/e2e/test_scaffold_runs.py."""

import pytest

from launcher.errors import UsageError
from launcher.scaffold import TEMPLATES, render_job, write_job
from launcher.spec import load_spec


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
