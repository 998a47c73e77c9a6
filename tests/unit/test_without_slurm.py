"""Commands on a machine where Slurm cannot be asked (a laptop, or a login node with no SLURM_CONF):
`status` still lists every local run and says in one line why Slurm was not asked; `submit`,
`status ID` and `cancel` say what to fix (doctor's words), not Slurm's raw errors; a submit that
failed can be retried into the same run directory. The Slurm commands are small scripts that print
what Slurm 22.05 prints here without a configuration (or the real ones, with SLURM_CONF pointing at
a missing file)."""

import json
import os
import re
import time

import pytest

from cli_helpers import invoke
from fake_slurm import write_command
from launcher.rundir import RunDirectory
from launcher.backends.slurm import index; from launcher.backends.slurm import scheduler
from launcher.spec import JobSpec

SLURM_COMMANDS = ("sbatch", "squeue", "scontrol", "scancel", "sacct", "sinfo")
# What every Slurm command prints on this machine with no slurm.conf and no DNS SRV record (exit 1).
NO_CONFIGURATION = ("{0}: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host\n"
                    "{0}: error: fetch_config: DNS SRV lookup failed\n"
                    "{0}: error: _establish_config_source: failed to fetch config\n"
                    "{0}: fatal: Could not establish a configuration source\n")
FIX = "set SLURM_CONF to the cluster's slurm.conf, or run on its login node"


@pytest.fixture
def no_slurm(monkeypatch, tmp_path):
    """Slurm's commands fail as they do without a configuration; jaxlaunch's index knows jobs 77
    (running when last seen) and 78 (completed); runs/ holds a completed and a failed local run.
    Returns the folder of the fake commands."""
    fake = tmp_path / "bin"
    fake.mkdir()
    for name in SLURM_COMMANDS:
        write_command(fake, name, NO_CONFIGURATION.format(name))
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("SLURM_CONF", raising=False)
    monkeypatch.setenv(index.HOME_ENV, str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    for job_id, state in (("77", "RUNNING"), ("78", "COMPLETED")):
        run = RunDirectory.create(JobSpec(name="x", entrypoint="m:f"), tmp_path / f"slurm-run{job_id}")
        run.update_status(state=state, backend="slurm", job_id=job_id)
        index.record_job(job_id, run.path)
    now = time.time()
    for name, state in (("done", "COMPLETED"), ("broken", "FAILED")):
        run = RunDirectory.create(JobSpec(name=name, entrypoint="m:f"), tmp_path / "runs" / name)
        run.update_status(state=state, backend="local", started=now - 5, ended=now)
    return fake


def test_status_lists_every_local_run_and_says_in_one_line_why_slurm_was_not_asked(no_slurm):
    result = invoke("status")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split() == ["LOCAL", "RUN", "STATE", "DURATION", "RESULT"]
    assert sorted(line.split()[:2] for line in lines[2:4]) == [["runs/broken", "FAILED"], ["runs/done", "COMPLETED"]]
    about_slurm = [line for line in lines if "Slurm" in line]
    assert len(about_slurm) == 1, result.output
    assert "not" in about_slurm[0] and "Could not establish a configuration source" in about_slurm[0]
    assert FIX in about_slurm[0]
    assert "Error" not in result.output and "resolve_ctls_from_dns_srv" not in result.output


def test_status_with_slurm_conf_pointing_nowhere_answers_at_once(no_slurm, monkeypatch, tmp_path):
    """The real squeue retries a missing SLURM_CONF for 60 s before it says so."""
    monkeypatch.setenv("PATH", os.environ["PATH"].split(os.pathsep, 1)[1])  # the real Slurm commands
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "nowhere" / "slurm.conf"))
    started = time.monotonic()
    result = invoke("status")
    assert time.monotonic() - started < 20
    assert result.exit_code == 0, result.output
    about_slurm = [line for line in result.output.splitlines() if "Slurm" in line]
    assert len(about_slurm) == 1 and f"SLURM_CONF={tmp_path / 'nowhere' / 'slurm.conf'} is not a file" in about_slurm[0]
    assert "point SLURM_CONF at the cluster's slurm.conf, or unset it" in about_slurm[0]


