"""The function API (launcher.Executor) on this machine, under a real mpirun: closures and lambdas
run on every rank and rank 0's value comes back; a failure raises with the remote traceback;
map gives results in order; what cannot be pickled, or was pickled by another installation, is
a clear error. Also the run's provenance (environment.json, git.diff) and `snapshot: true`. What
is refused before anything runs is in tests/unit/test_function_api_checks.py."""

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

import launcher
from conftest import jaxlaunch
from launcher.executor import function_files
from launcher.rank.function_job import CALL_FILE, CALL_RECORD, FunctionVersionError, check_versions

pytestmark = pytest.mark.e2e


def test_a_closure_runs_on_every_rank_and_rank_0s_psum_comes_back(in_tmp):
    scale = 10.0  # captured by value: the function is defined here, not importable by the ranks

    def psum_of_ranks(ctx, offset):
        import jax.numpy as jnp

        return {"sum": float(launcher.allreduce(jnp.float32(scale * ctx.rank + offset))), "size": ctx.size}

    job = launcher.Executor("local", processes_per_node=2).submit(psum_of_ranks, 1.0)
    assert job.result(timeout=120) == {"sum": 12.0, "size": 2}  # (0 + 1) + (10 + 1)
    assert (job.run_dir / "function" / "call.pkl").exists()
    # the CLI knows it like any job
    status = jaxlaunch("status", job.run_dir)
    assert status.returncode == 0 and "COMPLETED" in status.stdout, status.stdout + status.stderr


def test_a_failing_function_raises_with_the_failing_rank_and_its_remote_traceback(in_tmp):
    def fails_on_rank_1(ctx):
        if ctx.rank == 1:
            raise ValueError(f"no data for rank {ctx.rank}")
        return 1

    job = launcher.Executor("local", processes_per_node=2).submit(fails_on_rank_1)
    with pytest.raises(launcher.JobFailedError) as caught:
        job.result(timeout=120)
    error = caught.value
    assert error.state == "FAILED" and error.rank == 1
    assert "ValueError: no data for rank 1" in str(error)
    # the file and its source line, which cloudpickle 3.1 alone replaces by '<dynamic-code>'
    assert "in fails_on_rank_1" in error.remote_traceback and __file__ in error.remote_traceback
    assert 'raise ValueError(f"no data for rank {ctx.rank}")' in error.remote_traceback


def test_map_over_six_items_gives_six_results_in_order(in_tmp):
    jobs = launcher.Executor("local", processes_per_node=2).map(lambda ctx, item: (item, item * item, ctx.size),
                                                                 [5, 3, 0, 4, 1, 2], max_parallel=3)
    assert [job.result(timeout=300) for job in jobs] == [(i, i * i, 2) for i in [5, 3, 0, 4, 1, 2]]
    assert [json.loads((job.run_dir / "spec.json").read_text())["params"]["map_index"] for job in jobs] == list(range(6))


