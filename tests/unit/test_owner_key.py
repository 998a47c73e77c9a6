"""The files a run directory holds that get unpickled (a function job's call.pkl, a result.pkl)
are signed with the owner's key and refused unsigned (issue 30, item 3): someone who can write
into the run directory must not be able to run code as the job's owner."""

import json
import os
import pickle
import stat

import pytest

from launcher import owner_key
from launcher.rundir import RunDirectory
from launcher.environment import OWNER_KEY_ENV


@pytest.fixture(autouse=True)
def own_home(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXLAUNCH_HOME", str(tmp_path / "home"))
    monkeypatch.delenv(OWNER_KEY_ENV, raising=False)


class Planted:
    """A pickle that runs code when it is loaded: it writes a file, as an attacker's would do worse."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_the_key_is_made_once_readable_by_its_owner_only(tmp_path):
    key = owner_key.owner_key()
    path = tmp_path / "home" / "key"
    assert owner_key.owner_key() == key and len(bytes.fromhex(key)) == 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert owner_key.signed_by_owner(b"data", owner_key.sign(b"data"))
    for wrong in (owner_key.sign(b"other"), "", None, 7, "\ud800", "00" * 32):
        assert not owner_key.signed_by_owner(b"data", wrong)


def test_the_ranks_use_the_key_the_supervisor_gives_them(monkeypatch):
    mine = owner_key.owner_key()
    monkeypatch.setenv(OWNER_KEY_ENV, "11" * 32)
    assert owner_key.sign(b"x") != owner_key.sign(b"x", mine)


def test_a_swapped_call_pkl_is_refused_before_it_is_unpickled(tmp_path):
    """Shown end to end before: another user swapped call.pkl in a run directory and ran code as
    the job's owner on every rank."""
    from launcher.executor import function_files
    from launcher.rank.function_job import UntrustedCallError, load_call

    run_dir = tmp_path / "run"
    for name, data in function_files(max, (1, 2), {}).items():
        (run_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / name).write_bytes(data)
    assert load_call(run_dir) == (max, (1, 2), {})  # the owner's own call loads

    pwned = tmp_path / "PWNED"
    (run_dir / "function" / "call.pkl").write_bytes(pickle.dumps(Planted(pwned)))
    with pytest.raises(UntrustedCallError, match="not signed with the key of the user who runs this job"):
        load_call(run_dir)
    assert not pwned.exists()

    record = json.loads((run_dir / "function" / "call.json").read_text())
    record["signature"] = owner_key.sign(b"another payload")
    (run_dir / "function" / "call.json").write_text(json.dumps(record))
    with pytest.raises(UntrustedCallError):
        load_call(run_dir)
    assert not pwned.exists()


def test_a_planted_sys_path_in_call_json_is_refused_before_any_import(tmp_path, monkeypatch):
    """Issue 44, item 13 (reproduced): call.json's sys_path decides where a function pickled by
    reference is imported from, and was not signed: pointing it at another folder with a module of
    the same name ran that module's import-time code as the job's owner."""
    import sys

    from launcher.executor import function_files
    from launcher.rank.function_job import UntrustedCallError, load_call

    owners, theirs = tmp_path / "owner", tmp_path / "planted"
    for folder, body in ((owners, "def work(ctx):\n    return 'mine'\n"),
                         (theirs, "open(__file__ + '.RAN', 'w').close()\ndef work(ctx):\n    return 'theirs'\n")):
        folder.mkdir()
        (folder / "helpers_for_sys_path_test.py").write_text(body)
    monkeypatch.syspath_prepend(str(owners))
    import helpers_for_sys_path_test

    run_dir = tmp_path / "run"
    for name, data in function_files(helpers_for_sys_path_test.work, (), {}).items():
        (run_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / name).write_bytes(data)
    del sys.modules["helpers_for_sys_path_test"]
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(owners)])
    record = json.loads((run_dir / "function" / "call.json").read_text())
    record["sys_path"] = [str(theirs)]  # only call.json edited
    (run_dir / "function" / "call.json").write_text(json.dumps(record))
    with pytest.raises(UntrustedCallError, match="refusing to unpickle or import anything"):
        load_call(run_dir)
    assert str(theirs) not in sys.path and "helpers_for_sys_path_test" not in sys.modules
    assert not (theirs / "helpers_for_sys_path_test.py.RAN").exists()


def test_a_result_pkl_not_signed_by_its_owner_is_not_unpickled(tmp_path):
    from launcher import load_result
    from launcher.rundir.results import UntrustedResultError, write_result

    run = RunDirectory(tmp_path / "run")
    run.path.mkdir()
    value = {"fn": Planted.__name__, "odd": {1, 2}}  # a set: JSON cannot hold it, result.pkl keeps it
    write_result(run, value)
    assert load_result(run.path) == value

    pwned = tmp_path / "PWNED"
    (run.path / "result.pkl").write_bytes(pickle.dumps(Planted(pwned)))
    with pytest.raises(UntrustedResultError, match="not signed with your key"):
        load_result(run.path)
    (run.path / "result.pkl.sig").unlink()
    with pytest.raises(UntrustedResultError):
        load_result(run.path)
    assert not pwned.exists()


# --- the run directory is private ---------------------------------------------------------------

def _spec():
    from launcher.spec import JobSpec

    return JobSpec(name="private", entrypoint="job.py:main")


def test_a_run_directory_is_made_for_its_owner_alone(tmp_path, monkeypatch):
    """Files were 644 and folders 755: any user read results, checkpoints, logs, pickled arguments
    and the uncommitted git.diff."""
    monkeypatch.delenv("JAXLAUNCH_SHARE_RUNS", raising=False)
    run = RunDirectory.create(_spec(), tmp_path / "runs" / "one")
    assert stat.S_IMODE(run.path.stat().st_mode) == 0o700
    monkeypatch.setenv("JAXLAUNCH_SHARE_RUNS", "group")  # for teams: the group reads, nobody else writes
    run = RunDirectory.create(_spec(), tmp_path / "runs" / "two")
    assert stat.S_IMODE(run.path.stat().st_mode) == 0o750


def test_an_empty_folder_of_ours_is_taken_and_made_private(tmp_path, monkeypatch):
    monkeypatch.delenv("JAXLAUNCH_SHARE_RUNS", raising=False)
    folder = tmp_path / "mine"
    folder.mkdir(mode=0o755)
    RunDirectory.create(_spec(), folder)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


@pytest.mark.skipif(os.geteuid() != 0, reason="making a folder of another user needs root")
def test_a_run_directory_another_user_made_first_is_refused(tmp_path):
    """RunDirectory.create took an existing empty folder another user made: they could then swap
    call.pkl in it (shown end to end)."""
    from launcher.errors import UsageError

    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, 65534, 65534)
    with pytest.raises(UsageError, match="belongs to another user"):
        RunDirectory.create(_spec(), theirs)
    assert list(theirs.iterdir()) == []


def test_a_folder_others_can_write_is_refused(tmp_path):
    from launcher.errors import UsageError

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(UsageError, match="can be written by other users"):
        RunDirectory.create(_spec(), shared)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(UsageError, match="not a folder"):
        RunDirectory.create(_spec(), link)
