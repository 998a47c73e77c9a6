"""status, logs, cancel and submit --wait on job ids: an unknown or malformed id, or a rank the job
does not have, is exit 2 with a message that says so (no Slurm needed: the scheduler is stubbed)."""

import json

import pytest

from cli_helpers import invoke
from fake_slurm import refused
from launcher.rundir import RunDirectory
from launcher.backends.slurm import index
from launcher.spec import JobSpec


@pytest.fixture
def slurm(monkeypatch, tmp_path, fake_slurm):
    """Slurm knows job 77 only (squeue lists it RUNNING; every other command refuses, as for an id it
    does not know); jaxlaunch's index knows 77 (run directory with 4 processes) and 78."""
    monkeypatch.setenv(index.HOME_ENV, str(tmp_path / "home"))
    fake_slurm.queue["77"] = "RUNNING|0:05|2"
    fake_slurm.otherwise = refused()
    # Job 77 is RUNNING with no supervisor to answer a cancel: do not wait the 15 s grace for one.
    monkeypatch.setattr("launcher.backends.slurm.job.CANCEL_GRACE_SECONDS", 0.2)
    index.jobs_index().mkdir(parents=True)
    for job_id in ("77", "78"):
        run = RunDirectory.create(JobSpec(name="x", entrypoint="m:f", nodes=2, processes_per_node=2),
                                  tmp_path / f"run{job_id}")
        run.rank_log(3).write_text("rank 3 says hi\n")
        run.update_status(state="RUNNING" if job_id == "77" else "COMPLETED")
        (index.jobs_index() / f"{job_id}.json").write_text(json.dumps({"job_id": job_id, "run_dir": str(run.path)}))
    return fake_slurm


def test_cancel_an_unknown_job_is_exit_2(slurm):
    result = invoke("cancel", "99999")
    assert result.exit_code == 2 and slurm.cancelled == []
    assert result.output == ("Error: job 99999 is not known to Slurm: nothing to cancel.\n"
                             "  fix: check the id with `squeue --me` or `jaxlaunch status`.\n")
    result = invoke("cancel", "77")
    assert result.exit_code == 0 and result.output == "cancelled job 77\n" and slurm.cancelled == ["77"]


@pytest.mark.parametrize("command", [["status"], ["cancel"], ["logs"], ["logs", "--rank", "0"]])
@pytest.mark.parametrize("bad_id", ["abc", "12;rm", "-5", "1.5", ""])
def test_a_malformed_job_id_is_a_usage_error(slurm, command, bad_id):
    result = invoke(*command[:1], bad_id, *command[1:])
    assert result.exit_code == 2
    assert f"{bad_id!r} is not a Slurm job id" in result.output or "No such option" in result.output
    assert slurm.cancelled == []


def test_status_of_an_unknown_job_is_exit_2_after_the_known_ones(slurm):
    result = invoke("status", "77", "99999", "78")
    assert result.exit_code == 2
    table, error = result.output.split("Error: ")
    assert table.splitlines()[2].split()[:2] == ["77", "RUNNING"]
    assert table.splitlines()[3].split()[:2] == ["78", "COMPLETED"]  # Slurm forgot it; its final state stands
    assert "no longer known" not in table
    assert error.startswith("no job 99999 known to Slurm or to jaxlaunch")
    assert invoke("status", "77").exit_code == 0


def test_status_says_how_many_older_jobs_it_leaves_out_and_an_old_unfinished_entry_is_unknown(slurm, tmp_path):
    """Issue 44, item 7: `status` showed 20 of 72 jobs without a word, and an entry Slurm forgot
    before it ended read 'SUBMITTED (no longer known to Slurm)'."""
    from launcher.backends.slurm.status import LISTED

    for number in range(100, 100 + LISTED + 3):
        (index.jobs_index() / f"{number}.json").write_text(json.dumps({"job_id": str(number),
                                                                        "run_dir": str(tmp_path / f"gone{number}")}))
    run = RunDirectory.create(JobSpec(name="x", entrypoint="m:f"), tmp_path / "run200")
    run.update_status(state="SUBMITTED")
    (index.jobs_index() / "200.json").write_text(json.dumps({"job_id": "200", "run_dir": str(run.path)}))
    result = invoke("status")
    assert "(6 older slurm jobs not shown: `jaxlaunch status ID_OR_RUN_DIR` shows any of them)" in result.output, \
        result.output
    shown = invoke("status", "200")
    assert "200  unknown: Slurm no longer knows it (last seen SUBMITTED)" in shown.output, shown.output


@pytest.mark.parametrize("rank", [-1, 4, 1000])
def test_logs_rank_outside_the_job_is_exit_2_naming_the_valid_range(slurm, rank):
    result = invoke("logs", "77", "--rank", rank)
    assert result.exit_code == 2
    assert result.output == f"Error: --rank {rank}: job 77 has 4 ranks: 0 to 3.\n  fix: pass --rank N with N in 0 to 3.\n"


def test_logs_rank_inside_the_job(slurm):
    result = invoke("logs", "77", "--rank", 3)
    assert result.exit_code == 0 and result.output == "rank 3 says hi\n"
    result = invoke("logs", "77", "--rank", 0)  # a valid rank without a log yet
    assert result.exit_code == 2 and "no log yet" in result.output


def test_logs_of_an_unknown_job_is_exit_2(slurm):
    result = invoke("logs", "99999")
    assert result.exit_code == 2 and result.output.startswith("Error: no job 99999 known to Slurm or to jaxlaunch")


def test_submit_wait_for_a_job_slurm_does_not_know_is_exit_2(slurm, write_spec, tmp_path):
    slurm.ids = ["99999"]
    result = invoke("submit", write_spec("name: x\nentrypoint: m:f\n"), "--run-dir", tmp_path / "new", "--wait",
                    "--no-check")  # the fake scheduler knows no partitions
    assert result.exit_code == 2, result.output
    assert result.output.startswith("Submitted job 99999; run directory: ")
    assert (f"Error: job 99999 is not known to Slurm (run directory: {tmp_path / 'new'}): it ended and was purged "
            "before it was seen to finish, or the id is wrong.") in result.output
