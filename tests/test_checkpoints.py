"""ctx.checkpoints in one process: round trips keep structure, types, dtypes, values and
shardings; `like=` gives each array like's sharding; `keep` prunes; a kill -9 at any moment of a
save leaves the previous checkpoint whole, also when the same step is saved again; every file and
folder is fsynced; the on-disk format is the documented one. Ranks played by threads (ThreadComm)
check who writes and that an error on any rank raises on every rank (tests/mpi/ does it under mpirun)."""

import errno
import json
import os
import random
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

from launcher.runtime.checkpoints import CheckpointError, Checkpoints, load_checkpoint

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
    checkpoints = Checkpoints(tmp_path, devices=devices, mesh=mesh)
    checkpoints.save(7, state, metadata={"lr": 0.1, "note": "first"})
    step, restored = checkpoints.restore()
    assert step == 7
    assert_same(restored, state)
    assert type(restored["python"][4][1]) is bool


def test_restore_is_none_without_checkpoints_and_keep_prunes_the_oldest(tmp_path):
    checkpoints = Checkpoints(tmp_path / "c", keep=2)
    assert checkpoints.restore() is None and checkpoints.latest_step() is None
    for step in (1, 2, 3, 3):  # step 3 twice: a resumed run saves the same step again
        checkpoints.save(step, {"x": np.full(3, step)})
    assert checkpoints.steps() == [2, 3]
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["step-00000002", "step-00000003"]
    step, state = checkpoints.restore()
    assert step == 3 and np.array_equal(state["x"], np.full(3, 3))


def test_namedtuple_trees_need_like(tmp_path):
    checkpoints = Checkpoints(tmp_path)
    state = Pair(np.ones(2), {"b": jnp.zeros(3)})
    checkpoints.save(1, state)
    with pytest.raises(CheckpointError, match=r"pass restore\(like=initial_state\)"):
        checkpoints.restore()
    step, restored = checkpoints.restore(like=state)
    assert_same(restored, state)
    with pytest.raises(CheckpointError, match="does not match the checkpoint"):
        checkpoints.restore(like={"other": np.ones(2)})


def test_a_damaged_newest_checkpoint_falls_back_to_the_previous(tmp_path):
    checkpoints = Checkpoints(tmp_path, keep=3)
    checkpoints.save(1, {"x": np.ones(2)})
    checkpoints.save(2, {"x": np.ones(2) * 2})
    (tmp_path / "step-00000002" / "manifest.json").write_text("{not json")
    step, state = checkpoints.restore()
    assert step == 1 and np.array_equal(state["x"], np.ones(2))


def test_load_outside_jaxlaunch_and_plain_numpy(tmp_path):
    Checkpoints(tmp_path).save(5, {"w": np.arange(3.0), "n": 4}, metadata={"epoch": 2})
    step, state = load_checkpoint(tmp_path)
    assert step == 5 and state["n"] == 4
    # the documented way without jaxlaunch at all: np.load + the manifest
    import json

    manifest = json.loads((tmp_path / "step-00000005" / "manifest.json").read_text())
    with np.load(tmp_path / "step-00000005" / "arrays.npz") as arrays:
        by_path = {leaf["path"]: arrays[leaf["key"]] for leaf in manifest["leaves"]}
    assert np.array_equal(by_path["['w']"], np.arange(3.0)) and manifest["metadata"] == {"epoch": 2}


def test_bad_metadata_or_leaves_are_refused_before_anything_is_written(tmp_path):
    checkpoints = Checkpoints(tmp_path)
    with pytest.raises(CheckpointError, match="metadata must be JSON"):
        checkpoints.save(1, {"x": np.ones(1)}, metadata={"f": object()})
    with pytest.raises(CheckpointError, match="an array of Python objects"):
        checkpoints.save(1, {"x": np.array([object()])})
    assert checkpoints.steps() == [] and list(tmp_path.iterdir()) == []


WRITER = textwrap.dedent("""
    import sys
    import numpy as np
    from launcher.runtime.checkpoints import Checkpoints

    checkpoints = Checkpoints(sys.argv[1], keep=2)
    latest = checkpoints.restore()
    step = 0 if latest is None else latest[0] + 1
    while True:
        checkpoints.save(step, {"big": np.full(1 << 20, step, dtype=np.float32),
                                "rows": [np.full((64, 64), step + i) for i in range(8)], "step": step})
        print(step, flush=True)
        step += 1
""")


