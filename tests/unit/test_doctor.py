"""`jaxlaunch doctor` (launcher/cli/doctor_checks/): the real checks on this machine, a mismatched MPI
found by them (the comparison itself: tests/unit/test_launchers.py), the Slurm and run-directory
failure cases, and the table."""

import os
import sys
import time

import pytest

from launcher.cli import doctor_checks as doctor
from launcher.backends.slurm import doctor as slurm_doctor
from launcher.cli.doctor_checks import FAIL, OK, WARN, Check, exit_code, format_checks, run_checks

# mpi4py's library version string under MPICH (tests/unit/test_launchers.py has the other MPIs' texts)
MPICH_LIBRARY = "MPICH Version:\t4.1.2\nMPICH Release date:\tWed Jun  7 15:22:45 CDT 2023\nMPICH ABI:\t15:1:3\n"


def by_name(checks):
    return {c.name: c for c in checks}


@pytest.fixture(scope="module")
def machine_checks(tmp_path_factory):
    """The real checks, once: real subprocesses, real mpirun, mpi4py, mpi4jax and JAX."""
    folder = tmp_path_factory.mktemp("doctor")
    here = os.getcwd()
    os.chdir(folder)
    try:
        return by_name(run_checks())
    finally:
        os.chdir(here)


def test_this_machine_passes_the_mpi_mpi4jax_and_jax_checks(machine_checks):
    for name in ("python", "jaxlaunch", "mpirun", "mpi4py", "mpi4jax", "jax", "run directory root"):
        assert machine_checks[name].status == OK, machine_checks[name]
    assert machine_checks["mpirun"].detail.startswith(os.path.join(os.path.dirname(sys.executable), "mpirun"))
    assert "Open MPI 5." in machine_checks["mpi4py"].detail
    assert "mpi_xla_bridge_cpu" in machine_checks["mpi4jax"].detail
    assert "no CUDA bridge (none needed: no GPU here)" in machine_checks["mpi4jax"].detail
    assert "launcher fast path: on" in machine_checks["mpi4jax"].detail
    assert " cpu device" in machine_checks["jax"].detail
    assert exit_code(list(machine_checks.values())) == 0


def test_slurm_without_a_controller_is_a_warning_not_a_failure(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "no-such-slurm.conf"))
    started = time.monotonic()
    checks = by_name(run_checks())
    assert time.monotonic() - started < 10  # the probes run side by side; scontrol's 60 s of retries are skipped
    controller = checks["slurm controller"]
    assert controller.status == WARN
    assert controller.detail == f"not checked: SLURM_CONF={tmp_path / 'no-such-slurm.conf'} is not a file"
    assert controller.fix == "point SLURM_CONF at the cluster's slurm.conf, or unset it; jaxlaunch run needs no Slurm"
    assert exit_code(list(checks.values())) == 0


def test_a_controller_that_does_not_answer_is_a_warning(tmp_path):
    conf = tmp_path / "slurm.conf"  # a real file naming a controller nobody runs
    conf.write_text("ClusterName=nowhere\nSlurmctldHost=localhost\nSlurmctldPort=1\n"
                    "NodeName=n1 CPUs=1 State=UNKNOWN\nPartitionName=p Nodes=n1 Default=YES\n")
    env = {**os.environ, "SLURM_CONF": str(conf)}
    checks = by_name(slurm_doctor.slurm_checks(env, doctor.Started(["scontrol", "ping"], env, 10), ""))
    assert checks["slurm controller"].status == WARN
    assert f"SLURM_CONF={conf}" in checks["slurm controller"].detail


def test_missing_slurm_commands_are_a_warning(tmp_path):
    env = {"PATH": str(tmp_path)}  # nothing on PATH
    checks = by_name(slurm_doctor.slurm_checks(env, None, "scontrol is not on PATH"))
    assert checks["slurm commands"].status == WARN
    assert checks["slurm commands"].detail == "not on PATH: sbatch, squeue, scontrol, sinfo"
    assert checks["slurm controller"] == Check(
        "slurm controller", WARN, "not checked: scontrol is not on PATH",
        "jaxlaunch run needs no Slurm; for submit, status, logs and cancel: run on the cluster's login node, "
        "or load Slurm there")


