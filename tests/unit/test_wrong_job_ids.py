"""Every command that takes a job id treats a wrong one the same way: exit 2, one message with the
fix, no traceback, and at once (`watch` once waited forever on an id nobody knows). Slurm is
stubbed: it knows job 77 only; jaxlaunch's index knows 77."""

import json

import pytest

from cli_helpers import invoke_within
from fake_slurm import refused
from launcher.rundir import RunDirectory
from launcher.backends.slurm import index
from launcher.spec import JobSpec


@pytest.fixture
def slurm(monkeypatch, tmp_path, fake_slurm):
    """squeue lists 77 (ours) and 55 (not submitted with jaxlaunch) RUNNING; every other command
    refuses, as for an id Slurm does not know."""
    monkeypatch.setenv(index.HOME_ENV, str(tmp_path / "home"))
    fake_slurm.queue.update({"77": "RUNNING|0:05|1", "55": "RUNNING|0:05|1"})
    fake_slurm.otherwise = refused()
    run = RunDirectory.create(JobSpec(name="x", entrypoint="m:f"), tmp_path / "run77")
    run.update_status(state="RUNNING", backend="slurm", job_id="77")
    index.record_job("77", run.path)


ID_COMMANDS = [["watch", "ID", "--interval", "0.2"], ["goodput", "ID"], ["plot", "ID", "loss"], ["logs", "ID"],
               ["logs", "ID", "-f"], ["status", "ID"], ["cancel", "ID"]]


@pytest.mark.parametrize("command", ID_COMMANDS, ids=lambda c: " ".join(c))
def test_an_id_nobody_knows_is_exit_2_with_the_fix(slurm, command):
    result = invoke_within([a.replace("ID", "99999") for a in command])
    assert result is not None, "no answer: it waits for a job that does not exist"
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.output.startswith("Error: ") and "99999" in result.output.splitlines()[0], result.output
    assert result.output.count("fix: ") == 1 and "`squeue --me`" in result.output, result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("command", [["goodput", "ID"], ["plot", "ID", "loss"], ["logs", "ID"]],
                         ids=lambda c: " ".join(c))
def test_a_slurm_job_jaxlaunch_did_not_submit_has_no_records_to_read(slurm, command):
    result = invoke_within([a.replace("ID", "55") for a in command])
    assert result is not None and result.exit_code == 2, result and result.output
    assert result.output.startswith("Error: job 55 has no run directory that jaxlaunch knows"), result.output
    assert result.output.count("fix: ") == 1 and "RUN_DIR" in result.output


def test_the_known_job_still_answers(slurm, tmp_path):
    result = invoke_within(["goodput", "77"])
    assert result.exit_code == 0, result.output
    assert "goodput:" in result.output
    (tmp_path / "run77" / "status.json").write_text(json.dumps({"state": "COMPLETED", "backend": "slurm",
                                                                  "job_id": "77", "exit_code": 0}))
    result = invoke_within(["watch", "77", "--interval", "0.2"])
    assert result.exit_code == 0 and "COMPLETED" in result.output


def test_the_apis_job_refuses_an_id_nobody_knows_as_the_cli_does(slurm):
    """Issue 44, item 10: launcher.job(99999) returned a handle without complaint."""
    import launcher
    from launcher.errors import UnknownJobError

    with pytest.raises(UnknownJobError, match="no job 99999 known to Slurm or to jaxlaunch"):
        launcher.job(99999)
    assert launcher.job(77).id == "77"