def test_kill_9_at_any_moment_of_a_save_leaves_a_whole_checkpoint(tmp_path):
    """Each save writes ~4.1 MB in several files; SIGKILL lands at random points of it."""
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    folder = tmp_path / "checkpoints"
    rng = random.Random(1234)
    latest, kills = -1, 0
    deadline = time.monotonic() + 60
    while kills < 30 and time.monotonic() < deadline:
        writer = subprocess.Popen([sys.executable, str(script), str(folder)], stdout=subprocess.PIPE, text=True)
        writer.stdout.readline()  # one save done: from now on it is always in the middle of one
        time.sleep(rng.uniform(0, 0.3))
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait()
        kills += 1
        step, state = Checkpoints(folder).restore()
        assert step >= latest, "the checkpoint went backwards"
        latest = step
        assert state["step"] == step
        assert np.array_equal(state["big"], np.full(1 << 20, step, dtype=np.float32))
        for i, rows in enumerate(state["rows"]):
            assert np.array_equal(rows, np.full((64, 64), step + i))
    assert kills >= 15, f"only {kills} kills in 60 s"
    leftovers = [p.name for p in folder.iterdir() if p.name.startswith(".")]
    assert len(leftovers) <= 1  # at most the temp folder of the last killed save (cleaned at the next)


# --- saving a step that exists: the old folder stays whole until the new one is in ---------

KILLED_BETWEEN_THE_RENAMES = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    from launcher.runtime.checkpoints import Checkpoints

    rename = os.rename
    def rename_or_die(src, dst):  # SIGKILL right at the rename of the new folder into place
        if os.path.basename(src).startswith(".tmp-"):
            os.kill(os.getpid(), signal.SIGKILL)
        rename(src, dst)
    os.rename = rename_or_die
    Checkpoints(sys.argv[1]).save(3, {"x": np.full(3, 33.0)})
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
    """jobs/train_data_parallel.py saves the same step twice (periodic, then at should_stop): the old
    step folder is renamed aside (.old-), then the new one in; a stop between the two must not lose it."""
    folder = tmp_path / "checkpoints"
    Checkpoints(folder).save(2, {"x": np.full(3, 2.0)})
    Checkpoints(folder).save(3, {"x": np.full(3, 3.0)})
    if how == "kill -9":
        script = tmp_path / "killed.py"
        script.write_text(KILLED_BETWEEN_THE_RENAMES)
        died = subprocess.run([sys.executable, str(script), str(folder)], capture_output=True, text=True, timeout=60)
        assert died.returncode == -signal.SIGKILL, died.stderr
    else:
        with monkeypatch.context() as patch:
            fail_the_rename_into_place(patch)
            with pytest.raises(CheckpointError, match="injected: the disk went away"):
                Checkpoints(folder).save(3, {"x": np.full(3, 33.0)})
    assert not (folder / "step-00000003").exists()  # stopped between the two renames
    assert [p.name for p in folder.glob(".old-step-00000003-*")]

    step, state = Checkpoints(folder).restore()  # a fresh object, as a restarted job has
    assert step == 3 and np.array_equal(state["x"], np.full(3, 3.0))
    assert load_checkpoint(folder)[0] == 3

    # A save that fails (after the leftovers are cleaned) must not take the only copy of step 3 with it.
    with pytest.raises(CheckpointError, match="an array of Python objects"):
        Checkpoints(folder).save(4, {"x": np.array([object()])})
    step, state = Checkpoints(folder).restore()
    assert step == 3 and np.array_equal(state["x"], np.full(3, 3.0))

    # The following saves work, the new step 3 wins over the old copy, and the leftovers go.
    checkpoints = Checkpoints(folder, keep=2)
    checkpoints.save(3, {"x": np.full(3, 33.0)})
    step, state = Checkpoints(folder).restore()
    assert step == 3 and np.array_equal(state["x"], np.full(3, 33.0))
    checkpoints.save(4, {"x": np.full(3, 4.0)})
    assert sorted(p.name for p in folder.iterdir()) == ["step-00000003", "step-00000004"]
    step, state = Checkpoints(folder).restore()
    assert step == 4 and np.array_equal(state["x"], np.full(3, 4.0))


