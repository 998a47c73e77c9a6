"""ctx.checkpoints in one process: round trips keep structure, types, dtypes, values and
shardings; `like=` gives each array like's sharding; `keep` prunes; a kill -9 at any moment of a
save leaves the previous checkpoint whole, also when the same step is saved again; every file and
folder is fsynced; the on-disk format is the documented one. Ranks played by threads (ThreadComm)
check who writes and that an error on any rank raises on every rank (tests/mpi/ does it under mpirun)."""

import errno
import json
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import namedtuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from conftest import ROOT
from launcher.rank.checkpoints import CheckpointError, Checkpoints, load_checkpoint

# Most tests here are about what lands on disk, so they save synchronously; the asynchronous
# path (the default in jobs) has its own tests below and in tests/e2e/test_checkpoint_layouts.py.
def Synchronous(*args, **kwargs):
    return Checkpoints(*args, asynchronous=False, **kwargs)


Pair = namedtuple("Pair", "left right")


def assert_same(a, b):
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        if isinstance(x, jax.Array):
            assert isinstance(y, jax.Array) and x.dtype == y.dtype and x.sharding == y.sharding
        else:
            assert type(x) is type(y)
        assert np.array_equal(np.asarray(x), np.asarray(y))


def test_round_trip_of_every_kind_of_leaf(tmp_path):
    devices = jax.local_devices()
    mesh = Mesh(np.array(devices), ("devices",))
    state = {
        "numpy": np.arange(12, dtype=np.int16).reshape(3, 4), "scalar": np.float32(2.5),
        "python": [1, 2.0, True, None, (3, "x" == "y")],
        "single": jnp.arange(5.0), "bf16": jnp.ones(4, jnp.bfloat16),
        "pmap_rows": jax.pmap(lambda v: v * 2)(jnp.ones((len(devices), 3))),
        "replicated": jax.device_put(jnp.arange(6.0), NamedSharding(mesh, PartitionSpec())),
    }
    if len(devices) > 1:
        state["sharded"] = jax.device_put(jnp.arange(8.0).reshape(len(devices), -1),
                                          NamedSharding(mesh, PartitionSpec("devices")))
    checkpoints = Synchronous(tmp_path, devices=devices, mesh=mesh)
    checkpoints.save(7, state, metadata={"lr": 0.1, "note": "first"})
    step, restored = checkpoints.restore()
    assert step == 7
    assert_same(restored, state)
    assert type(restored["python"][4][1]) is bool


def test_restore_is_none_without_checkpoints_and_keep_prunes_the_oldest(tmp_path):
    checkpoints = Synchronous(tmp_path / "c", keep=2)
    assert checkpoints.restore() is None and checkpoints.latest_step() is None
    for step in (1, 2, 3, 3):  # step 3 twice: a resumed run saves the same step again
        checkpoints.save(step, {"x": np.full(3, step)})
    assert checkpoints.steps() == [2, 3]
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["step-00000002", "step-00000003"]
    step, state = checkpoints.restore()
    assert step == 3 and np.array_equal(state["x"], np.full(3, 3))


def test_namedtuple_trees_need_like(tmp_path):
    checkpoints = Synchronous(tmp_path)
    state = Pair(np.ones(2), {"b": jnp.zeros(3)})
    checkpoints.save(1, state)
    with pytest.raises(CheckpointError, match=r"pass restore\(like=initial_state\)"):
        checkpoints.restore()
    step, restored = checkpoints.restore(like=state)
    assert_same(restored, state)
    with pytest.raises(CheckpointError, match="does not match the checkpoint"):
        checkpoints.restore(like={"other": np.ones(2)})


def test_a_damaged_newest_checkpoint_falls_back_to_the_previous(tmp_path):
    checkpoints = Synchronous(tmp_path, keep=3)
    checkpoints.save(1, {"x": np.ones(2)})
    checkpoints.save(2, {"x": np.ones(2) * 2})
    (tmp_path / "step-00000002" / "manifest.json").write_text("{not json")
    step, state = checkpoints.restore()
    assert step == 1 and np.array_equal(state["x"], np.ones(2))


def test_load_outside_jaxlaunch_and_plain_numpy(tmp_path):
    Synchronous(tmp_path).save(5, {"w": np.arange(3.0), "n": 4}, metadata={"epoch": 2})
    step, state = load_checkpoint(tmp_path)
    assert step == 5 and state["n"] == 4
    # the documented way without jaxlaunch at all: np.load + the manifest
    import json

    folder = tmp_path / "step-00000005"
    by_path = read_with_numpy_alone(folder)
    assert np.array_equal(by_path["['w']"], np.arange(3.0)) and by_path["['n']"] == 4
    assert json.loads((folder / "manifest.json").read_text())["metadata"] == {"epoch": 2}


def read_with_numpy_alone(folder):
    """The docs' recipe (docs/snippets/read_checkpoint.py, included in the page as is): every leaf
    from the manifest and the data files, with NumPy alone."""
    import runpy

    recipe = runpy.run_path(str(ROOT / "docs" / "snippets" / "read_checkpoint.py"))
    return recipe["read_with_numpy_alone"](folder)


def test_bad_metadata_or_leaves_are_refused_before_anything_is_written(tmp_path):
    checkpoints = Synchronous(tmp_path)
    with pytest.raises(CheckpointError, match="metadata must be JSON"):
        checkpoints.save(1, {"x": np.ones(1)}, metadata={"f": object()})
    with pytest.raises(CheckpointError, match="an array of Python objects"):
        checkpoints.save(1, {"x": np.array([object()])})
    assert checkpoints.steps() == [] and list(tmp_path.iterdir()) == []


WRITER = textwrap.dedent("""
    import sys
    import numpy as np
    from launcher.rank.checkpoints import Checkpoints

    checkpoints = Checkpoints(sys.argv[1], keep=2, asynchronous=sys.argv[2] == "async")
    latest = checkpoints.restore()
    step = 0 if latest is None else latest[0] + 1
    while True:
        checkpoints.save(step, {"big": np.full(1 << 20, step, dtype=np.float32),
                                "rows": [np.full((64, 64), step + i) for i in range(8)], "step": step})
        print(step, flush=True)  # async: the write goes on while the next state is made
        step += 1
""")