def test_a_mismatch_found_by_run_checks_is_a_failure_with_the_fix(monkeypatch, tmp_path):
    """run_checks with an mpi4py probe that reports MPICH while mpirun is this machine's Open MPI."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(doctor, "MPI4PY_PROBE",
                        f"import json; print(json.dumps({{'mpi4py': '4.1.2', 'library': {MPICH_LIBRARY!r}}}))")
    checks = by_name(run_checks())
    assert checks["mpi4py"].status == FAIL
    assert checks["mpi4py"].detail == "mpi4py 4.1.2: mpirun is Open MPI 5.0.11 but mpi4py was built against MPICH 4.1.2"
    assert "rebuild mpi4py and mpi4jax against this mpirun's MPI" in checks["mpi4py"].fix
    assert exit_code(list(checks.values())) == 1


def test_a_crashing_probe_is_a_failed_check_not_a_crash(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(doctor, "JAX_PROBE", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    monkeypatch.setattr(doctor, "MPI4JAX_PROBE", "raise ImportError('libmpi.so.40: cannot open shared object file')")
    checks = by_name(run_checks())
    assert checks["jax"].status == FAIL
    assert checks["jax"].detail.startswith("import jax; jax.devices() crashed (SIGSEGV)")
    assert checks["mpi4jax"].status == FAIL
    assert checks["mpi4jax"].detail == ("importing mpi4jax failed (exit code 1): "
                                        "ImportError: libmpi.so.40: cannot open shared object file")
    assert "pip install" in checks["mpi4jax"].fix


def test_a_hanging_probe_times_out(monkeypatch, tmp_path):
    monkeypatch.setattr(doctor.probes, "PROBE_TIMEOUT", 0.5)
    started = doctor.probes.python_probe("import time; time.sleep(60)", os.environ)
    outcome = started.outcome()
    assert outcome.returncode is None and outcome.seconds < 5
    assert outcome.why_not("import jax", 0.5) == "import jax did not finish in 0.5 s"


def test_runs_that_is_a_file_is_a_failure(monkeypatch, tmp_path):
    (tmp_path / "runs").write_text("not a folder")
    monkeypatch.chdir(tmp_path)
    check = doctor.run_root_check(tmp_path)
    assert check.status == FAIL
    assert check.detail == f"{tmp_path / 'runs'} is not a folder, so runs/{{name}}-{{time}} cannot be made there"
    assert check.fix.startswith(f"rename or remove {tmp_path / 'runs'}")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders; the file case covers FAIL")
def test_an_unwritable_runs_folder_is_a_failure(monkeypatch, tmp_path):
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs").chmod(0o555)
    monkeypatch.chdir(tmp_path)
    try:
        check = by_name(run_checks())["run directory root"]
    finally:
        (tmp_path / "runs").chmod(0o755)
    assert check.status == FAIL and check.detail.startswith(f"cannot write in {tmp_path / 'runs'}")


def test_a_refused_write_is_a_failure(monkeypatch, tmp_path):
    """What a non-root user sees in a read-only folder (root writes anyway, so the refusal is simulated)."""
    def refuse(**kwargs):
        raise PermissionError(13, "Permission denied", str(kwargs["dir"]))

    monkeypatch.setattr(doctor.tempfile, "NamedTemporaryFile", refuse)
    check = doctor.run_root_check(tmp_path)
    assert check == Check("run directory root", FAIL, f"cannot write in {tmp_path}: Permission denied",
                          "run jaxlaunch from a folder you can write, or choose the run directory: --run-dir DIR, "
                          "or run_dir: in the spec")


def test_a_writable_runs_folder_is_ok_and_left_clean(tmp_path):
    (tmp_path / "runs").mkdir()
    check = doctor.run_root_check(tmp_path)
    assert check.status == OK and check.detail.startswith(f"{tmp_path / 'runs'}: writable;")
    assert list((tmp_path / "runs").iterdir()) == []
    assert doctor.run_root_check(tmp_path / "runs").detail.startswith(
        f"{tmp_path / 'runs' / 'runs'}: writable (the first run creates it);")


def test_a_gpu_driver_without_the_cuda_bridge_is_a_warning_with_the_fix():
    probe = doctor.Started([sys.executable, "-c", "import json; print(json.dumps({'version': '0.9.1', 'cuda': False, "
                                                   "'bridges': ['mpi_xla_bridge_cpu'], 'fast_path': True}))"],
                            os.environ, 10)
    check = doctor.mpi.mpi4jax_check(os.environ, probe, "/usr/bin/nvidia-smi")
    assert check.status == WARN
    assert "no CUDA bridge, but an NVIDIA driver is here (/usr/bin/nvidia-smi)" in check.detail
    assert "rebuild mpi4jax with CUDA_PATH pointing at the CUDA toolkit" in check.fix


def test_format_checks_is_one_table_with_four_columns():
    checks = [Check("mpirun", OK, "/x/mpirun (Open MPI 5.0.11)"),
              Check("slurm controller", WARN, "not checked: scontrol is not on PATH", "jaxlaunch run needs no Slurm")]
    lines = format_checks(checks).splitlines()
    assert lines[0].split() == ["CHECK", "STATUS", "DETAIL", "FIX"]
    assert set(lines[1]) == {"-", " "}
    assert lines[2].split(None, 2)[:2] == ["mpirun", "ok"] and lines[2].rstrip().endswith(" -")
    assert lines[3].startswith("slurm controller  warn") and lines[3].rstrip().endswith("jaxlaunch run needs no Slurm")
    assert len(lines) == 4


def test_exit_code_is_1_only_when_a_check_fails():
    assert exit_code([Check("a", OK, ""), Check("b", WARN, "", "fix")]) == 0
    assert exit_code([Check("a", OK, ""), Check("b", FAIL, "", "fix")]) == 1