def test_saving_an_existing_step_replaces_it_and_leaves_no_old_copy(tmp_path):
    checkpoints = Checkpoints(tmp_path, keep=2)
    checkpoints.save(3, {"x": np.full(2, 1.0)}, metadata={"save": "periodic"})
    checkpoints.save(3, {"x": np.full(2, 2.0)}, metadata={"save": "should_stop"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000003"]
    step, state = Checkpoints(tmp_path).restore()
    assert step == 3 and np.array_equal(state["x"], np.full(2, 2.0))
    manifest = json.loads((tmp_path / "step-00000003" / "manifest.json").read_text())
    assert manifest["metadata"] == {"save": "should_stop"}


def test_leftovers_of_killed_writers_are_cleaned_but_an_old_copy_whose_step_is_gone_is_kept(tmp_path):
    checkpoints = Checkpoints(tmp_path, keep=5)
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
    assert Checkpoints(tmp_path).restore()[0] == 5  # the .old- copy is newer than step 1

    checkpoints.save(4, {"x": np.full(2, 4.0)})
    assert sorted(p.name for p in tmp_path.iterdir()) == [".old-step-00000005-99999", "step-00000001",
                                                          "step-00000004"]
    step, state = Checkpoints(tmp_path).restore()
    assert step == 5 and np.array_equal(state["x"], np.full(2, 2.0))


def test_an_old_copy_older_than_the_kept_steps_is_removed(tmp_path, monkeypatch):
    checkpoints = Checkpoints(tmp_path, keep=2)
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
    checkpoints = Checkpoints(folder)
    if again:
        checkpoints.save(1, {"x": np.zeros(2)}, per_rank=per_rank)
    events = record_fsyncs_and_renames(monkeypatch)
    checkpoints.save(1, {"x": np.ones(2), "n": 3}, per_rank=per_rank)

    temp = folder / f".tmp-step-00000001-{os.getpid()}"
    final = folder / "step-00000001"
    into_place = events.index(("rename", str(temp), str(final)))
    synced = [event[1] for event in events if event[0] == "fsync"]
    arrays = temp / ("arrays-rank-0.npz" if per_rank else "arrays.npz")
    for path in (arrays, temp / "manifest.json", temp):  # the files, then their folder, before the rename
        assert str(path) in synced, f"{path} not fsynced: {events}"
        assert events.index(("fsync", str(path))) < into_place
    assert events.index(("fsync", str(temp / "manifest.json"))) < events.index(("fsync", str(temp)))
    # the checkpoints folder after the rename, so the new name itself is durable
    assert ("fsync", str(folder)) in events[into_place + 1:], f"{folder} not fsynced after the rename: {events}"
    assert Checkpoints(folder).restore()[1]["n"] == 3


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
        checkpoints = Checkpoints(tmp_path / name.replace(" ", "-").replace(",", ""), devices=devices, mesh=mesh)
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
    """The part of MPI.COMM_WORLD that Checkpoints uses (Get_size, bcast, gather) for ranks that
    are threads; a rank that never arrives breaks the barrier instead of hanging the test."""

    def __init__(self, rank, shared):
        self.rank, self.shared = rank, shared

    def Get_size(self):
        return len(self.shared["slots"])

    def Get_rank(self):
        return self.rank

    def _exchange(self, value, root):
        barrier, slots = self.shared["barrier"], self.shared["slots"]
        slots[self.rank] = value
        barrier.wait()
        values = list(slots)
        barrier.wait()
        return values

    def bcast(self, value, root=0):
        return self._exchange(value, root)[root]

    def gather(self, value, root=0):
        values = self._exchange(value, root)
        return values if self.rank == root else None


def on_ranks(size, body):
    """body(rank, comm) on `size` threads at once; [what each returned or raised]."""
    shared = {"slots": [None] * size, "barrier": threading.Barrier(size, timeout=20)}
    outcomes = [None] * size

    def run(rank):
        try:
            outcomes[rank] = body(rank, ThreadComm(rank, shared))
        except BaseException as exc:  # noqa: BLE001
            outcomes[rank] = exc
            shared["barrier"].abort()

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads), "a rank hangs"
    return outcomes


def test_replicated_save_on_two_ranks_is_written_by_rank_0_alone(tmp_path, monkeypatch):
    writers = []
    write_arrays = Checkpoints._write_arrays

    def recording(self, folder, state, per_rank):
        writers.append(self.rank)
        return write_arrays(self, folder, state, per_rank)

    monkeypatch.setattr(Checkpoints, "_write_arrays", recording)

    def body(rank, comm):
        checkpoints = Checkpoints(tmp_path, rank=rank, comm=comm)
        checkpoints.save(5, {"x": np.full(2, float(rank))})  # replicated: rank 0's copy is the one
        return checkpoints.restore()

    outcomes = on_ranks(2, body)
    assert writers == [0]
    for outcome in outcomes:
        step, state = outcome
        assert step == 5 and np.array_equal(state["x"], np.zeros(2))
    assert sorted(p.name for p in (tmp_path / "step-00000005").iterdir()) == ["arrays.npz", "manifest.json"]
    manifest = json.loads((tmp_path / "step-00000005" / "manifest.json").read_text())
    assert manifest["per_rank"] is False and manifest["num_ranks"] == 2


def test_per_rank_save_on_two_ranks_writes_one_file_per_rank(tmp_path):
    def body(rank, comm):
        checkpoints = Checkpoints(tmp_path, rank=rank, comm=comm)
        checkpoints.save(6, {"mine": np.full(2, rank), "rank": rank}, per_rank=True)
        return checkpoints.restore()

    outcomes = on_ranks(2, body)
    for rank, (step, state) in enumerate(outcomes):
        assert step == 6 and np.array_equal(state["mine"], np.full(2, rank)) and state["rank"] == rank
    folder = tmp_path / "step-00000006"
    assert sorted(p.name for p in folder.iterdir()) == ["arrays-rank-0.npz", "arrays-rank-1.npz", "manifest.json"]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["per_rank"] is True and manifest["num_ranks"] == 2
    with np.load(folder / "arrays-rank-1.npz") as arrays:  # readable with NumPy alone
        assert np.array_equal(arrays["leaf_0"], np.full(2, 1))
    # without MPI (a notebook), any rank's part by its number
    step, state = Checkpoints(tmp_path, rank=1).restore()
    assert step == 6 and np.array_equal(state["mine"], np.full(2, 1)) and state["rank"] == 1


def test_a_failed_per_rank_write_on_the_last_rank_raises_on_every_rank_and_saves_nothing(tmp_path):
    def body(rank, comm):
        checkpoints = Checkpoints(tmp_path, rank=rank, comm=comm)
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
        try:
            Checkpoints(tmp_path / "file" / "checkpoints", rank=rank, comm=comm).save(1, {"x": np.zeros(1)})
        except CheckpointError as exc:
            return exc
        return "saved"

    for outcome in on_ranks(2, body):
        assert isinstance(outcome, CheckpointError) and "cannot create" in str(outcome), outcome


def test_a_restore_that_fails_on_one_rank_raises_on_every_rank(tmp_path):
    def body(rank, comm):
        checkpoints = Checkpoints(tmp_path, rank=rank, comm=comm)
        checkpoints.save(4, {"mine": np.full(2, rank)}, per_rank=True)
        comm.bcast(None)  # everyone has saved
        if rank == 0:
            (tmp_path / "step-00000004" / "arrays-rank-1.npz").write_bytes(b"not an npz")
        comm.bcast(None)
        try:
            checkpoints.restore()
        except CheckpointError as exc:
            return exc
        return "restored"

    for outcome in on_ranks(2, body):
        assert isinstance(outcome, CheckpointError), outcome
        assert "cannot restore" in str(outcome) and "rank 1" in str(outcome) and "arrays-rank-1.npz" in str(outcome)


def test_a_failed_write_on_rank_0_after_the_folder_is_made_raises_on_every_rank(tmp_path):
    """Rank 0 fails while the others have nothing to write: only the final broadcast tells them."""
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
    folder = Checkpoints(tmp_path).save(42, state, metadata={"lr": 0.5})
    after = time.time()
    assert folder == tmp_path / "step-00000042" and folder.is_dir()
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["format"] == "jaxlaunch-checkpoint" and manifest["version"] == 1
    assert manifest["step"] == 42 and manifest["metadata"] == {"lr": 0.5}
    assert before <= manifest["time"] <= after
    assert manifest["per_rank"] is False and manifest["num_ranks"] == 1
    leaves = {leaf["path"]: leaf for leaf in manifest["leaves"]}
    assert leaves["['bf16']"]["dtype"] == "bfloat16" and leaves["['bf16']"]["shape"] == [3]
    assert leaves["['bf16']"]["kind"] == "jax" and leaves["['bf16']"]["sharding"]["type"] == "single"
    assert leaves["['w']"] == {"kind": "numpy", "path": "['w']", "dtype": "float64", "shape": [3], "key": "leaf_1"}
    with np.load(folder / "arrays.npz") as arrays:  # npz cannot name bfloat16: its bits, as uint16
        bits = arrays[leaves["['bf16']"]["key"]]
    assert bits.dtype == np.uint16
    assert np.array_equal(bits, np.asarray(bf16).view(np.uint16))
    assert np.array_equal(bits.view(ml_dtypes.bfloat16), np.asarray(bf16))  # as the README shows


def test_scalars_keep_their_exact_type_numpy_float64_included(tmp_path):
    """np.float64 is a subclass of Python float: it must still come back as np.float64."""
    state = {"f64": np.float64(0.1), "i64": np.int64(-7), "b": np.bool_(True), "f16": np.float16(1.5),
             "int": 2 ** 40, "float": 0.1, "bool": False}
    Checkpoints(tmp_path).save(1, state)
    _, restored = Checkpoints(tmp_path).restore()
    for key, value in state.items():
        assert type(restored[key]) is type(value), key
        assert restored[key] == value, key


def test_load_checkpoint_takes_a_step_folder_or_the_checkpoints_folder(tmp_path):
    checkpoints = Checkpoints(tmp_path, keep=5)
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
    checkpoints = Checkpoints(tmp_path, keep=3)
    for step in (1, 2, 3):
        checkpoints.save(step, {"x": np.full(1, step)})
    (tmp_path / "step-00000009").mkdir()  # no manifest: not a checkpoint
    shutil.copytree(tmp_path / "step-00000001", tmp_path / "step-latest")  # not a step number
    assert checkpoints.steps() == [1, 2, 3] and checkpoints.latest_step() == 3
    assert Checkpoints(tmp_path).restore()[0] == 3


@pytest.mark.parametrize("manifest", ["{not json", '{"format": "orbax", "step": 9}', ""])
def test_a_newest_manifest_that_is_not_a_jaxlaunch_one_falls_back_to_the_previous(tmp_path, manifest):
    checkpoints = Checkpoints(tmp_path, keep=3)
    checkpoints.save(1, {"x": np.ones(2)})
    checkpoints.save(2, {"x": np.ones(2) * 2})
    (tmp_path / "step-00000002" / "manifest.json").write_text(manifest)
    step, state = checkpoints.restore()
    assert step == 1 and np.array_equal(state["x"], np.ones(2))


def test_like_with_the_same_number_of_leaves_but_other_names_is_refused(tmp_path):
    checkpoints = Checkpoints(tmp_path)
    checkpoints.save(1, {"a": np.ones(2), "b": np.zeros(2)})
    with pytest.raises(CheckpointError, match=r"does not match the checkpoint: \"\['c'\]\" vs saved \"\['b'\]\""):
        checkpoints.restore(like={"a": np.ones(2), "c": np.zeros(2)})
    with pytest.raises(CheckpointError, match="does not match"):
        checkpoints.restore(like=[np.ones(2), np.zeros(2)])


def test_dicts_in_any_key_order_come_back_under_their_own_keys(tmp_path):
    state = {"zeta": np.full(2, 1.0), "alpha": np.full(2, 2.0), "mid": {"y": 3, "b": 4}}
    checkpoints = Checkpoints(tmp_path)
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
    checkpoints = Checkpoints(tmp_path, devices=devices)
    checkpoints.save(1, state)
    _, restored = checkpoints.restore()
    assert_same(restored, state)


def test_an_array_saved_on_a_device_this_machine_lacks_comes_back_on_its_last_device(tmp_path):
    devices = jax.local_devices()
    if len(devices) < 2:
        pytest.skip("needs 2 local devices (XLA_FLAGS=--xla_force_host_platform_device_count=2)")
    Checkpoints(tmp_path, devices=devices[:2]).save(1, {"x": jax.device_put(np.arange(3.0), devices[1])})
    _, restored = Checkpoints(tmp_path, devices=devices[:1]).restore()  # e.g. a notebook with one device
    assert restored["x"].devices() == {devices[0]} and np.array_equal(np.asarray(restored["x"]), np.arange(3.0))


def test_save_and_restore_are_on_the_run_timeline(tmp_path, monkeypatch):
    from launcher.rundir import RunDirectory
    from launcher.runtime.environment import RUN_DIR_ENV

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    monkeypatch.setenv(RUN_DIR_ENV, str(run_dir))
    checkpoints = Checkpoints(run_dir / "checkpoints")
    checkpoints.save(12, {"x": np.arange(1000.0)})
    checkpoints.restore()
    events = [{k: v for k, v in e.items() if k != "time"} for e in RunDirectory(run_dir).read_events()]
    assert [e["event"] for e in events] == ["checkpoint", "restored"]
    arrays = run_dir / "checkpoints" / "step-00000012" / "arrays.npz"
    assert events[0]["step"] == 12 and events[0]["bytes"] == arrays.stat().st_size
    assert events[0]["seconds"] >= 0
    assert events[1] == {"event": "restored", "step": 12, "folder": str(run_dir / "checkpoints" / "step-00000012")}
