"""Cross-rank preflight (launcher/rank/preflight.py): ranks that differ stop the job before
its code runs, with the odd rank named. A real MPMD mpirun gives rank 1 another mpi4jax version
(a PYTHONPATH entry that shadows its package metadata, as another venv on one node would). The
comparison on reports written by hand is in tests/unit/test_preflight_compare.py."""

import json
import os
import subprocess
import sys

from conftest import EXAMPLES, jaxlaunch


def test_identical_ranks_pass_and_the_report_is_saved(tmp_path):
    result = jaxlaunch("run", EXAMPLES / "normalize.yaml", "--run-dir", tmp_path / "run")
    assert result.returncode == 0, result.stderr
    document = json.loads((tmp_path / "run" / "preflight.json").read_text())
    assert document["ok"] and document["problems"] == [] and [r["rank"] for r in document["ranks"]] == [0, 1]
    assert document["ranks"][0]["device_count"] == 2 and document["seconds"] >= 0  # recorded, not judged


def test_a_rank_with_another_mpi4jax_fails_fast_naming_it(tmp_path):
    from launcher.backends.local.plan import plan_local_run
    from launcher.launchers.mpirun import find_mpirun
    from launcher.rundir import RunDirectory
    from launcher.spec import load_spec

    shadow = tmp_path / "other-venv"
    (shadow / "mpi4jax-0.0.1.dist-info").mkdir(parents=True)
    (shadow / "mpi4jax-0.0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: mpi4jax\nVersion: 0.0.1\n")
    spec = load_spec(EXAMPLES / "normalize.yaml")
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
