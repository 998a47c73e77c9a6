"""Pure and error-path pieces of the Slurm layer (the real cluster is in test_slurm.py)."""

import pytest
from click.testing import CliRunner

from fake_slurm import write_command
from launcher.cli import main
from launcher.errors import SchedulerError
from launcher.backends.slurm import scheduler


@pytest.mark.parametrize("slurm_state, expected", [
    ("PENDING", ("PENDING", False)), ("RUNNING", ("RUNNING", False)), ("COMPLETING", ("RUNNING", False)),
    ("COMPLETED", ("COMPLETED", True)), ("FAILED", ("FAILED", True)), ("CANCELLED by 0", ("CANCELLED", True)),
    ("TIMEOUT", ("TIMEOUT", True)), ("NODE_FAIL", ("FAILED", True)), ("OUT_OF_MEMORY", ("OUT_OF_MEMORY", True)),
    ("PREEMPTED", ("PREEMPTED", True)), ("RUNNING+", ("RUNNING", False)), ("WEIRD", ("WEIRD", False)),
])
def test_state_table(slurm_state, expected):
    assert scheduler.translate_state(slurm_state) == expected


@pytest.mark.parametrize("output, job_id", [("123\n", "123"), ("4567;cluster\n", "4567"),
                                            ("sbatch: warning: x\n89\n", "89")])
def test_parse_job_id(output, job_id):
    assert scheduler.parse_job_id(output) == job_id


def test_unparsable_sbatch_output_is_shown():
    with pytest.raises(SchedulerError, match="could not find a job id in sbatch's output: 'Submitted maybe'"):
        scheduler.parse_job_id("Submitted maybe")


def test_scontrol_record():
    record = scheduler.parse_scontrol_record(
        "JobId=7 JobName=a b JobState=CANCELLED Reason=None RunTime=00:00:03 NumNodes=2 StdOut=/r/slurm-7.out")
    assert record["JobId"] == "7" and record["JobName"] == "a b" and record["JobState"] == "CANCELLED"
    assert record["StdOut"] == "/r/slurm-7.out" and record["NumNodes"] == "2"


def test_failed_command_carries_command_exit_code_and_stderr():
    with pytest.raises(SchedulerError) as info:
        scheduler.call_slurm(["bash", "-c", "echo oops >&2; exit 3"])
    assert info.value.returncode == 3 and info.value.stderr == "oops\n"
    assert str(info.value) == "command failed (exit code 3): bash -c echo oops >&2; exit 3\noops"


def test_timeout_is_reported():
    with pytest.raises(SchedulerError, match="timed out after 0.2 s"):
        scheduler.call_slurm(["sleep", "5"], timeout=0.2)


def test_cli_without_slurm_says_so(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no squeue anywhere
    monkeypatch.setenv("JAXLAUNCH_HOME", str(tmp_path))
    monkeypatch.delenv("SLURM_CONF", raising=False)
    result = CliRunner().invoke(main, ["cancel", "12"])  # cancel first asks scontrol where job 12 runs
    assert result.exit_code == 2
    assert result.output == ("Error: Slurm could not be asked: scontrol is not on PATH.\n"
                             "  fix: jaxlaunch run needs no Slurm; for submit, status, logs and cancel: run on the "
                             "cluster's login node, or load Slurm there.\n")


@pytest.mark.parametrize("stderr, exit_code", [
    ("squeue: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host\n"
     "squeue: fatal: Could not establish a configuration source\n", 2),
    ("squeue: error: ClusterName needs to be specified\nsqueue: fatal: Unable to process configuration file\n", 2),
    ("slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n", 1),
])
def test_slurm_that_cannot_be_asked_is_told_from_a_refusal(monkeypatch, tmp_path, stderr, exit_code):
    """What Slurm 22.05 prints without a configuration, with a bad one, and with its controller down."""
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))
    (tmp_path / "slurm.conf").write_text("")
    script = write_command(tmp_path, "squeue", stderr, code=1)
    with pytest.raises(scheduler.SlurmUnreachable) as info:
        scheduler.call_slurm([str(script), "--me"])
    assert info.value.exit_code == exit_code and info.value.stderr == stderr
    last = stderr.strip().splitlines()[-1]
    assert str(info.value) == (f"Slurm could not be asked: {last if last.startswith('squeue') else f'squeue: {last}'}"
                               f" (SLURM_CONF={tmp_path / 'slurm.conf'}).\n  fix: {scheduler.FIX_UNREACHABLE}.")
    with pytest.raises(SchedulerError) as info:  # an ordinary refusal stays as Slurm said it
        scheduler.call_slurm(["bash", "-c", "echo 'squeue: error: Invalid job id specified' >&2; exit 1"])
    assert not isinstance(info.value, scheduler.SlurmUnreachable)