def test_a_function_defined_in_main_runs(in_tmp):
    script = in_tmp / "notebook_like.py"
    script.write_text(textwrap.dedent("""
        import launcher

        def doubled_rank_sum(ctx):
            return launcher.allreduce(2 * ctx.rank)

        print("RESULT", launcher.Executor("local", processes_per_node=2).submit(doubled_rank_sum).result(timeout=120))
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180, cwd=in_tmp)
    assert done.returncode == 0, done.stderr
    assert "RESULT 2" in done.stdout


def test_a_pickle_from_another_python_or_jaxlaunch_is_named_not_an_unpickling_traceback(in_tmp):
    with pytest.raises(FunctionVersionError, match=r"Python 3\.9\.0 there, Python .* here"):
        check_versions({"python": "3.9.0", "jaxlaunch": launcher.__version__}, in_tmp)
    with pytest.raises(FunctionVersionError, match=r"jaxlaunch 0\.0\.1 there, jaxlaunch .* here"):
        check_versions({"python": ".".join(map(str, sys.version_info[:3])), "jaxlaunch": "0.0.1"}, in_tmp)
    # end to end: the job fails with that line as its root cause
    fn = lambda ctx: 1  # noqa: E731
    executor = launcher.Executor("local", processes_per_node=2)
    files = function_files(fn, (), {})
    record = {**json.loads(files[f"function/{CALL_RECORD}"]), "python": "3.9.0"}
    # as the owner pickled it on a Python 3.9 node: call.json signed with the call, by the owner's key
    from launcher.owner_key import sign
    from launcher.rank.function_job import signed_bytes

    record["signature"] = sign(signed_bytes(files[f"function/{CALL_FILE}"], record))
    files[f"function/{CALL_RECORD}"] = json.dumps(record).encode()
    job = executor.backend.start(executor.job_spec(fn), None, files=files)
    with pytest.raises(launcher.JobFailedError) as caught:
        job.result(timeout=120)
    assert "FunctionVersionError" in str(caught.value) and "Python 3.9.0 there" in str(caught.value)


# --- provenance and snapshots (spec jobs and function jobs alike) ---------------------------

def _git(folder, *args):
    subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True)


def test_a_run_records_python_packages_git_commit_and_the_uncommitted_diff(tmp_path):
    from launcher.provenance import git_state, installed_packages
    from launcher.rundir import RunDirectory

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "job.py").write_text("def main(ctx):\n    return 1\n")
    (repo / "job.yaml").write_text("name: prov\nentrypoint: job.py:main\n")
    _git(repo, "init", "-q")
    _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "add", ".")
    _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "first")
    (repo / "job.py").write_text("def main(ctx):\n    return 2  # edited, not committed\n")
    git_state.cache_clear()
    installed_packages.cache_clear()
    run = RunDirectory.create(launcher.load_spec(repo / "job.yaml"), tmp_path / "run")
    record = json.loads((run.path / "environment.json").read_text())
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert record["git"]["commit"] == commit.strip() and record["git"]["dirty"] is True
    assert record["python"] == ".".join(map(str, sys.version_info[:3]))
    assert record["packages"]["jax"] and record["packages"]["jaxlaunch"] == launcher.__version__
    assert "+    return 2  # edited, not committed" in (run.path / "git.diff").read_text()


def _snapshot_job(folder, snapshot: bool):
    """A job that waits for `go`, then imports its helper module and returns its VALUE."""
    folder.mkdir()
    (folder / "helper.py").write_text("VALUE = 'as submitted'\n")
    (folder / "job.py").write_text(textwrap.dedent("""
        import os, time
        def main(ctx):
            while not os.path.exists(os.path.join(ctx.params["folder"], "go")):
                time.sleep(0.05)
            import helper
            return helper.VALUE
    """))
    (folder / "job.yaml").write_text(f"name: snap\nentrypoint: job.py:main\nprocesses_per_node: 2\n"
                                     f"snapshot: {str(snapshot).lower()}\nparams: {{folder: {folder}}}\n")


@pytest.mark.parametrize("snapshot", [True, False])
def test_with_snapshot_code_edited_after_submit_does_not_reach_the_job(tmp_path, snapshot):
    folder = tmp_path / "job"
    _snapshot_job(folder, snapshot)
    job = launcher.run(folder / "job.yaml", run_dir=tmp_path / "run")
    (folder / "helper.py").write_text("VALUE = 'edited while queued'\n")  # after submit, before import
    (folder / "go").touch()
    value = job.result(timeout=120)
    assert value == ("as submitted" if snapshot else "edited while queued")
    if snapshot:
        spec = json.loads((tmp_path / "run" / "spec.json").read_text())
        assert spec["entrypoint"] == f"{tmp_path / 'run' / 'code' / 'job.py'}:main"


def test_a_function_pickled_by_reference_reaches_the_ranks_with_the_callers_sys_path(in_tmp, monkeypatch):
    """Issue 29: a function from the caller's own module (a notebook's helpers folder on its sys.path,
    not the ranks') travels as module and name only; the ranks import it through the sys.path that
    call.json records. The Slurm tier checks this too (test_slurm_function.py); this is the local run."""
    import importlib

    helpers = in_tmp / "notebook_helpers"  # under the working directory, not in it: not on the ranks' path
    helpers.mkdir()
    (helpers / "audit_by_reference.py").write_text(textwrap.dedent("""
        import launcher

        def rank_sum(ctx, offset):
            return {"sum": launcher.allreduce(ctx.rank + offset), "file": __file__}
    """))
    monkeypatch.syspath_prepend(str(helpers))
    module = importlib.import_module("audit_by_reference")
    monkeypatch.setitem(sys.modules, "audit_by_reference", module)  # gone again after the test
    payload = function_files(module.rank_sum, (1,), {})["function/call.pkl"]
    assert b"code_with_filename" not in payload and b"cloudpickle" not in payload  # by reference, not by value
    job = launcher.Executor("local", processes_per_node=2).submit(module.rank_sum, 1)
    assert job.result(timeout=120) == {"sum": 3, "file": str(helpers / "audit_by_reference.py")}  # (0+1) + (1+1)
    assert str(helpers) in json.loads((job.run_dir / "function" / CALL_RECORD).read_text())["sys_path"]
