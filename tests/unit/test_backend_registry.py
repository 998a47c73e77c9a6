"""Backends come from a registry (launcher/backends/__init__.py): jaxlaunch's two, the entry-point group
`jaxlaunch.backends`, then JAXLAUNCH_BACKENDS; every backend choice of the command line reads it."""

import pytest
from click.testing import CliRunner

from launcher import backends
from launcher.cli import main
from launcher.errors import UsageError
from launcher.rundir import RunDirectory
from launcher.spec import JobSpec


def test_the_built_in_two_come_first_and_the_environment_adds_others(monkeypatch):
    monkeypatch.setattr(backends, "_installed", lambda: (("local", "elsewhere:Other"), ("k8s", "k8s_backend:K8s")))
    monkeypatch.setenv("JAXLAUNCH_BACKENDS", "fake=fake_scheduler:FakeBackend, broken, =x:y,slurm=evil:Slurm")
    assert backends.registry() == {"local": "launcher.backends.local:LocalBackend",
                                   "slurm": "launcher.backends.slurm:SlurmBackend",
                                   "k8s": "k8s_backend:K8s", "fake": "fake_scheduler:FakeBackend"}
    # a name given twice keeps its first target: an entry point cannot take over `local`


def test_the_installed_entry_points_name_jaxlaunchs_own_two():
    """pyproject.toml declares them (a checkout installed with pip -e: make setup)."""
    installed = dict(backends._installed())
    assert installed.get("local", backends.BUILT_IN["local"]) == backends.BUILT_IN["local"]
    assert installed.get("slurm", backends.BUILT_IN["slurm"]) == backends.BUILT_IN["slurm"]


def test_an_unknown_backend_names_the_registry(monkeypatch):
    monkeypatch.delenv("JAXLAUNCH_BACKENDS", raising=False)
    with pytest.raises(UsageError, match="unknown backend 'k8s'; jaxlaunch has local, slurm .*jaxlaunch.backends"):
        backends.get_backend("k8s")


def test_a_registered_class_missing_from_its_module_is_a_usage_error_naming_the_fix(monkeypatch):
    """The module is there, the class is not (a typo in the entry point): no traceback (issue 55)."""
    monkeypatch.setenv("JAXLAUNCH_BACKENDS", "k8s=launcher.backends.local:LocalBakend")
    with pytest.raises(UsageError) as refused:
        backends.get_backend("k8s")
    assert str(refused.value).startswith("backend 'k8s' (launcher.backends.local:LocalBakend) cannot be loaded: "
                                         "module 'launcher.backends.local' has no attribute 'LocalBakend'")
    assert "fix: install the package that provides it, or correct its entry point or JAXLAUNCH_BACKENDS" \
        in str(refused.value)


@pytest.mark.parametrize("argv", [["submit", "job.yaml", "--backend", "k8s"], ["explain", "job.yaml", "--target", "k8s"],
                                  ["drill", "job.yaml", "--target", "k8s"], ["render", "job.yaml", "--target", "k8s"]])
def test_every_backend_choice_of_the_command_line_reads_the_registry(argv, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.yaml").write_text("name: x\nentrypoint: m:f\n")
    monkeypatch.delenv("JAXLAUNCH_BACKENDS", raising=False)
    refused = CliRunner().invoke(main, argv)
    assert refused.exit_code == 2 and "'k8s': choose from local, slurm" in refused.output, refused.output
    monkeypatch.setenv("JAXLAUNCH_BACKENDS", "k8s=no_such_module:K8s")  # registered: parsing takes it
    taken = CliRunner().invoke(main, argv)
    assert "choose from" not in taken.output
    if argv[0] in ("submit", "drill", "render"):  # these load the backend before anything else
        assert taken.exit_code == 2 and "backend 'k8s' (no_such_module:K8s) cannot be loaded: No module named " \
            "'no_such_module'" in taken.output, taken.output


def test_importing_the_registry_does_not_import_the_seam():
    """The CLI reads names and defaults when it starts: base.py's imports would cost every command."""
    import subprocess
    import sys

    code = "import sys, launcher.cli; print('launcher.backends.base' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"


@pytest.mark.parametrize("target", ["no_such_module:K8s", "json:NoSuchClass", "antigravity_raises:K8s"])
def test_a_backend_that_cannot_load_spoils_no_other_backends_lookup(target, monkeypatch, tmp_path, capsys):
    """One broken third-party backend (missing module, wrong class, a module that raises while it
    imports) is skipped with one warning: `status`, `cancel` and `logs` of local and Slurm jobs work."""
    (tmp_path / "antigravity_raises.py").write_text("raise RuntimeError('half installed')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(backends, "_warned_unloadable", set())
    monkeypatch.setenv("JAXLAUNCH_BACKENDS", f"k8s={target}")
    assert backends.claimant("12345").name == "slurm"  # status/cancel/logs 12345 reach Slurm
    run = RunDirectory.create(JobSpec(name="x", entrypoint="m:f"), tmp_path / "run")
    assert backends.find_job(str(run.path)).backend == "local"
    assert [b.name for b in backends.all_backends()] == ["local", "slurm"]
    assert "Slurm job id" in backends.id_words()
    with pytest.raises(UsageError, match="is neither"):  # a folder that is no run: the usual answer, not k8s's
        backends.find_job(str(tmp_path / "nothing-here"))
    warned = capsys.readouterr().err
    assert warned.count("backend 'k8s'") == 1 and "cannot be loaded" in warned and "(skipped)" in warned, warned
    with pytest.raises(UsageError, match=r"backend 'k8s' .* cannot be loaded"):  # asked for by name: named
        backends.get_backend("k8s")