KILLS_AT_LEAST, WRITER_SAVES_WITHIN = 10, 300


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_kill_9_at_any_moment_of_a_save_leaves_a_whole_checkpoint(tmp_path, mode):
    """Each save writes ~4.1 MB of many leaves; SIGKILL lands at random points of it (asynchronous:
    mostly while the background thread writes, fsyncs or renames)."""
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    folder = tmp_path / "checkpoints"
    rng = random.Random(1234)
    latest, kills = -1, 0
    # At least KILLS_AT_LEAST kills, however long a fresh writer (Python + NumPy) takes to start on a
    # loaded machine; more while the window lasts. Only a writer that saves nothing is a failure.
    started = time.monotonic()
    while kills < KILLS_AT_LEAST or (kills < 20 and time.monotonic() - started < 45):
        writer = subprocess.Popen([sys.executable, str(script), str(folder), mode], stdout=subprocess.PIPE, text=True)
        if not select.select([writer.stdout], [], [], WRITER_SAVES_WITHIN)[0]:
            writer.kill()
            pytest.fail(f"kill {kills + 1}: the writer saved nothing in {WRITER_SAVES_WITHIN} s")
        writer.stdout.readline()  # one save done: from now on it is always in the middle of one
        time.sleep(rng.uniform(0, 0.3))
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait()
        kills += 1
        step, state = Synchronous(folder).restore()
        assert step >= latest, "the checkpoint went backwards"
        latest = step
        assert state["step"] == step
        assert np.array_equal(state["big"], np.full(1 << 20, step, dtype=np.float32))
        for i, rows in enumerate(state["rows"]):
            assert np.array_equal(rows, np.full((64, 64), step + i))
    leftovers = [p.name for p in folder.iterdir() if p.name.startswith(".")]
    assert len(leftovers) <= 1  # at most the temp folder of the last killed save (cleaned at the next)


# --- saving a step that exists: the old folder stays whole until the new one is in ---------

KILLED_BETWEEN_THE_RENAMES = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    from launcher.rank.checkpoints import Checkpoints

    rename = os.rename
    def rename_or_die(src, dst):  # SIGKILL right at the rename of the new folder into place
        if os.path.basename(src).startswith(".tmp-"):
            os.kill(os.getpid(), signal.SIGKILL)
        rename(src, dst)
    os.rename = rename_or_die
    checkpoints = Checkpoints(sys.argv[1])  # asynchronous: the kill lands in the writer thread
    checkpoints.save(3, {"x": np.full(3, 33.0)})
    checkpoints.wait()
