"""Cross-rank preflight (launcher/rank/preflight.py): ranks that differ stop the job before
its code runs, with the odd rank named. A real MPMD mpirun gives rank 1 another mpi4jax version
(a PYTHONPATH entry that shadows its package metadata, as another venv on one node would)."""

import json
import os
import subprocess
import sys

from conftest import JOBS, jaxlaunch
from launcher.rank.preflight import compare, format_reports

BASE = {"host": "node1", "python": "/venv/bin/python", "python_version": "3.11.7", "jax": "0.10.2",
        "jaxlib": "0.10.2", "mpi4jax": "0.9.1", "mpi4py": "4.1.2", "numpy": "2.4.6",
        "mpi_library": "Open MPI v5.0.11", "platform": "gpu", "device_count": 1, "gpus": []}


def reports(*overrides):
    return [{**BASE, "rank": rank, **extra} for rank, extra in enumerate(overrides)]


def test_identical_ranks_pass_and_the_report_is_saved(tmp_path):
    result = jaxlaunch("run", JOBS / "normalize.yaml", "--run-dir", tmp_path / "run")
    assert result.returncode == 0, result.stderr
    document = json.loads((tmp_path / "run" / "preflight.json").read_text())
    assert document["ok"] and document["problems"] == [] and [r["rank"] for r in document["ranks"]] == [0, 1]
    assert document["ranks"][0]["device_count"] == 2 and document["seconds"] >= 0  # recorded, not judged


def test_a_rank_with_another_mpi4jax_fails_fast_naming_it(tmp_path):
    from launcher.backends.local.plan import plan_local_run
    from launcher.backends.mpirun import find_mpirun
    from launcher.rundir import RunDirectory
    from launcher.spec import load_spec

    shadow = tmp_path / "other-venv"
    (shadow / "mpi4jax-0.0.1.dist-info").mkdir(parents=True)
    (shadow / "mpi4jax-0.0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: mpi4jax\nVersion: 0.0.1\n")
    spec = load_spec(JOBS / "normalize.yaml")
    run = RunDirectory.create(spec, tmp_path / "run")
    plan = plan_local_run(spec, run, find_mpirun(), sys.executable, os.geteuid() == 0)
    mpirun, flags = plan.argv[0], [a for a in plan.argv[1:plan.argv.index(sys.executable)] if a not in ("-n", "2")]
    program = [sys.executable, "-m", "launcher.rank.bootstrap"]
    argv = [mpirun, *flags, "-n", "1", *program, ":", "-n", "1", "env", f"PYTHONPATH={shadow}", *program]
    done = subprocess.run(argv, env={**os.environ, **plan.env}, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    document = json.loads((run.path / "preflight.json").read_text())
    assert not document["ok"]
    assert document["problems"][0] == "mpi4jax: rank 1 has 0.0.1; the others have 0.9.1.post2"
    error = run.rank_error(0).read_text()
    assert error.startswith("launcher.rank.preflight.PreflightError: the ranks differ: mpi4jax: rank 1 has 0.0.1; "
                            "the others have 0.9.1.post2\n")
    assert "! 0.0.1" in error  # the table marks the odd value
    assert not (run.path / "result.json").exists()


def test_two_ranks_bound_to_one_gpu():
    problems = compare(reports({"gpus": ["0"]}, {"gpus": ["0"]}), expected_devices=1)
    assert problems == ["GPU 0 on node1 is bound to rank 0 and rank 1: two ranks would share one GPU "
                        "(check CUDA_VISIBLE_DEVICES and the binding)"]
    assert compare(reports({"gpus": ["0"]}, {"gpus": ["1"]}), expected_devices=1) == []
    assert compare(reports({"gpus": ["0"]}, {"gpus": ["0"], "host": "node2"}), expected_devices=1) == []


def test_wrong_device_count_and_odd_rank_marked():
    found = reports({}, {}, {"device_count": 2})
    problems = compare(found, expected_devices=1)
    assert problems[0] == "device_count: rank 2 has 2; the others have 1"
    assert "device_count: rank(s) 2 see a different number of devices" in problems[1]
    table = format_reports(found, problems)
    assert table.splitlines()[-1].split()[0] == "2" and "! 2" in table.splitlines()[-1]