def test_status_with_no_jobs(monkeypatch, tmp_path):
    monkeypatch.setenv("JAXLAUNCH_HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)  # no runs/ here either
    result = CliRunner().invoke(main, ["status"])
    assert result.exit_code == 0 and result.output == "no jobs submitted with jaxlaunch yet, and no local runs in runs/\n"


def test_pending_reason_and_elapsed_against_the_limit(fake_slurm):
    fake_slurm.queue["41"] = "PENDING|0:00|2|Resources|1:00:00"
    info = scheduler.query_job("41")
    assert info.describe_state() == "PENDING (Resources)" and info.describe_elapsed() == "0:00/1:00:00"
    fake_slurm.queue["41"] = "RUNNING|12:34|2|None|UNLIMITED"
    info = scheduler.query_job("41")
    assert info.describe_state() == "RUNNING" and info.describe_elapsed() == "12:34"


def test_query_jobs_asks_at_most_three_commands_for_any_number_of_jobs(fake_slurm):
    """squeue for all, then one scontrol listing for those squeue lost, then one sacct for the rest."""
    calls = fake_slurm.calls
    fake_slurm.answers.update({
        "squeue": "\n".join(f"{i}|RUNNING|0:01|1|None|10:00" for i in range(0, 40)) + "\n",
        "scontrol": "JobId=45 JobState=COMPLETED RunTime=00:00:09 NumNodes=2 ExitCode=0:0\n"
                    "JobId=99 ArrayJobId=46 ArrayTaskId=3 JobState=FAILED RunTime=00:00:01 NumNodes=1 ExitCode=1:0\n",
        "sacct": "47|TIMEOUT|00:10:00|1|0:15\n48.batch|TIMEOUT|00:10:00|1|0:15\n",
    })
    ids = [str(i) for i in range(0, 45)] + ["45", "46_3", "47", "48"]
    found = scheduler.query_jobs(ids)
    assert [argv[0] for argv in calls] == ["squeue", "scontrol", "sacct"]
    assert calls[0][calls[0].index("--jobs") + 1] == ",".join(ids)
    assert calls[1] == ["scontrol", "show", "job", "--oneliner"]  # every job, once
    assert calls[2][calls[2].index("--jobs") + 1] == "40,41,42,43,44,47,48"  # only what scontrol did not know
    assert {j: found[j].state for j in ("0", "39", "45", "46_3", "47")} == {
        "0": "RUNNING", "39": "RUNNING", "45": "COMPLETED", "46_3": "FAILED", "47": "TIMEOUT"}
    assert (found["45"].source, found["46_3"].source, found["47"].source) == ("scontrol", "scontrol", "sacct")
    assert "48" not in found and "44" not in found  # no command knows them
    calls.clear()
    assert scheduler.query_jobs(["5"])["5"].state == "RUNNING" and len(calls) == 1  # squeue knew it: one call


def test_a_running_job_whose_supervisor_reports_is_asked_about_every_30_s_not_every_few(fake_slurm, tmp_path):
    """Issue 45, scheduler citizenship: `submit --wait` on a 27 s job made 7 squeue calls, backing off
    to one per 10 s. While the batch job's supervisor keeps status.json fresh and says RUNNING, the
    run directory answers, and Slurm is asked at most every RUNNING_REFRESH."""
    import os

    from launcher.backends.slurm import job as slurm_job
    from launcher.backends.slurm import watcher as slurm_watcher
    from launcher.rundir import RunDirectory
    from launcher.spec import JobSpec
    from launcher.states import JobState

    fake_slurm.queue["5"] = "RUNNING|0:05|1"
    asked = fake_slurm.calls  # squeue lists the job: one call each time Slurm is asked
    run = RunDirectory.create(JobSpec(name="x", entrypoint="m:f"), tmp_path / "run")
    run.update_status(state="RUNNING", backend="slurm", job_id="5")
    watcher = slurm_watcher.SlurmWatcher()
    job = slurm_job.SlurmJob("5", run, watcher)
    assert job.state() == JobState.RUNNING and len(asked) == 1
    watcher._last_refresh -= slurm_job.RUNNING_REFRESH - 1  # 29 s later: the run directory answers
    assert job.state() == JobState.RUNNING and len(asked) == 1
    watcher._last_refresh -= 2  # 31 s: Slurm is asked, for a death the supervisor cannot report
    assert job.state() == JobState.RUNNING and len(asked) == 2
    old = os.stat(run.status_file).st_mtime - slurm_job.SUPERVISOR_SILENT - 1
    os.utime(run.status_file, (old, old))  # the supervisor stopped writing: back to the usual polling
    watcher._last_refresh -= slurm_watcher.MAX_REFRESH
    assert job.state() == JobState.RUNNING and len(asked) == 3
