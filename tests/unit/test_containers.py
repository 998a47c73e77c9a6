"""Containers (launcher/container.py, the spec's `container:` section): validation, the command
each runtime wraps a rank in, `explain` and the preflight's version check. Real runs of
jobs/examples/normalize.yaml in a charliecloud image under this machine's mpirun are in
tests/e2e/test_containers_charliecloud.py, the Slurm runs in tests/slurm/test_slurm_container.py;
apptainer and pyxis batch scripts are golden files in test_render.py."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from launcher.cli import main
from launcher.errors import SpecError, UsageError
from launcher.backends.local.plan import plan_local_run
from launcher.launchers.rank_start import rank_command
from launcher.rundir import RunDirectory
from launcher.rank.preflight import compare
from launcher.spec import JobSpec, load_spec

CONTAINER = "container:\n  image: /images/jax\n  runtime: charliecloud\n"
BASE = "name: x\nentrypoint: m:f\nnodes: 2\n"
IMAGE_PROGRAM = ["/opt/venv/bin/python", "-P", "-m", "launcher.rank.bootstrap"]


def spec_of(container: dict, **fields) -> JobSpec:
    return JobSpec.from_dict({"name": "x", "entrypoint": "/home/user/project/train.py:main", "nodes": 2,
                              "container": container, **fields})


# --- the spec ---------------------------------------------------------------------------------

def test_no_container_by_default_and_the_section_survives_spec_json():
    assert JobSpec(name="x", entrypoint="m:f").container is None
    spec = spec_of({"image": "/i", "runtime": "apptainer", "mounts": ["/data:/in"], "gpu": False})
    assert JobSpec.from_json(spec.to_json()) == spec
    assert spec.container.to_dict() == {"image": "/i", "runtime": "apptainer", "mounts": ["/data:/in"], "gpu": False,
                                        "python": "/opt/venv/bin/python", "options": []}


def test_pyxis_in_mpirun_mode_is_refused_naming_pyxis_164(write_spec):
    path = write_spec(BASE + "container:\n  image: nvcr.io#nvidia/jax:25.04-py3\n  runtime: pyxis\n")
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert str(info.value) == (
        f"{path}:6: container.runtime: pyxis starts containers only through srun: in mpirun mode mpirun would "
        f"run inside one pyxis container and cannot start ranks on the other nodes (NVIDIA/pyxis#164); "
        f"set slurm.launch: srun.")
    assert load_spec(path, ["slurm.launch=srun"]).container.runtime == "pyxis"


def test_an_unknown_runtime_lists_the_three(write_spec):
    path = write_spec(BASE + CONTAINER.replace("charliecloud", "docker"))
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert str(info.value).startswith(
        f"{path}:6: container.runtime: expected one of 'apptainer', 'pyxis', 'charliecloud' (got 'docker').\n"
        f"  expected: how each rank enters the image:")


def test_the_image_is_required_once_the_section_is_there(write_spec):
    path = write_spec(BASE + "container:\n  runtime: apptainer\n")
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert str(info.value).startswith(f"{path}:4: container.image: required key is missing.\n  fix: add `image:` "
                                      f"(the image: an apptainer .sif file or URI")


@pytest.mark.parametrize("mount, message", [
    ("data", "'data': mount paths must be absolute, like '/scratch' or '/data/in:/in'"),
    ("/data:in", "'/data:in': mount paths must be absolute"),
    ("/a:/b:ro", "'/a:/b:ro' is not 'SRC' or 'SRC:DST' (paths without ':')"),
    ("/a:", "'/a:' is not 'SRC' or 'SRC:DST'"),
    ("/a,b", "'/a,b': a mount path may not hold a comma"),
])
def test_mounts_are_absolute_src_or_src_dst(write_spec, mount, message):
    path = write_spec(BASE + CONTAINER + f"  mounts: [{json.dumps(mount)}]\n")
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert f"{path}:7: container.mounts: {message}" in str(info.value)


def test_runtime_options_are_options(write_spec):
    with pytest.raises(SpecError, match=r"container.options: 'nv' is not a container runtime option; write it "
                                        r"like '--writable-tmpfs'"):
        load_spec(write_spec(BASE + CONTAINER + "  options: [nv]\n"))


def test_a_relative_image_path_is_relative_to_the_spec_folder_and_registry_names_stay(write_spec, tmp_path):
    spec = load_spec(write_spec(BASE + CONTAINER.replace("/images/jax", "images/jax")))
    assert spec.container.image == str(tmp_path / "images" / "jax")
    docker = load_spec(write_spec(BASE + CONTAINER), ["container.runtime=apptainer", "container.image=docker://x/y:1"])
    assert docker.container.image == "docker://x/y:1"
    pyxis = load_spec(write_spec(BASE + CONTAINER), ["container.runtime=pyxis", "container.image=ubuntu:24.04",
                                                     "slurm.launch=srun"])
    assert pyxis.container.image == "ubuntu:24.04"


# --- the command around each rank -----------------------------------------------------------------

def test_the_local_plan_wraps_each_rank_in_ch_run_with_the_paths_mounted_at_their_own_names(tmp_path):
    spec = spec_of({"image": "/images/jax", "runtime": "charliecloud", "mounts": ["/datasets:/data"]})
    run = RunDirectory.preview(spec, tmp_path / "run")
    plan = plan_local_run(spec, run, "/venv/bin/mpirun", "/venv/bin/python", False, Path("/home/user/project"))
    assert plan.argv == ["/venv/bin/mpirun", "-n", "2", "--oversubscribe", "--bind-to", "none", "ch-run",
                         "--bind=/datasets:/data", "--bind=/home/user/project:/home/user/project",
                         f"--bind={run.path}:{run.path}", "--cd=/home/user/project", "/images/jax", "--",
                         *IMAGE_PROGRAM]
    assert plan.env["JAXLAUNCH_HOST_VERSION"] == "0.1.0" and plan.env["JAXLAUNCH_RUN_DIR"] == str(run.path)


def test_apptainer_gets_nv_from_the_platform_unless_the_spec_says(tmp_path):
    def argv(**fields):
        spec = spec_of({"image": "/i.sif", "runtime": "apptainer", **fields}, platform="gpu")
        return rank_command(spec, "/venv/bin/python", Path("/home/user/project/runs/r"), Path("/home/user/project"))

    assert argv() == ["apptainer", "exec", "--nv", "--bind=/home/user/project:/home/user/project",
                      "--pwd=/home/user/project", "/i.sif", *IMAGE_PROGRAM]
    assert "--nv" not in argv(gpu=False)
    assert rank_command(spec_of({"image": "/i.sif", "runtime": "apptainer", "gpu": True}), "python", Path("/r"),
                        Path("/p"))[:3] == ["apptainer", "exec", "--nv"]


def test_without_a_container_a_rank_is_this_python():
    spec = JobSpec(name="x", entrypoint="m:f")
    assert rank_command(spec, "/venv/bin/python", Path("/r"), Path("/p")) == [
        "/venv/bin/python", "-m", "launcher.rank.bootstrap"]


def test_mounts_come_parents_first_and_a_covered_path_is_not_mounted_twice():
    from launcher.container import mounts

    spec = spec_of({"image": "/i", "runtime": "charliecloud", "mounts": ["/scratch", "/in/a:/z"]})
    assert mounts(spec, Path("/scratch/runs/r"), Path("/home/user/project")) == [
        ("/home/user/project", "/home/user/project"), ("/scratch", "/scratch"), ("/in/a", "/z")]
    with pytest.raises(UsageError, match="/runs/a:b cannot be mounted into the container"):
        mounts(spec, Path("/runs/a:b"), Path("/home/user/project"))


def test_pyxis_is_refused_for_a_local_run_with_the_fix(tmp_path):
    spec = spec_of({"image": "ubuntu:24.04", "runtime": "pyxis"}, slurm={"launch": "srun"})
    with pytest.raises(UsageError) as info:
        plan_local_run(spec, RunDirectory.preview(spec, tmp_path / "r"), "mpirun", "python", False, tmp_path)
    assert str(info.value) == ("container.runtime: pyxis runs only under srun on a Slurm cluster, not under this "
                               "machine's mpirun.\n  fix: jaxlaunch submit, or runtime apptainer or charliecloud here")


def test_explain_shows_the_command_each_rank_runs(write_spec, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = write_spec(BASE + CONTAINER + "  mounts: [/datasets]\n")
    result = CliRunner().invoke(main, ["explain", str(path), "--run-dir", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    at = lines.index("each rank runs in the charliecloud image /images/jax:")
    assert lines[at + 1] == (f"  ch-run --bind=/datasets:/datasets --bind={tmp_path}:{tmp_path} --cd={tmp_path} "
                             f"/images/jax -- /opt/venv/bin/python -P -m launcher.rank.bootstrap")
    assert "JAXLAUNCH_HOST_VERSION=0.1.0" in next(line for line in lines if line.startswith("every rank also gets"))


def test_explain_for_slurm_shows_pyxis_srun_options(write_spec, tmp_path, monkeypatch):
    from launcher.cli.explain_table import container_lines

    monkeypatch.chdir(tmp_path)
    spec = load_spec(write_spec(BASE + CONTAINER), ["container.runtime=pyxis", "container.image=ubuntu:24.04",
                                                    "slurm.launch=srun"])
    assert container_lines(spec, "slurm", tmp_path / "run", tmp_path) == [
        "", "each rank runs in the pyxis image ubuntu:24.04:",
        f"  srun ... --container-image=ubuntu:24.04 --container-mounts={tmp_path}:{tmp_path} "
        f"--container-workdir={tmp_path} --container-env=GLIBC_TUNABLES,PMIX_SECURITY_MODE,JAXLAUNCH_RUN_DIR,"
        f"JAXLAUNCH_HOST_VERSION /opt/venv/bin/python -P -m launcher.rank.bootstrap"]
    assert container_lines(spec, "local", tmp_path / "run", tmp_path)[1].startswith(
        "container: container.runtime: pyxis runs only under srun")


@pytest.mark.parametrize("runtime, launch", [("charliecloud", "mpirun"), ("apptainer", "srun"), ("pyxis", "srun")])
def test_hostile_image_mount_and_option_values_reach_the_command_verbatim_and_run_nothing(tmp_path, runtime, launch):
    """The batch script run by bash, its supervisor swapped for a program that records its
    arguments: the container part arrives as rank_command and pyxis_options make it."""
    from launcher.backends.slurm.render import pyxis_options
    from launcher.backends.slurm.render import batch_environment, render_batch_script

    hostile = "$(touch PWNED) `touch PWNED`; touch PWNED 'q' \"d\" ✓"
    spec = spec_of({"image": f"/images/{hostile}", "runtime": runtime, "mounts": [f"/data/{hostile}:/in"],
                    "options": [f"--x={hostile}"]}, slurm={"launch": launch})
    recorder = tmp_path / "record"
    recorder.write_text(f"#!{sys.executable}\nimport json, sys\n"
                        f"json.dump(sys.argv, open({str(tmp_path / 'argv')!r}, 'w'))\n")
    recorder.chmod(0o755)
    run_dir, workdir = tmp_path / "run dir ;", tmp_path
    script = render_batch_script(spec, run_dir=run_dir, workdir=workdir, python=str(recorder), mpirun=str(recorder))
    subprocess.run(["bash", "-c", script], cwd=tmp_path, check=True, timeout=30)
    argv = json.loads((tmp_path / "argv").read_text())
    expected = [*pyxis_options(spec, run_dir, workdir, list(batch_environment(spec, run_dir))),
                *rank_command(spec, str(recorder), run_dir, workdir)]
    assert argv[-len(expected):] == expected
    assert sum(hostile in arg for arg in expected) == 3  # image, mount, option
    assert not list(tmp_path.rglob("PWNED"))


def test_the_preflight_names_an_image_whose_jaxlaunch_is_not_the_hosts():
    reports = [{"rank": rank, "jaxlaunch": "0.0.9"} for rank in range(2)]
    assert compare(reports, expected_devices=1, host_version="0.1.0")[0] == (
        "jaxlaunch: the container image has 0.0.9, the host (the job's supervisor) has 0.1.0; they must be the same "
        "version: rebuild the image with jaxlaunch==0.1.0")
    assert not [p for p in compare(reports, 1, host_version="0.0.9") if p.startswith("jaxlaunch")]
    assert not [p for p in compare(reports, 1) if p.startswith("jaxlaunch")]  # no container: nothing to compare


def test_a_local_run_with_pyxis_is_refused_before_a_run_directory_exists(tmp_path):
    from conftest import EXAMPLES, jaxlaunch

    done = jaxlaunch("run", EXAMPLES / "normalize.yaml", "--set", "container.runtime=pyxis",
                     "--set", "container.image=/images/x.sqsh", "--set", "slurm.launch=srun",
                     "--run-dir", tmp_path / "run")
    assert done.returncode == 2 and "pyxis runs only under srun" in done.stderr, done.stderr
    assert not (tmp_path / "run").exists()


def test_a_mount_covers_a_path_only_through_a_real_parent_folder():
    """Issue 29: /data2 is not under /data: a run directory there is mounted itself; /data/project is covered."""
    from launcher.container import mounts

    spec = spec_of({"image": "/i", "runtime": "charliecloud", "mounts": ["/data"]})
    assert mounts(spec, Path("/data2/runs/r"), Path("/data/project")) == [
        ("/data", "/data"), ("/data2/runs/r", "/data2/runs/r"), ("/home/user/project", "/home/user/project")]
    assert mounts(spec, Path("/data/runs/r"), Path("/datasets")) == [
        ("/data", "/data"), ("/datasets", "/datasets"), ("/home/user/project", "/home/user/project")]