def test_status_of_the_console_script_degrades_only_slurms_part(tmp_path):
    """Issue 31: each backend's part of `status` stands alone. The real console script, with a HOME
    whose ~/.jaxlaunch index holds an old Slurm job and the array of a sweep whose folder was
    deleted since, beside a local run; Slurm cannot be asked (SLURM_CONF names no file). Before,
    status printed the local table and ended in `Error: ... is not a sweep directory` (exit 2):
    one index entry of Slurm's sank the whole command."""
    from conftest import jaxlaunch

    home = tmp_path / "home"
    env = {**os.environ, "HOME": str(home), "SLURM_CONF": str(tmp_path / "gone" / "slurm.conf")}
    env.pop(index.HOME_ENV, None)
    jobs = home / ".jaxlaunch" / "jobs"
    jobs.mkdir(parents=True)
    old = RunDirectory.create(JobSpec(name="old", entrypoint="m:f"), tmp_path / "runs" / "old-slurm-job")
    old.update_status(state="RUNNING", backend="slurm", job_id="4242")
    (jobs / "4242.json").write_text(json.dumps({"job_id": "4242", "run_dir": str(old.path)}))
    (jobs / "4243.json").write_text(json.dumps({"job_id": "4243", "sweep_dir": str(tmp_path / "deleted-sweep")}))
    now = time.time()
    local = RunDirectory.create(JobSpec(name="here", entrypoint="m:f"), tmp_path / "runs" / "here")
    local.update_status(state="COMPLETED", backend="local", started=now - 3, ended=now)

    result = jaxlaunch("status", env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["LOCAL", "RUN", "STATE", "DURATION", "RESULT"]
    assert lines[2].split()[:2] == ["runs/here", "COMPLETED"]
    assert not any("old-slurm-job" in line for line in lines[2:3])  # a Slurm job is no local run
    about_slurm = [line for line in lines if "Slurm" in line or "slurm" in line]
    assert about_slurm == [f"Slurm could not be asked about the 1 job jaxlaunch submitted: SLURM_CONF="
                           f"{tmp_path / 'gone' / 'slurm.conf'} is not a file; fix: {scheduler.FIX_CONF_NOT_A_FILE}"]
    assert lines[-2:] == ["", about_slurm[0]]
    assert result.stderr == "" and "Traceback" not in result.stdout and "Error" not in result.stdout


@pytest.mark.parametrize("command", [["status", "77"], ["cancel", "77"], ["logs", "12345"], ["watch", "12345"]])
def test_a_command_that_must_ask_slurm_names_the_fix(no_slurm, command):
    result = invoke(*command)
    assert result.exit_code == 2, result.output
    # The first command that needs Slurm says it (status: squeue; the others look up the run
    # directory first: scontrol), and nothing asks Slurm again after that.
    assert re.match(r"Error: Slurm could not be asked: (squeue|scontrol): fatal: Could not establish a "
                    r"configuration source \(SLURM_CONF is unset", result.output), result.output
    assert f"  fix: {FIX}; jaxlaunch run needs no Slurm." in result.output
    assert "resolve_ctls_from_dns_srv" not in result.output and "Traceback" not in result.output


def test_submit_names_the_fix(no_slurm, write_spec, tmp_path):
    result = invoke("submit", write_spec("name: x\nentrypoint: m:f\n"), "--run-dir", tmp_path / "new")
    assert result.exit_code == 2, result.output
    assert result.output == ("Error: Slurm could not be asked: sbatch: fatal: Could not establish a configuration "
                             "source (SLURM_CONF is unset, so /etc/slurm/slurm.conf or DNS SRV).\n"
                             f"  fix: {FIX}; jaxlaunch run needs no Slurm.\n")


def test_a_failed_submit_can_be_retried_into_the_same_run_dir(no_slurm, write_spec, tmp_path):
    spec = write_spec("name: x\nentrypoint: m:f\n")
    run_dir = tmp_path / "retried"
    assert invoke("submit", spec, "--run-dir", run_dir).exit_code != 0
    assert json.loads((run_dir / "status.json").read_text())["state"] == "SUBMIT_FAILED"
    (run_dir / "notes.txt").write_text("mine\n")  # something the user put there meanwhile

    write_command(no_slurm, "sbatch", stdout="4242\n", code=0)  # Slurm can be reached now
    result = invoke("submit", spec, "--run-dir", run_dir, "--no-check")
    assert result.exit_code == 0, result.output
    assert result.output == f"Submitted job 4242; run directory: {run_dir}\n"
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "SUBMITTED" and status["job_id"] == "4242" and "error" not in status
    assert "ended" not in status
    assert (run_dir / "notes.txt").read_text() == "mine\n"
    assert index.lookup("4242")["run_dir"] == str(run_dir)


def test_a_run_dir_that_ran_is_still_never_reused(no_slurm, write_spec, tmp_path):
    spec = write_spec("name: x\nentrypoint: m:f\n")
    result = invoke("submit", spec, "--run-dir", tmp_path / "slurm-run77", "--no-check")
    assert result.exit_code == 2 and "already holds files" in result.output


def test_doctor_and_the_commands_say_the_same_words(monkeypatch, tmp_path):
    from launcher.backends.slurm import doctor as slurm_doctor

    conf = tmp_path / "missing.conf"
    monkeypatch.setenv("SLURM_CONF", str(conf))
    with pytest.raises(scheduler.SlurmUnreachable) as info:
        scheduler.call_slurm(["squeue"])
    checks = slurm_doctor.slurm_checks({"PATH": str(tmp_path)}, None, f"SLURM_CONF={conf} is not a file")
    assert checks[1].fix == info.value.fix == scheduler.FIX_CONF_NOT_A_FILE
    assert checks[0].fix.startswith(scheduler.FIX_NO_COMMANDS)
    assert scheduler.REACH_CONTROLLER in scheduler.FIX_NO_CONTROLLER and FIX == scheduler.REACH_CONTROLLER
