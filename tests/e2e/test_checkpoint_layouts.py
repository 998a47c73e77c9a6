"""Checkpoints across layouts, with real processes (`jaxlaunch run`, mpirun, 2 CPU devices per
process, jax.distributed for global meshes): a state saved by N processes x D devices restores
bit for bit onto M x E with like='s mesh; data-parallel state restores as model-parallel; every
process writes its own pieces and replicated data is written once; a kill -9 in the middle of
an asynchronous sharded save leaves the previous checkpoint whole. The job is tests/jobs/checkpoint_layouts.py."""

import json
import math
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import EXAMPLES, TEST_JOBS, jaxlaunch

SPEC = TEST_JOBS / "checkpoint_layouts.yaml"
sys.path.insert(0, str(TEST_JOBS))
from checkpoint_layouts import reference  # noqa: E402

LAYOUTS = {  # processes x devices, and whether the processes share one JAX runtime (a global mesh)
    "2x2 global": ["--set", "processes_per_node=2", "--set", "devices_per_process=2", "--set", "jax_distributed=true"],
    "2x2 mpi4jax": ["--set", "processes_per_node=2", "--set", "devices_per_process=2", "--set", "jax_distributed=false"],
    "1x4": ["--set", "processes_per_node=1", "--set", "devices_per_process=4", "--set", "jax_distributed=false"],
    "4x1 global": ["--set", "processes_per_node=4", "--set", "devices_per_process=1", "--set", "jax_distributed=true"],
}


def run(tmp_path, name, action, layout, processes, folder):
    from launcher import load_result

    result = jaxlaunch("run", SPEC, "--run-dir", tmp_path / name, "--set", f"params.action={action}",
                       "--set", f"params.layout={layout}", "--set", f"params.folder={folder}", *LAYOUTS[processes])
    assert result.returncode == 0, result.stdout + result.stderr
    return load_result(tmp_path / name)


def pieces_by_file(folder):
    manifest = json.loads((folder / "manifest.json").read_text())
    written = {}
    for leaf in manifest["leaves"]:
        covered = sum(math.prod(b - a for a, b in piece["index"]) for piece in leaf["pieces"])
        assert covered == math.prod(leaf["shape"]), f"{leaf['path']}: pieces cover {covered} values, not each once"
        for piece in leaf["pieces"]:
            written.setdefault(piece["file"], []).append(leaf["path"])
    return written


@pytest.mark.parametrize("saved, saved_layout, restored, restored_layout", [
    ("2x2 global", "grid", "1x4", "grid"),      # 2 processes -> 1, the same mesh shape
    ("1x4", "rows", "2x2 global", "cols"),      # 1 process -> 2, rows -> columns
    ("2x2 global", "rows", "4x1 global", "grid"),
])
def test_a_global_mesh_state_restores_bit_identical_onto_another_layout(tmp_path, saved, saved_layout,
                                                                      restored, restored_layout):
    folder = tmp_path / "checkpoints"
    out = run(tmp_path, "save", "save", saved_layout, saved, folder)
    assert all(out["pending_after_save"])  # save() returned before the write was done, on every rank
    if saved.startswith("2x2"):
        assert sorted(pieces_by_file(folder / "step-00000001")) == ["process-00000.data", "process-00001.data"]
    back = run(tmp_path, "restore", "restore", restored_layout, restored, folder)
    assert back["step"] == 1 and back["mismatches"] == []


def test_data_parallel_state_restores_as_model_parallel_and_was_written_by_both_processes(tmp_path):
    folder = tmp_path / "checkpoints"
    run(tmp_path, "save", "save", "data_parallel", "2x2 mpi4jax", folder)
    written = pieces_by_file(folder / "step-00000001")
    # replicated in both processes, written once: the 2 MiB leaf half by each, not all by rank 0
    assert written["process-00000.data"].count("['big']") == 1
    assert written["process-00001.data"].count("['big']") == 1
    for processes, layout in (("2x2 global", "cols"), ("1x4", "grid")):
        back = run(tmp_path, f"restore-{layout}", "restore", layout, processes, folder)
        assert back["mismatches"] == [], processes
        assert "'m'" in back["shardings"]["w"] or "'a'" in back["shardings"]["w"]


def test_kill_9_during_an_asynchronous_sharded_save_leaves_the_previous_checkpoint_whole(tmp_path):
    """Both ranks save step after step of a sharded state; SIGKILL both at a random moment,
    three times over. Each time the newest complete step loads, with exactly that step's values."""
    from launcher.rank.checkpoints import Checkpoints

    folder = tmp_path / "checkpoints"
    exe = os.path.join(os.path.dirname(sys.executable), "jaxlaunch")
    like = {k: (np.zeros_like(v) if isinstance(v, np.ndarray) else v) for k, v in reference().items()}
    last = 0
    for attempt in range(3):
        run_dir = tmp_path / f"run-{attempt}"
        job = subprocess.Popen([exe, "run", str(SPEC), "--run-dir", str(run_dir), "--set", "params.action=save_loop",
                                "--set", "params.layout=grid", "--set", f"params.folder={folder}",
                                *LAYOUTS["2x2 global"]], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 90
            while len(Checkpoints(folder).steps()) < 2 or not all((run_dir / f"pid-{r}").exists() for r in (0, 1)):
                assert job.poll() is None, job.stderr.read()
                assert time.monotonic() < deadline, "the job saved no two checkpoints in 90 s"
                time.sleep(0.05)
            time.sleep(random.uniform(0, 0.3))
            for rank in (0, 1):
                os.kill(int((run_dir / f"pid-{rank}").read_text()), signal.SIGKILL)
            job.wait(timeout=60)
        finally:
            if job.poll() is None:
                job.kill()
        # The newest step folder itself, not restore()'s fallback: a visible step must be whole.
        checkpoints = Checkpoints(folder)
        newest = checkpoints.latest_step()
        step, state = checkpoints.load(folder / f"step-{newest:08d}", like=like)
        expected = reference(step)
        for name, value in expected.items():
            got = state[name]
            assert (np.asarray(got).tobytes() == value.tobytes()) if isinstance(value, np.ndarray) else got == value
        assert step >= 2 and step >= last  # never goes back
        last = step


def test_training_with_asynchronous_checkpoints_gives_the_bits_of_synchronous_ones(tmp_path):
    """jobs/examples/train_data_parallel.py on 2 processes x 2 devices, checkpointing every 5 steps while it
    trains: the result and every checkpoint's bytes are those of a run whose saves block."""
    from launcher import load_result

    runs = {}
    for mode in ("true", "false"):
        run_dir = tmp_path / f"async-{mode}"
        result = jaxlaunch("run", EXAMPLES / "train_data_parallel.yaml", "--run-dir", run_dir,
                           "--set", "params.steps=20", "--set", "params.checkpoint_every=5",
                           "--set", f"async_checkpoints={mode}", "--set", "keep_checkpoints=4")
        assert result.returncode == 0, result.stdout + result.stderr
        runs[mode] = run_dir
    fast, slow = load_result(runs["true"]), load_result(runs["false"])
    assert fast["losses"] == slow["losses"]
    for name in slow["params"]:
        assert np.array_equal(fast["params"][name], slow["params"][name]), name
    for step in (5, 10, 15, 20):
        for data in sorted((runs["false"] / "checkpoints" / f"step-{step:08d}").glob("process-*.data")):
            twin = runs["true"] / "checkpoints" / f"step-{step:08d}" / data.name
            assert twin.read_bytes() == data.read_bytes(), (step, data.name)
