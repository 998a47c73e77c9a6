"""Expedited requeue (Slurm 25.11's `sbatch --requeue=expedite`): detected from `scontrol show
config`, rendered where the cluster allows it, and `explain` says which policy applies. The test
cluster runs 22.05, so the 25.11 configurations here are written from slurm.conf(5)/sbatch(1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.backends.slurm import requeue_policy
from launcher.backends.slurm.requeue_policy import parse_policy
from launcher.cli.explain_table import requeue_lines
from launcher.spec.model import JobSpec, SlurmSpec


def config(version: str, auth: str = "socket=/run/munge.socket", scheduler_parameters: str = "(null)",
           slurmctld_parameters: str = "(null)") -> str:
    """`scontrol show config`'s lines that matter, as 22.05.8 prints them (others around them)."""
    return (f"Configuration data as of 2026-11-27T12:56:08\nAccountingStorageHost   = localhost\n"
            f"AuthInfo                = {auth}\nJobRequeue              = 1\nMaxArraySize            = 1001\n"
            f"SchedulerParameters     = {scheduler_parameters}\nSlurmctldParameters     = {slurmctld_parameters}\n"
            f"SLURM_VERSION           = {version}\n")


def test_slurm_22_has_no_expedite_and_waits_cred_expire():
    policy = parse_policy(config("22.05.8", auth="socket=/tmp/munge.socket,cred_expire=10",
                                 scheduler_parameters="batch_sched_delay=0,bf_interval=2"))
    assert (policy.version, policy.expedite, policy.offers_expedite) == ("22.05.8", False, False)
    assert (policy.delay_seconds, policy.delay_from) == (10, "AuthInfo cred_expire")


def test_without_cred_expire_the_delay_is_slurms_default_120_s():
    policy = parse_policy(config("23.11.4"))
    assert (policy.delay_seconds, policy.expedite) == (120, False)
    assert "default" in policy.delay_from


def test_slurm_25_11_with_the_switch_allows_expedite():
    policy = parse_policy(config("25.11.0", slurmctld_parameters="enable_configless,enable_expedited_requeue"))
    assert policy.expedite and policy.offers_expedite


def test_the_switch_in_scheduler_parameters_counts_too_and_requeue_delay_is_read():
    policy = parse_policy(config("25.11.2", scheduler_parameters="requeue_delay=5,enable_expedited_requeue"))
    assert policy.expedite
    assert (policy.delay_seconds, policy.delay_from) == (5, "SchedulerParameters requeue_delay")


def test_slurm_25_11_without_the_switch_does_not_expedite():
    policy = parse_policy(config("25.11.0", slurmctld_parameters="enable_configless"))
    assert not policy.expedite and policy.offers_expedite


def test_an_older_slurm_with_the_word_in_its_parameters_does_not_expedite():
    # a name an older Slurm ignores: sbatch there refuses --requeue=expedite (whichever delay applies)
    assert not parse_policy(config("25.05.3", slurmctld_parameters="enable_expedited_requeue")).expedite
    assert not parse_policy(config("24.11.1", auth="cred_expire=70",
                                   slurmctld_parameters="enable_expedited_requeue")).expedite
    assert not parse_policy(config("24.11.1", scheduler_parameters="requeue_delay=5,enable_expedited_requeue")).expedite


def test_an_older_slurms_requeue_delay_is_not_its_delay():
    """requeue_delay is 25.11's word: an older Slurm ignores it and waits cred_expire or its default (issue 55)."""
    older = parse_policy(config("24.11.1", auth="cred_expire=70", scheduler_parameters="requeue_delay=5"))
    assert (older.delay_seconds, older.delay_from) == (70, "AuthInfo cred_expire")
    assert parse_policy(config("24.11.1", scheduler_parameters="requeue_delay=5")).delay_seconds == 120
    newer = parse_policy(config("25.11.0", auth="cred_expire=70", scheduler_parameters="requeue_delay=5"))
    assert (newer.delay_seconds, newer.delay_from) == (5, "SchedulerParameters requeue_delay")