""")


def fail_the_rename_into_place(monkeypatch):
    rename = os.rename

    def rename_or_fail(src, dst):
        if os.path.basename(src).startswith(".tmp-"):
            raise OSError(errno.EIO, "injected: the disk went away", str(src))
        rename(src, dst)

    monkeypatch.setattr(os, "rename", rename_or_fail)


@pytest.mark.parametrize("how", ["kill -9", "the rename fails"])
def test_a_save_of_an_existing_step_stopped_between_its_two_renames_leaves_the_old_one_whole(tmp_path, monkeypatch,
                                                                                                how):
    """jobs/examples/train_data_parallel.py saves the same step twice (periodic, then at should_stop): the old
    step folder is renamed aside (.old-), then the new one in; a stop between the two must not lose it."""
    folder = tmp_path / "checkpoints"
    Synchronous(folder).save(2, {"x": np.full(3, 2.0)})
    Synchronous(folder).save(3, {"x": np.full(3, 3.0)})
    if how == "kill -9":
        script = tmp_path / "killed.py"
        script.write_text(KILLED_BETWEEN_THE_RENAMES)
        died = subprocess.run([sys.executable, str(script), str(folder)], capture_output=True, text=True, timeout=60)
        assert died.returncode == -signal.SIGKILL, died.stderr
    else:
        with monkeypatch.context() as patch:
            fail_the_rename_into_place(patch)
            with pytest.raises(CheckpointError, match="injected: the disk went away"):
                Synchronous(folder).save(3, {"x": np.full(3, 33.0)})
    assert not (folder / "step-00000003").exists()  # stopped between the two renames
    assert [p.name for p in folder.glob(".old-step-00000003-*")]

    step, state = Synchronous(folder).restore()  # a fresh object, as a restarted job has
    assert step == 3 and np.array_equal(state["x"], np.full(3, 3.0))
    assert load_checkpoint(folder)[0] == 3

    # A save that fails (after the leftovers are cleaned) must not take the only copy of step 3 with it.
    with pytest.raises(CheckpointError, match="an array of Python objects"):
        Synchronous(folder).save(4, {"x": np.array([object()])})
    step, state = Synchronous(folder).restore()
    assert step == 3 and np.array_equal(state["x"], np.full(3, 3.0))

    # The following saves work, the new step 3 wins over the old copy, and the leftovers go.
    checkpoints = Synchronous(folder, keep=2)
    checkpoints.save(3, {"x": np.full(3, 33.0)})
    step, state = Synchronous(folder).restore()
    assert step == 3 and np.array_equal(state["x"], np.full(3, 33.0))
    checkpoints.save(4, {"x": np.full(3, 4.0)})
    assert sorted(p.name for p in folder.iterdir()) == ["step-00000003", "step-00000004"]
    step, state = Synchronous(folder).restore()
    assert step == 4 and np.array_equal(state["x"], np.full(3, 4.0))


def test_saving_an_existing_step_replaces_it_and_leaves_no_old_copy(tmp_path):
    checkpoints = Synchronous(tmp_path, keep=2)
    checkpoints.save(3, {"x": np.full(2, 1.0)}, metadata={"save": "periodic"})
    checkpoints.save(3, {"x": np.full(2, 2.0)}, metadata={"save": "should_stop"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000003"]
    step, state = Synchronous(tmp_path).restore()
    assert step == 3 and np.array_equal(state["x"], np.full(2, 2.0))
    manifest = json.loads((tmp_path / "step-00000003" / "manifest.json").read_text())
    assert manifest["metadata"] == {"save": "should_stop"}


def test_leftovers_of_killed_writers_are_cleaned_but_an_old_copy_whose_step_is_gone_is_kept(tmp_path):
    checkpoints = Synchronous(tmp_path, keep=5)
    checkpoints.save(1, {"x": np.full(2, 1.0)})
    checkpoints.save(2, {"x": np.full(2, 2.0)})
    # what killed writers (other pids) leave: a temp folder, a trash folder, an .old- copy of a
    # step that is back (step 1), and the .old- copy of a step whose new folder never got in (step 5)
    shutil.copytree(tmp_path / "step-00000002", tmp_path / ".tmp-step-00000003-99999")
    shutil.copytree(tmp_path / "step-00000001", tmp_path / ".trash-step-00000000-99999")
    shutil.copytree(tmp_path / "step-00000001", tmp_path / ".old-step-00000001-99999")
    (tmp_path / "step-00000002").rename(tmp_path / ".old-step-00000005-99999")  # a copy of step 2's state
    manifest = json.loads((tmp_path / ".old-step-00000005-99999" / "manifest.json").read_text())
    manifest["step"] = 5
    (tmp_path / ".old-step-00000005-99999" / "manifest.json").write_text(json.dumps(manifest))
    assert Synchronous(tmp_path).restore()[0] == 5  # the .old- copy is newer than step 1

    checkpoints.save(4, {"x": np.full(2, 4.0)})
    assert sorted(p.name for p in tmp_path.iterdir()) == [".old-step-00000005-99999", "step-00000001",
                                                          "step-00000004"]
    step, state = Synchronous(tmp_path).restore()
    assert step == 5 and np.array_equal(state["x"], np.full(2, 2.0))


def test_an_old_copy_older_than_the_kept_steps_is_removed(tmp_path, monkeypatch):
    checkpoints = Synchronous(tmp_path, keep=2)
    checkpoints.save(2, {"x": np.full(1, 2.0)})
    checkpoints.save(3, {"x": np.full(1, 3.0)})
    with monkeypatch.context() as patch:
        fail_the_rename_into_place(patch)
        with pytest.raises(CheckpointError):
            checkpoints.save(3, {"x": np.full(1, 33.0)})
    for step in (4, 5, 6, 7):  # the resumed job goes on from step 3
        checkpoints.save(step, {"x": np.full(1, float(step))})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000006", "step-00000007"]


# --- fsync: a kill -9 cannot show a missing one, so the calls are checked -------------------

def record_fsyncs_and_renames(monkeypatch):
    """[("fsync", path the fd refers to) or ("rename", src, dst)] in the order they happen."""
    events = []
    fsync, rename = os.fsync, os.rename

    def recording_fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        fsync(fd)

    def recording_rename(src, dst):
        events.append(("rename", str(src), str(dst)))
        rename(src, dst)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    monkeypatch.setattr(os, "rename", recording_rename)
    return events


@pytest.mark.parametrize("per_rank", [False, True])
@pytest.mark.parametrize("again", [False, True], ids=["new step", "same step again"])
def test_every_file_and_both_folders_are_fsynced_around_the_rename(tmp_path, monkeypatch, per_rank, again):
    folder = (tmp_path / "checkpoints").resolve()
    checkpoints = Checkpoints(folder)  # asynchronous: the writer thread does all of it
    if again:
        checkpoints.save(1, {"x": np.zeros(2)}, per_rank=per_rank)
        checkpoints.wait()
    events = record_fsyncs_and_renames(monkeypatch)
    checkpoints.save(1, {"x": np.ones(2), "n": 3}, per_rank=per_rank)
    checkpoints.wait()

    temp = folder / ".tmp-step-00000001"
    final = folder / "step-00000001"
    into_place = events.index(("rename", str(temp), str(final)))
    synced = [event[1] for event in events if event[0] == "fsync"]
    arrays = temp / "process-00000.data"
    for path in (arrays, temp / "manifest.json", temp):  # the files, then their folder, before the rename
        assert str(path) in synced, f"{path} not fsynced: {events}"
        assert events.index(("fsync", str(path))) < into_place
    assert events.index(("fsync", str(temp / "manifest.json"))) < events.index(("fsync", str(temp)))
    # the checkpoints folder after the rename, so the new name itself is durable
    assert ("fsync", str(folder)) in events[into_place + 1:], f"{folder} not fsynced after the rename: {events}"
    assert Synchronous(folder).restore()[1]["n"] == 3


# --- restore(like=...): each array gets like's sharding, whatever it was saved with ---------

def test_restore_like_gives_each_array_the_sharding_of_like_not_the_saved_one(tmp_path):
    devices = jax.local_devices()
    if len(devices) < 2:
        pytest.skip("needs 2 local devices (XLA_FLAGS=--xla_force_host_platform_device_count=2)")
    devices = devices[:2]
    mesh = Mesh(np.array(devices), ("devices",))
    values = {"rows": np.arange(8.0).reshape(2, 4), "columns": np.arange(12.0).reshape(3, 4),
              "replicated": np.arange(5.0), "pmap": np.arange(6.0).reshape(2, 3)}
    spread = {"rows": jax.device_put(values["rows"], NamedSharding(mesh, PartitionSpec("devices"))),
              "columns": jax.device_put(values["columns"], NamedSharding(mesh, PartitionSpec(None, "devices"))),
              "replicated": jax.device_put(values["replicated"], NamedSharding(mesh, PartitionSpec())),
              "pmap": jax.pmap(lambda v: v, devices=devices)(values["pmap"])}
    on_device_0 = {key: jax.device_put(value, devices[0]) for key, value in values.items()}
    on_device_1 = {key: jax.device_put(value, devices[1]) for key, value in values.items()}

    for name, saved, like in (("single saved, spread like", on_device_0, spread),
                              ("spread saved, single like", spread, on_device_1),
                              ("device 1 saved, device 0 like", on_device_1, on_device_0)):
        checkpoints = Synchronous(tmp_path / name.replace(" ", "-").replace(",", ""), devices=devices, mesh=mesh)
        checkpoints.save(1, saved)
        step, restored = checkpoints.restore(like=like)
        for key, value in values.items():
            assert restored[key].sharding != saved[key].sharding, (name, key)  # else the test could not fail
            assert restored[key].sharding == like[key].sharding, (name, key)
            assert np.array_equal(np.asarray(restored[key]), value), (name, key)
        _, plain = checkpoints.restore()  # and without like=, as they were saved
        for key in values:
            assert plain[key].sharding == saved[key].sharding, (name, key)


# --- several ranks, played by threads of this process ----------------------------------------

class ThreadComm:
    """The part of an mpi4py communicator that Checkpoints uses (Get_size, Get_rank, bcast, gather,
    allgather, Clone) for ranks that are threads. A clone is a communicator of its own (the
    background writer's), shared by the same clone of every rank. A rank that never arrives breaks
    the barrier instead of hanging the test."""

    def __init__(self, rank, shared):
        self.rank, self.shared = rank, shared
        self.clones = 0

    def Get_size(self):
        return len(self.shared["slots"])

    def Get_rank(self):
        return self.rank

    def Clone(self):
        self.clones += 1
        with self.shared["lock"]:
            size = self.Get_size()
            clone = self.shared["clones"].setdefault(self.clones, {
                "slots": [None] * size, "barrier": threading.Barrier(size, timeout=20),
                "lock": threading.Lock(), "clones": {}})
        return ThreadComm(self.rank, clone)

    def _exchange(self, value):
        barrier, slots = self.shared["barrier"], self.shared["slots"]
        slots[self.rank] = value
        barrier.wait()
        values = list(slots)
        barrier.wait()
        return values

    def bcast(self, value, root=0):
        return self._exchange(value)[root]

    def gather(self, value, root=0):
        values = self._exchange(value)
        return values if self.rank == root else None

    def allgather(self, value):
        return self._exchange(value)


def on_ranks(size, body):
    """body(rank, comm) on `size` threads at once; [what each returned or raised]."""
    shared = {"slots": [None] * size, "barrier": threading.Barrier(size, timeout=20), "lock": threading.Lock(),
              "clones": {}}
    outcomes = [None] * size

    def run(rank):
        try:
            outcomes[rank] = body(rank, ThreadComm(rank, shared))
        except BaseException as exc:  # noqa: BLE001
            outcomes[rank] = exc
            shared["barrier"].abort()
            for clone in shared["clones"].values():
                clone["barrier"].abort()

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads), "a rank hangs"
    return outcomes


def files_of_each_leaf(folder):
    manifest = json.loads((folder / "manifest.json").read_text())
    return {leaf["path"]: sorted(piece["file"] for piece in leaf["pieces"]) for leaf in manifest["leaves"]}


def test_replicated_state_on_two_ranks_is_written_once_and_spread_over_both(tmp_path):
    """mpi4jax jobs hold the same state in every process: each rank writes a share of it (a big leaf
    cut in two), not rank 0 all of it, and every rank restores the whole."""
    state = {"big": np.arange(1 << 19, dtype=np.float32), "small": np.ones(3), "n": 5}  # big: 2 MiB

    def body(rank, comm):
        checkpoints = Checkpoints(tmp_path, rank=rank, comm=comm)
        checkpoints.save(5, state)
        return checkpoints.restore()

    for step, restored in on_ranks(2, body):
        assert step == 5 and np.array_equal(restored["big"], state["big"]) and restored["n"] == 5
    folder = tmp_path / "step-00000005"
    assert sorted(p.name for p in folder.iterdir()) == ["manifest.json", "process-00000.data", "process-00001.data"]
    files = files_of_each_leaf(folder)
    assert files["['big']"] == ["process-00000.data", "process-00001.data"]  # half each
    assert len(files["['small']"]) == len(files["['n']"]) == 1  # small leaves: once, by one rank
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["per_rank"] is False and manifest["processes"] == 2
    assert (folder / "process-00000.data").stat().st_size < (1 << 21)  # nobody wrote it all


def test_a_state_that_differs_between_ranks_is_refused_on_every_rank_unless_per_rank(tmp_path):
    def body(rank, comm):
        checkpoints = Checkpoints(tmp_path, rank=rank, comm=comm)
        try:
            checkpoints.save(1, {"x": np.zeros(2 + rank)})
            checkpoints.wait()
        except CheckpointError as exc:
            return exc
        return "saved"

    for outcome in on_ranks(2, body):
        assert isinstance(outcome, CheckpointError) and "per_rank=True" in str(outcome), outcome
    assert list(tmp_path.iterdir()) == []


def test_per_rank_save_on_two_ranks_writes_one_file_per_rank(tmp_path):
    def body(rank, comm):
        checkpoints = Checkpoints(tmp_path, rank=rank, comm=comm)
        checkpoints.save(6, {"mine": np.full(2 + rank, rank), "rank": rank}, per_rank=True)
        return checkpoints.restore()

    outcomes = on_ranks(2, body)
    for rank, (step, state) in enumerate(outcomes):
        assert step == 6 and np.array_equal(state["mine"], np.full(2 + rank, rank)) and state["rank"] == rank
    folder = tmp_path / "step-00000006"
    assert sorted(p.name for p in folder.iterdir()) == ["manifest.json", "process-00000.data", "process-00001.data"]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["per_rank"] is True and manifest["processes"] == 2 and len(manifest["ranks"]) == 2
    [piece] = manifest["ranks"][1]["leaves"][0]["pieces"]
    assert piece["file"] == "process-00001.data" and piece["index"] == [[0, 3]]
    # without MPI (a notebook), any rank's part by its number
    step, state = Synchronous(tmp_path, rank=1).restore()
    assert step == 6 and np.array_equal(state["mine"], np.full(3, 1)) and state["rank"] == 1


def test_a_failed_per_rank_write_on_the_last_rank_raises_on_every_rank_and_saves_nothing(tmp_path):
    def body(rank, comm):
        checkpoints = Synchronous(tmp_path, rank=rank, comm=comm)
        checkpoints.save(1, {"x": np.zeros(1)}, per_rank=True)
        state = {"x": np.array([object()]) if rank == 1 else np.zeros(1)}
        try:
            checkpoints.save(2, state, per_rank=True)
        except CheckpointError as exc:
            return exc
        return "saved"

    outcomes = on_ranks(2, body)
    for outcome in outcomes:
        assert isinstance(outcome, CheckpointError), outcome
        assert "checkpoint step 2" in str(outcome) and "rank 1: ValueError" in str(outcome)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000001"]  # no step 2, no temp folder


def test_a_failed_write_on_rank_0_raises_on_every_rank(tmp_path):
    (tmp_path / "file").write_text("not a folder")

    def body(rank, comm):
        checkpoints = Checkpoints(tmp_path / "file" / "checkpoints", rank=rank, comm=comm)
        checkpoints.save(1, {"x": np.zeros(1)})  # returns: the write fails in the background ...
        try:
            checkpoints.wait()                   # ... and is raised here, on every rank
        except CheckpointError as exc:
            return exc
        return "saved"

    for outcome in on_ranks(2, body):
        assert isinstance(outcome, CheckpointError) and "cannot create" in str(outcome), outcome


@pytest.mark.parametrize("failing_rank", [0, 1])
def test_a_background_write_failing_on_one_rank_raises_the_same_error_on_every_rank(tmp_path, monkeypatch,
                                                                                     failing_rank):
    from launcher.rank.checkpoints import storage

    write = storage.write_data_file

    def failing_on_one_rank(path, arrays):
        if path.name == f"process-{failing_rank:05d}.data":
            raise OSError(errno.ENOSPC, "injected: no space left on device", str(path))
        return write(path, arrays)

    monkeypatch.setattr(storage, "write_data_file", failing_on_one_rank)

    def body(rank, comm):
        checkpoints = Checkpoints(tmp_path, rank=rank, comm=comm)
        checkpoints.save(1, {"big": np.ones(1 << 19, np.float32), "n": 1})  # both ranks write a half
        try:
            checkpoints.save(2, {"big": np.ones(1 << 19, np.float32), "n": 2})  # raises step 1's failure
        except CheckpointError as exc:
            return str(exc)
        return "saved"

    outcomes = on_ranks(2, body)
    assert outcomes[0] == outcomes[1], outcomes
    assert "checkpoint step 1" in outcomes[0] and f"rank {failing_rank}: OSError" in outcomes[0]
    assert "no space left" in outcomes[0]
    assert list(tmp_path.iterdir()) == []  # no step folder, no temp folder


def test_a_restore_that_fails_on_one_rank_raises_on_every_rank(tmp_path):
    def body(rank, comm):
        checkpoints = Checkpoints(tmp_path, rank=rank, comm=comm)
        checkpoints.save(4, {"mine": np.full(2, rank)}, per_rank=True)
        checkpoints.wait()
        try:
            checkpoints.restore(like={"mine": np.zeros(2), "extra": 1})  # a like= that does not fit
        except CheckpointError as exc:
            return exc
        return "restored"

    for outcome in on_ranks(2, body):
        assert isinstance(outcome, CheckpointError), outcome
        assert "cannot restore" in str(outcome) and "like= does not match" in str(outcome)


def test_a_damaged_data_file_on_one_rank_falls_back_to_the_previous_checkpoint_on_every_rank(tmp_path):
    def body(rank, comm):
        checkpoints = Checkpoints(tmp_path, rank=rank, comm=comm)
        checkpoints.save(3, {"mine": np.full(2, 3 + rank)}, per_rank=True)
        checkpoints.save(4, {"mine": np.full(2, 4 + rank)}, per_rank=True)
        checkpoints.wait()
        if rank == 0:
            (tmp_path / "step-00000004" / "process-00001.data").write_bytes(b"")  # cut short
        comm.bcast(None)
        return checkpoints.restore()

    for rank, (step, state) in enumerate(on_ranks(2, body)):
        assert step == 3 and np.array_equal(state["mine"], np.full(2, 3 + rank))


def test_failing_input_on_one_rank_raises_at_save_on_every_rank_and_writes_nothing(tmp_path):
    """Bad input is agreed in the caller's thread: no rank goes on to the background write."""
    def body(rank, comm):
        checkpoints = Checkpoints(tmp_path, rank=rank, comm=comm)
        outcomes = []
        for step, per_rank in ((1, False), (2, True)):
            state = {"x": np.array([object()]) if rank == 0 else np.zeros(1)}
            try:
                checkpoints.save(step, state, per_rank=per_rank)
                outcomes.append("saved")
            except CheckpointError as exc:
                outcomes.append(exc)
        return outcomes

    for outcomes in on_ranks(2, body):
        for outcome in outcomes:
            assert isinstance(outcome, CheckpointError) and "not saved: rank 0: ValueError" in str(outcome), outcome
    assert list(tmp_path.iterdir()) == []


# --- the format, readable without jaxlaunch -------------------------------------------------

def test_manifest_fields_and_bfloat16_bits_are_the_documented_format(tmp_path):
    import ml_dtypes

    bf16 = jnp.array([1.5, -2.25, 3.0e38], jnp.bfloat16)
    state = {"bf16": bf16, "w": np.arange(3.0)}
    before = time.time()
    checkpoints = Checkpoints(tmp_path)
    folder = checkpoints.save(42, state, metadata={"lr": 0.5})
    assert checkpoints.wait() == folder
    after = time.time()
    assert folder == tmp_path / "step-00000042" and folder.is_dir()
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["format"] == "jaxlaunch-checkpoint" and manifest["version"] == 2
    assert manifest["step"] == 42 and manifest["metadata"] == {"lr": 0.5}
    assert before <= manifest["time"] <= after
    assert manifest["per_rank"] is False and manifest["processes"] == 1
    leaves = {leaf["path"]: leaf for leaf in manifest["leaves"]}
    assert leaves["['bf16']"]["dtype"] == "bfloat16" and leaves["['bf16']"]["shape"] == [3]
    assert leaves["['bf16']"]["kind"] == "jax" and leaves["['bf16']"]["sharding"]["type"] == "single"
    assert leaves["['w']"] == {"kind": "numpy", "path": "['w']", "dtype": "float64", "shape": [3],
                               "pieces": [{"file": "process-00000.data", "offset": 64, "index": [[0, 3]]}]}  # after bf16
    [piece] = leaves["['bf16']"]["pieces"]
    assert piece["offset"] % 64 == 0 and piece["index"] == [[0, 3]]
    bits = np.fromfile(folder / piece["file"], np.uint16, count=3, offset=piece["offset"])  # the raw bits
    assert np.array_equal(bits, np.asarray(bf16).view(np.uint16))
    assert np.array_equal(bits.view(ml_dtypes.bfloat16), np.asarray(bf16))
    assert np.array_equal(read_with_numpy_alone(folder)["['w']"], np.arange(3.0))


def test_a_version_1_checkpoint_still_restores(tmp_path):
    """What jaxlaunch wrote before format 2 (one arrays.npz, bfloat16 as its bits): a job resumed
    after an upgrade must find its checkpoint."""
    import io

    folder = tmp_path / "step-00000007"
    folder.mkdir()
    bf16 = np.array([1.5, -2.0], jnp.bfloat16)
    buffer = io.BytesIO()
    np.savez(buffer, leaf_0=np.arange(4.0), leaf_1=bf16.view(np.uint16), leaf_2=np.asarray(3))
    (folder / "arrays.npz").write_bytes(buffer.getvalue())
    leaves = [{"kind": "numpy", "path": "['a']", "dtype": "float64", "shape": [4], "key": "leaf_0"},
              {"kind": "jax", "path": "['b']", "dtype": "bfloat16", "shape": [2], "key": "leaf_1",
               "sharding": {"type": "single", "device": 0}},
              {"kind": "python", "python_type": "int", "path": "['n']", "dtype": "int64", "shape": [], "key": "leaf_2"}]
    structure = {"dict": [["a", {"leaf": 0}], ["b", {"leaf": 1}], ["n", {"leaf": 2}]]}
    (folder / "manifest.json").write_text(json.dumps({
        "format": "jaxlaunch-checkpoint", "version": 1, "step": 7, "time": 0, "metadata": {}, "per_rank": False,
        "num_ranks": 1, "structure": structure, "leaves": leaves}))
    step, state = Checkpoints(tmp_path).restore()
    assert step == 7 and np.array_equal(state["a"], np.arange(4.0)) and state["n"] == 3 and type(state["n"]) is int
    assert isinstance(state["b"], jax.Array) and state["b"].dtype == jnp.bfloat16
    assert np.array_equal(np.asarray(state["b"]), bf16)


def test_scalars_keep_their_exact_type_numpy_float64_included(tmp_path):
    """np.float64 is a subclass of Python float: it must still come back as np.float64."""
    state = {"f64": np.float64(0.1), "i64": np.int64(-7), "b": np.bool_(True), "f16": np.float16(1.5),
             "int": 2 ** 40, "float": 0.1, "bool": False}
    Synchronous(tmp_path).save(1, state)
    _, restored = Synchronous(tmp_path).restore()
    for key, value in state.items():
        assert type(restored[key]) is type(value), key
        assert restored[key] == value, key


def test_load_checkpoint_takes_a_step_folder_or_the_checkpoints_folder(tmp_path):
    checkpoints = Synchronous(tmp_path, keep=5)
    checkpoints.save(1, Pair(np.ones(2), {"b": 1}))
    checkpoints.save(2, Pair(np.ones(2) * 2, {"b": 2}))
    checkpoints.save(3, {"mine": np.full(2, 3)}, per_rank=True)
    like = Pair(np.zeros(2), {"b": 0})
    step, state = load_checkpoint(str(tmp_path / "step-00000001"), like=like)  # an older one, by its folder
    assert step == 1 and type(state) is Pair and np.array_equal(state.left, np.ones(2)) and state.right == {"b": 1}
    step, state = load_checkpoint(tmp_path / "step-00000003")  # a per_rank one: rank 0's part
    assert step == 3 and np.array_equal(state["mine"], np.full(2, 3))
    shutil.rmtree(tmp_path / "step-00000003")
    step, state = load_checkpoint(tmp_path, like=like)  # the newest
    assert step == 2 and type(state) is Pair and np.array_equal(state.left, np.ones(2) * 2)
    with pytest.raises(CheckpointError, match="no checkpoint in"):
        load_checkpoint(tmp_path / "empty")


def test_steps_are_the_complete_folders_only_and_latest_is_the_newest(tmp_path):
    checkpoints = Synchronous(tmp_path, keep=3)
    for step in (1, 2, 3):
        checkpoints.save(step, {"x": np.full(1, step)})
    (tmp_path / "step-00000009").mkdir()  # no manifest: not a checkpoint
    shutil.copytree(tmp_path / "step-00000001", tmp_path / "step-latest")  # not a step number
    assert checkpoints.steps() == [1, 2, 3] and checkpoints.latest_step() == 3
    assert Synchronous(tmp_path).restore()[0] == 3


@pytest.mark.parametrize("manifest", ["{not json", '{"format": "orbax", "step": 9}', ""])
def test_a_newest_manifest_that_is_not_a_jaxlaunch_one_falls_back_to_the_previous(tmp_path, manifest):
    checkpoints = Synchronous(tmp_path, keep=3)
    checkpoints.save(1, {"x": np.ones(2)})
    checkpoints.save(2, {"x": np.ones(2) * 2})
    (tmp_path / "step-00000002" / "manifest.json").write_text(manifest)
    step, state = checkpoints.restore()
    assert step == 1 and np.array_equal(state["x"], np.ones(2))


def test_like_with_the_same_number_of_leaves_but_other_names_is_refused(tmp_path):
    checkpoints = Synchronous(tmp_path)
    checkpoints.save(1, {"a": np.ones(2), "b": np.zeros(2)})
    with pytest.raises(CheckpointError, match=r"does not match the checkpoint: \"\['c'\]\" vs saved \"\['b'\]\""):
        checkpoints.restore(like={"a": np.ones(2), "c": np.zeros(2)})
    with pytest.raises(CheckpointError, match="does not match"):
        checkpoints.restore(like=[np.ones(2), np.zeros(2)])


def test_dicts_in_any_key_order_come_back_under_their_own_keys(tmp_path):
    state = {"zeta": np.full(2, 1.0), "alpha": np.full(2, 2.0), "mid": {"y": 3, "b": 4}}
    checkpoints = Synchronous(tmp_path)
    checkpoints.save(1, state)
    for like in (None, {"mid": {"b": 0, "y": 0}, "alpha": np.zeros(2), "zeta": np.zeros(2)}):
        _, restored = checkpoints.restore(like=like)
        assert np.array_equal(restored["zeta"], np.full(2, 1.0)) and np.array_equal(restored["alpha"], np.full(2, 2.0))
        assert restored["mid"] == {"y": 3, "b": 4}


def test_named_shardings_come_back_with_their_mesh_device_order_and_spec(tmp_path):
    devices = jax.local_devices()
    if len(devices) < 2:
        pytest.skip("needs 2 local devices (XLA_FLAGS=--xla_force_host_platform_device_count=2)")
    devices = devices[:2]
    reversed_mesh = Mesh(np.array(devices[::-1]), ("devices",))
    grid = Mesh(np.array(devices).reshape(1, 2), ("a", "b"))
    state = {"reversed": jax.device_put(np.arange(4.0), NamedSharding(reversed_mesh, PartitionSpec("devices"))),
             "both_axes": jax.device_put(np.arange(8.0).reshape(4, 2), NamedSharding(grid, PartitionSpec(("a", "b")))),
             "on_1": jax.device_put(np.arange(3.0), devices[1])}
    checkpoints = Synchronous(tmp_path, devices=devices)
    checkpoints.save(1, state)
    _, restored = checkpoints.restore()
    assert_same(restored, state)


def test_an_array_saved_on_a_device_this_machine_lacks_comes_back_on_its_last_device(tmp_path):
    devices = jax.local_devices()
    if len(devices) < 2:
        pytest.skip("needs 2 local devices (XLA_FLAGS=--xla_force_host_platform_device_count=2)")
    Synchronous(tmp_path, devices=devices[:2]).save(1, {"x": jax.device_put(np.arange(3.0), devices[1])})
    _, restored = Synchronous(tmp_path, devices=devices[:1]).restore()  # e.g. a notebook with one device
    assert restored["x"].devices() == {devices[0]} and np.array_equal(np.asarray(restored["x"]), np.arange(3.0))


def test_save_and_restore_are_on_the_run_timeline(tmp_path, monkeypatch):
    from launcher.rundir import RunDirectory
    from launcher.environment import RUN_DIR_ENV

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    monkeypatch.setenv(RUN_DIR_ENV, str(run_dir))
    checkpoints = Checkpoints(run_dir / "checkpoints")
    checkpoints.save(12, {"x": np.arange(1000.0)})
    checkpoints.restore()  # waits for the save first
    events = [{k: v for k, v in e.items() if k != "time"} for e in RunDirectory(run_dir).read_events()]
    assert [e["event"] for e in events] == ["checkpoint", "restored"]
    assert events[0]["step"] == 12 and events[0]["bytes"] == 8000  # the array's bytes, written as they are
    assert (run_dir / "checkpoints" / "step-00000012" / "process-00000.data").stat().st_size == 8000
    assert 0 <= events[0]["blocked"] <= events[0]["seconds"]
    assert isinstance(events[1].pop("seconds"), float)  # the restore's time, for the start-up budget
    assert events[1] == {"event": "restored", "step": 12, "folder": str(run_dir / "checkpoints" / "step-00000012")}


# --- asynchronous saves -----------------------------------------------------------------------

def test_an_asynchronous_save_returns_before_the_write_and_keeps_the_state_as_it_was(tmp_path, monkeypatch):
    """save() returns with the write held up; the job goes on changing its NumPy state in place;
    the checkpoint still holds the state as it was at save(), bit for bit what a synchronous save
    of it writes."""
    from launcher.rank.checkpoints import storage

    release, writing = threading.Event(), threading.Event()
    write = storage.write_data_file

    def held_up(path, arrays):
        writing.set()
        assert release.wait(20), "never released"
        return write(path, arrays)

    state = {"w": np.arange(1 << 18, dtype=np.float32), "j": jnp.arange(10.0), "n": 3}
    expected = {"w": state["w"].copy(), "j": np.arange(10.0), "n": 3}
    Synchronous(tmp_path / "sync").save(1, state)
    monkeypatch.setattr(storage, "write_data_file", held_up)
    checkpoints = Checkpoints(tmp_path / "async")
    checkpoints.save(1, state)
    assert writing.wait(20) and checkpoints.pending and checkpoints.steps() == []
    state["w"] *= -1  # the next training steps, while the write goes on
    state["n"] = 4
    release.set()
    assert checkpoints.wait() == tmp_path / "async" / "step-00000001" and not checkpoints.pending
    step, restored = checkpoints.restore()
    assert step == 1 and np.array_equal(restored["w"], expected["w"]) and restored["n"] == 3
    assert np.array_equal(np.asarray(restored["j"]), expected["j"])
    written = [(tmp_path / mode / "step-00000001" / "process-00000.data").read_bytes() for mode in ("sync", "async")]
    assert written[0] == written[1]


def test_a_second_save_waits_for_the_first_and_at_most_one_is_pending(tmp_path, monkeypatch):
    from launcher.rank.checkpoints import storage

    release = threading.Event()
    write = storage.write_data_file
    monkeypatch.setattr(storage, "write_data_file", lambda path, arrays: release.wait(20) and write(path, arrays))
    checkpoints = Checkpoints(tmp_path)
    checkpoints.save(1, {"x": np.zeros(3)})
    second = threading.Thread(target=checkpoints.save, args=(2, {"x": np.ones(3)}))
    second.start()
    second.join(0.5)
    assert second.is_alive() and checkpoints.steps() == []  # the second save waits for the first write
    release.set()
    second.join(20)
    checkpoints.wait()
    assert checkpoints.steps() == [1, 2]


@pytest.fixture
def read_only(tmp_path):
    """A folder no one can write into, root included (chattr +i); undone after the test."""
    def make(folder):
        if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
            pytest.skip("chattr +i is not available here")
        made.append(folder)
    made = []
    yield make
    for folder in made:
        subprocess.run(["chattr", "-i", str(folder)], check=True)


def test_a_read_only_folder_fails_the_background_write_and_raises_on_every_rank(tmp_path, read_only):
    folder = tmp_path / "checkpoints"

    def body(rank, comm):
        checkpoints = Checkpoints(folder, rank=rank, comm=comm)
        checkpoints.save(1, {"x": np.zeros(4)})
        checkpoints.wait()
        comm.bcast(read_only(folder) if rank == 0 else None)  # read-only from here on
        checkpoints.save(2, {"x": np.ones(4)})  # returns: the folder is only written in the background
        try:
            checkpoints.wait()
        except CheckpointError as exc:
            return str(exc)
        return "saved"

    outcomes = on_ranks(2, body)
    assert outcomes[0] == outcomes[1] and "checkpoint step 2" in outcomes[0], outcomes
    assert "cannot create" in outcomes[0] and ("Operation not permitted" in outcomes[0] or "Read-only" in outcomes[0])
    assert [p.name for p in folder.iterdir()] == ["step-00000001"]


# --- who writes which piece (layout.plan) -------------------------------------------------------

def test_every_region_is_written_exactly_once_by_one_of_its_holders():
    from launcher.rank.checkpoints.layout import SPLIT_BYTES, LeafShards, plan, size_of

    rows = SPLIT_BYTES // 4  # a float32 leaf of SPLIT_BYTES * 4: big enough to be cut
    leaves = [
        LeafShards((4 * rows,), 4, [(((0, 4 * rows),), (0, 1, 2, 3))]),          # replicated over 4 processes
        LeafShards((8, 6), 4, [(((0, 4), (0, 6)), (0, 1)), (((4, 8), (0, 6)), (2, 3))]),  # sharded, small
        LeafShards((), 8, [((), (0, 1, 2, 3))]),                                    # a scalar
    ]
    pieces = plan(leaves, 4)
    assert plan(leaves, 4) == pieces  # deterministic: every process computes the same
    for number, leaf in enumerate(leaves):
        mine = [p for p in pieces if p.leaf == number]
        assert sum(size_of(p.region) for p in mine) == size_of(tuple((0, d) for d in leaf.shape))
        for piece in mine:
            holders = next(h for region, h in leaf.regions
                           if all(a <= x and y <= b for (x, y), (a, b) in zip(piece.region, region)))
            assert piece.writer in holders
    big = [p for p in pieces if p.leaf == 0]
    assert sorted(p.writer for p in big) == [0, 1, 2, 3]  # cut in four, one part each
    assert {size_of(p.region) for p in big} == {rows}
    small = [p for p in pieces if p.leaf == 1]
    assert len(small) == 2  # under SPLIT_BYTES: not cut


def test_small_leaves_are_spread_over_the_processes_by_bytes():
    from launcher.rank.checkpoints.layout import LeafShards, plan

    leaves = [LeafShards((100,), 4, [(((0, 100),), (0, 1))]) for _ in range(6)]
    writers = [p.writer for p in plan(leaves, 2)]
    assert writers.count(0) == writers.count(1) == 3


def test_writers_are_balanced_by_bytes_not_by_elements_when_itemsizes_differ():
    """Issue 29: a plan that counted elements gave a float64 leaf's writer the next int8 leaves too."""
    from launcher.rank.checkpoints.layout import LeafShards, plan, size_of

    leaves = [LeafShards((100,), 8, [(((0, 100),), (0, 1))]),  # 800 bytes, 100 elements: process 0
              LeafShards((200,), 1, [(((0, 200),), (0, 1))]),  # 200 bytes, 200 elements: process 1
              LeafShards((300,), 1, [(((0, 300),), (0, 1))])]  # 1 has written 200 bytes, 0 has 800: process 1
    pieces = plan(leaves, 2)
    assert [p.writer for p in pieces] == [0, 1, 1]
    written = {0: 0, 1: 0}
    for piece in pieces:
        written[piece.writer] += size_of(piece.region) * leaves[piece.leaf].itemsize
    assert written == {0: 800, 1: 500}


def test_restore_like_refuses_a_leaf_whose_shape_differs_from_the_saved_one_naming_it(tmp_path):
    checkpoints = Synchronous(tmp_path)
    checkpoints.save(1, {"bias": jnp.zeros(3), "w": jnp.arange(12.0).reshape(4, 3)})
    with pytest.raises(CheckpointError) as caught:
        checkpoints.restore(like={"bias": jnp.zeros(3), "w": jnp.zeros((4, 5))})
    message = str(caught.value)
    assert "leaf ['w']: saved with shape (4, 3), like= has (4, 5)" in message, message
    step, restored = checkpoints.restore(like={"bias": jnp.zeros(3), "w": jnp.zeros((4, 3))})  # the same shapes load
    assert step == 1 and np.array_equal(np.asarray(restored["w"]), np.arange(12.0).reshape(4, 3))


def test_a_save_after_should_stop_said_true_is_written_before_save_returns(tmp_path, monkeypatch):
    """The job ends right after this save: it must be on disk, not in a background thread."""
    from launcher.rank import preemption
    from launcher.rank.checkpoints import storage

    writers = []
    write = storage.write_data_file

    def spy(path, arrays):
        writers.append(threading.current_thread())
        return write(path, arrays)

    monkeypatch.setattr(storage, "write_data_file", spy)
    checkpoints = Checkpoints(tmp_path)  # asynchronous, as in a job
    checkpoints.save(1, {"x": np.zeros(3)})
    checkpoints.wait()
    assert writers == [writers[0]] and writers[0] is not threading.current_thread()  # before: in the background
    monkeypatch.setattr(preemption.NOTICE, "agreed", {"sources": ["SIGUSR2"], "call": 1, "time": time.time()})
    checkpoints.save(2, {"x": np.ones(3)})
    assert len(writers) == 2 and writers[1] is threading.current_thread()
    assert not checkpoints.pending and checkpoints.steps() == [1, 2]
