"""ctx.checkpoints in one process: round trips keep structure, types, dtypes, values and
shardings; `keep` prunes; a kill -9 at any moment of a save leaves the previous checkpoint whole."""

import os
import random
import signal
import subprocess
import sys
import textwrap
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