def test_a_parameter_that_only_contains_the_name_is_not_the_switch():
    assert not parse_policy(config("25.11.0", slurmctld_parameters="no_enable_expedited_requeue_x")).expedite


def test_a_cluster_that_cannot_be_asked_is_unknown_and_not_expedited(fake_slurm):
    from fake_slurm import refused

    fake_slurm.otherwise = refused("Unable to contact slurm controller")
    policy = requeue_policy.read_policy()
    assert policy is requeue_policy.UNKNOWN and not policy.expedite and not policy.known


def _submit(monkeypatch, fake_slurm, tmp_path: Path, max_requeues: int, version: str, switch: str = "(null)",
            check=True):
    """`submit` through the Slurm backend, its scheduler calls answered by `fake_slurm`; (the calls
    before sbatch, the script sbatch was given)."""
    from launcher.backends.slurm import fit
    from launcher.backends.slurm.backend import SlurmBackend

    fake_slurm.answers["scontrol show config"] = config(version, slurmctld_parameters=switch)
    fake_slurm.ids = ["41"]
    monkeypatch.setattr(fit, "refuse_if_it_cannot_fit", lambda specs: [])  # partitions and nodes: fit's tests
    spec = JobSpec(name="x", entrypoint="m:f", slurm=SlurmSpec(max_requeues=max_requeues))
    backend = SlurmBackend()
    job = backend.start_plan(backend.plan(spec, tmp_path / "run"), check=check)
    assert job.id == "41" and [argv[0] for argv in fake_slurm.calls][-1] == "sbatch"
    return fake_slurm.calls[:-1], fake_slurm.scripts[0]


def test_submit_renders_expedite_where_the_cluster_allows_it(monkeypatch, fake_slurm, tmp_path):
    asked, script = _submit(monkeypatch, fake_slurm, tmp_path, 2, "25.11.0", "enable_expedited_requeue")
    assert asked == [["scontrol", "show", "config"]]
    assert "#SBATCH --requeue=expedite\n" in script


@pytest.mark.parametrize("version,switch", [("22.05.8", "(null)"), ("25.11.0", "(null)")])
def test_submit_keeps_the_plain_requeue_where_it_does_not(monkeypatch, fake_slurm, tmp_path, version, switch):
    _, script = _submit(monkeypatch, fake_slurm, tmp_path, 2, version, switch)
    assert "#SBATCH --requeue\n" in script and "expedite" not in script


def test_a_job_that_never_requeues_asks_nothing_and_says_no_requeue(monkeypatch, fake_slurm, tmp_path):
    asked, script = _submit(monkeypatch, fake_slurm, tmp_path, 0, "25.11.0", "enable_expedited_requeue")
    assert asked == [] and "#SBATCH --no-requeue\n" in script


def test_no_check_asks_nothing_and_keeps_the_plain_requeue(monkeypatch, fake_slurm, tmp_path):
    asked, script = _submit(monkeypatch, fake_slurm, tmp_path, 2, "25.11.0", "enable_expedited_requeue", check=False)
    assert asked == [] and "#SBATCH --requeue\n" in script


def test_explain_says_which_requeue_applies():
    spec = JobSpec(name="x", entrypoint="m:f", slurm=SlurmSpec(max_requeues=3))
    old = requeue_lines(spec, parse_policy(config("22.05.8", auth="cred_expire=10")))
    assert old == ["requeue: up to 3 times; each requeued attempt waits 10 s (AuthInfo cred_expire) before it may "
                   "start again, then for its turn in the queue: Slurm 22.05.8 has no --requeue=expedite "
                   "(Slurm 25.11 and later, where the cluster enables it)"]
    off = requeue_lines(spec, parse_policy(config("25.11.0")))[0]
    assert "waits 120 s" in off and "this cluster does not enable it" in off
    fast = requeue_lines(spec, parse_policy(config("25.11.0", slurmctld_parameters="enable_expedited_requeue")))[0]
    assert fast.startswith("requeue: up to 3 times, expedited (sbatch --requeue=expedite") and "at once" in fast
    assert requeue_lines(spec, None) == []
