"""End to end: `jaxlaunch run` as a user types it, under a real mpirun."""

import json
import time

import numpy as np
import pytest

from conftest import BENCHMARKS, EXAMPLES, TEST_JOBS, jaxlaunch

pytestmark = pytest.mark.e2e


def test_normalize_job(tmp_path):
    result = jaxlaunch("run", EXAMPLES / "normalize.yaml", "--run-dir", tmp_path / "run")
    assert result.returncode == 0, result.stdout + result.stderr
    values = json.loads((tmp_path / "run" / "result.json").read_text())["values"]
    reference = np.arange(1, 5) / np.arange(1, 5).sum()
    assert len(values) == 4 and len(set(values)) == 4
    assert abs(sum(values) - 1) < 1e-6
    np.testing.assert_allclose(values, reference, rtol=1e-6)
    # live output carries rank prefixes; each rank's full log is kept
    assert "[rank 0] " in result.stdout + result.stderr and "[rank 1] " in result.stdout + result.stderr
    for rank in (0, 1):
        assert "entrypoint finished" in (tmp_path / "run" / "logs" / f"rank-{rank}.log").read_text()
    assert json.loads((tmp_path / "run" / "status.json").read_text())["state"] == "COMPLETED"


def test_convolve_job_gathers_rows_in_order(tmp_path):
    result = jaxlaunch("run", EXAMPLES / "convolve.yaml", "--run-dir", tmp_path / "run", "--set", "params.row_offset=1")
    assert result.returncode == 0, result.stdout + result.stderr
    rows = json.loads((tmp_path / "run" / "result.json").read_text())["values"]
    expected = [[11 + 9 * b, 20 + 9 * b, 29 + 9 * b] for b in range(8)]
    assert rows == expected


def test_convolve_default_rows_are_the_tutorial_result(tmp_path):
    result = jaxlaunch("run", EXAMPLES / "convolve.yaml", "--run-dir", tmp_path / "run",
                       "--set", "processes_per_node=1", "--set", "nodes=2", "--set", "devices_per_process=1",
                       "--set", "params.batch=4")
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads((tmp_path / "run" / "result.json").read_text())["values"] == [[11.0, 20.0, 29.0]] * 4


def test_failing_rank_brings_the_job_down_fast_with_its_traceback(tmp_path):
    started = time.monotonic()
    result = jaxlaunch("run", TEST_JOBS / "fail_on_rank.yaml", "--run-dir", tmp_path / "run", timeout=60)
    elapsed = time.monotonic() - started
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert elapsed < 10, f"took {elapsed:.1f} s"
    assert "[rank 1] Traceback (most recent call last):" in output
    assert "[rank 1] fail_on_rank.InjectedFailure: rank 1 failed on purpose" in output or \
           "InjectedFailure: rank 1 failed on purpose" in output
    assert "FAILED: rank 1 on " in output and "failed first: fail_on_rank.InjectedFailure: rank 1 failed on purpose" in output
    assert not (tmp_path / "run" / "result.json").exists()
    assert json.loads((tmp_path / "run" / "status.json").read_text())["state"] == "FAILED"
    assert "InjectedFailure" in (tmp_path / "run" / "logs" / "rank-1.error").read_text()


def test_timeout_kills_the_job(tmp_path):
    started = time.monotonic()
    result = jaxlaunch("run", TEST_JOBS / "fail_on_rank.yaml", "--run-dir", tmp_path / "run",
                       "--set", "entrypoint=fail_on_rank.py:sleep", "--set", "params.seconds=600",
                       "--set", "timeout=4", timeout=60)
    assert result.returncode == 124  # like coreutils' timeout: a hang is not a crash
    assert time.monotonic() - started < 30
    assert "TIMEOUT: timed out after 4 s" in result.stderr
    assert json.loads((tmp_path / "run" / "status.json").read_text())["state"] == "TIMEOUT"


def test_topology_env_and_array_results(tmp_path):
    result = jaxlaunch("run", TEST_JOBS / "fail_on_rank.yaml", "--run-dir", tmp_path / "run",
                       "--set", "entrypoint=fail_on_rank.py:report", "--set", "nodes=2",
                       "--set", "processes_per_node=2", "--set", "devices_per_process=2",
                       "--set", "env.JOBTEST_VALUE=a b $(touch PWNED)")
    assert result.returncode == 0, result.stdout + result.stderr
    from launcher import load_result
    value = load_result(tmp_path / "run")
    # rows: rank, local rank, node index, number of nodes, local devices
    assert value["ranks"] == [[0, 0, 0, 2, 2], [1, 1, 0, 2, 2], [2, 0, 1, 2, 2], [3, 1, 1, 2, 2]]
    assert value["env"] == {"JOBTEST_VALUE": "a b $(touch PWNED)"}
    np.testing.assert_array_equal(value["arrays"]["eye"], np.eye(2))
    assert not (tmp_path / "PWNED").exists()


def test_benchmark_job_runs_and_writes_table_json_and_plot(tmp_path):
    """A small run of the benchmark job: every method runs and agrees; timings are not judged here."""
    result = jaxlaunch("run", BENCHMARKS / "bench_allreduce.yaml", "--run-dir", tmp_path / "run",
                       "--set", "params.sizes=[8, 4096]", "--set", "params.repeat_scale=0.05", "--set", "params.runs=2",
                       "--set", "params.tree_leaves=10", "--set", "params.tree_bytes=40960", timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((tmp_path / "run" / "bench.json").read_text())
    assert [row["case"] for row in report["rows"]] == ["8 B", "4096 B", "10-leaf tree, 0 MiB"]
    methods = {"mpi4py", "mpi4py in-place", "mpi4jax per-leaf", "launcher", "launcher packed", "XLA global mesh",
               "launcher (xla)", "jit step", "jit step + allreduce", "jit step + psum (XLA)"}
    for row in report["rows"]:
        assert set(row["seconds"]) == set(row["spread"]) == methods and row["runs"] == 2
        assert all(0 < t < 60 for t in row["seconds"].values()) and row["pack_seconds"] >= 0
        assert all(s["min"] <= s["median"] <= s["max"] for s in [*row["spread"].values(), *row["ratios"].values()])
    assert [row["op"] for row in report["small"]] == ["allreduce", "broadcast", "should_stop"]
    assert set(report["load_average_1min"]) == {"before", "after"}
    assert (tmp_path / "run" / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    output = result.stdout + result.stderr
    assert "| case | mpi4py | mpi4py in-place | mpi4jax per-leaf | launcher | launcher packed | XLA global mesh |" in output
    assert "| should_stop() |" in output and "2 runs (median of run medians, min-max in brackets)" in output
    assert "| case | jit step | jit step + allreduce | mpi4py in-place |" in output  # inside the step's jit
    tree = report["rows"][-1]
    assert tree["floor_seconds"]["median"] > 0 and set(tree["floor_parts"]) == {
        "gather (jit)", "gather (numpy)", "make (jit split)", "make (device_put)"}
    assert "| 10-leaf tree, 0 MiB |" in output.split("launcher / floor (target <= 1.25x)")[1]
    # both transports and raw MPI side by side, outside and inside jit, and the small calls over XLA
    assert ("| case | raw mpi4py | launcher over mpi4jax | launcher over XLA | XLA psum by hand | "
            "in jit: step + launcher (mpi4jax) | in jit: step + psum (XLA) |") in output
    assert all(row["ratios"]["launcher (xla) / launcher"]["median"] > 0 for row in report["rows"])
    assert [row["launcher (xla)"]["median"] > 0 for row in report["small"][:2]] == [True, True]


def test_a_benchmark_without_matplotlib_says_so_first_and_keeps_its_table(tmp_path):
    """It used to run for minutes, then fail on `import matplotlib`, losing its table."""
    hidden = tmp_path / "hide"
    hidden.mkdir()
    (hidden / "matplotlib.py").write_text('raise ImportError("matplotlib hidden for the test")\n')
    run_dir = tmp_path / "run"
    result = jaxlaunch("run", BENCHMARKS / "bench_allreduce.yaml", "--run-dir", run_dir, "--set", "params.sizes=[8]",
                       "--set", "params.repeat_scale=0.01", "--set", "params.runs=1", "--set", "params.tree_leaves=2",
                       "--set", "params.tree_bytes=1024", "--set", f"env.PYTHONPATH={hidden}", timeout=300)
    assert result.returncode == 0, result.stderr
    log = (run_dir / "logs" / "rank-0.log").read_text()
    assert "matplotlib is not installed" in log and log.index("matplotlib is not installed") < log.index("8 B:")
    assert (run_dir / "bench.json").exists() and not (run_dir / "bench.png").exists()
    assert "| 8 B |" in json.loads((run_dir / "result.json").read_text())["table"]
    # stdout: a result this large (5 KB) as a one-line summary that names result.json
    assert "see result.json" in json.loads(result.stdout)["table"]


@pytest.mark.parametrize("nodes, processes_per_node, devices_per_process", [(1, 1, 2), (2, 1, 1), (2, 1, 2)])
def test_training_gives_the_same_step_on_any_layout(tmp_path, single_device_training, nodes,
                                                    processes_per_node, devices_per_process):
    """The global batch is split by global device index, so every layout computes the same
    mathematics: losses and parameters agree with 1 process x 1 device to 1e-5 relative."""
    layout = {"nodes": nodes, "processes_per_node": processes_per_node, "devices_per_process": devices_per_process}
    out = train(tmp_path, **layout)
    reference = single_device_training
    assert out["devices"] == nodes * processes_per_node * devices_per_process and out["replicas_in_sync"]
    np.testing.assert_allclose(out["losses"], reference["losses"], rtol=1e-5)
    for name, value in reference["params"].items():
        np.testing.assert_allclose(out["params"][name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def test_training_over_xla_collectives_gives_the_losses_of_mpi4jax(tmp_path):
    """transport: xla (XLA's own collectives, gloo, under jax.distributed) against mpi4jax, on the same
    layout (2 processes x 2 devices: per-device rows, a packed buffer, NumPy leaves): the same
    losses and parameters to 1e-6, and each run says which transport it used."""
    layout = {"nodes": 2, "processes_per_node": 1, "devices_per_process": 2}
    over_mpi = train(tmp_path / "mpi", **layout, transport="mpi4jax")
    over_xla = train(tmp_path / "xla", **layout, transport="xla", jax_distributed="true")
    for run, transport in (("mpi", "mpi4jax"), ("xla", "xla")):
        events = [json.loads(line) for line in (tmp_path / run / "run" / "events.jsonl").read_text().splitlines()]
        assert next(e for e in events if e["event"] == "main_started")["transport"] == transport
    assert over_xla["replicas_in_sync"]
    np.testing.assert_allclose(over_xla["losses"], over_mpi["losses"], rtol=1e-6, atol=0)
    for name, value in over_mpi["params"].items():
        np.testing.assert_allclose(over_xla["params"][name], value, rtol=1e-6, atol=1e-7, err_msg=name)


@pytest.fixture(scope="module")
def single_device_training(tmp_path_factory):
    out = train(tmp_path_factory.mktemp("layout"), nodes=1, processes_per_node=1, devices_per_process=1)
    assert out["devices"] == 1
    assert out["final_loss"] < out["first_loss"] / 2  # it learns
    assert sorted(out["params"]) == ["b0", "b1", "b2", "w0", "w1", "w2"]  # a real pytree: 3 layers
    return out


def train(tmp_path, **layout):
    from launcher import load_result

    settings = [arg for key, value in layout.items() for arg in ("--set", f"{key}={value}")]
    result = jaxlaunch("run", EXAMPLES / "train_data_parallel.yaml", "--run-dir", tmp_path / "run",
                       "--set", "params.steps=30", "--set", "params.checkpoint_every=0", *settings)
    assert result.returncode == 0, result.stdout + result.stderr
    return load_result(tmp_path / "run")


def test_sharded_mlp_matches_numpy_backprop(tmp_path):
    """Model-parallel weights, data-parallel processes: the final weights equal plain NumPy
    gradient descent on both processes' data."""
    import sys
    sys.path.insert(0, str(EXAMPLES))
    from sharded_mlp import batch, init

    result = jaxlaunch("run", EXAMPLES / "sharded_mlp.yaml", "--run-dir", tmp_path / "run", "--set", "params.steps=5")
    assert result.returncode == 0, result.stdout + result.stderr
    from launcher import load_result
    out = load_result(tmp_path / "run")

    params = {k: v.astype(np.float64) for k, v in init(16, 32, 4).items()}
    data = [batch(rank, 64, 16, 4) for rank in range(2)]
    losses = []
    for _ in range(5):
        grads, step_losses = [], []
        for x, y in data:  # each process's mean loss gradient, then the mean over processes
            h = np.tanh(x @ params["w1"])
            error = h @ params["w2"] - y
            step_losses.append(np.mean(error ** 2))
            d_out = 2 * error / error.size
            grads.append({"w2": h.T @ d_out, "w1": x.T @ ((d_out @ params["w2"].T) * (1 - h ** 2))})
        losses.append(np.mean(step_losses))
        params = {k: params[k] - 0.2 * (grads[0][k] + grads[1][k]) / 2 for k in params}
    np.testing.assert_allclose(out["losses"], losses, rtol=1e-4)
    np.testing.assert_allclose(out["w1"], params["w1"], atol=1e-5)
    np.testing.assert_allclose(out["w2"], params["w2"], atol=1e-5)


def test_matmul_benchmark_job_runs(tmp_path):
    """The job checks every method against NumPy itself (it fails otherwise); here: the default
    layout (2 processes x 2 devices) runs and reports every method, with its cores, and the plot."""
    result = jaxlaunch("run", BENCHMARKS / "bench_matmul.yaml", "--run-dir", tmp_path / "run",
                       "--set", "params.shapes=[[4, 16, 16, 16]]", "--set", "params.repeats=3")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((tmp_path / "run" / "bench.json").read_text())
    methods = {"numpy (BLAS)", "jax.jit, 1 device", "pmap, local devices", "jit + NamedSharding (ctx.mesh)",
               "all processes", "jax.jit, dispatch only (wrong)"}
    assert set(report["methods"]) == methods
    assert (report["processes"], report["devices_per_process"]) == (2, 2)
    assert report["cpu_count"] >= 1 and len(report["sched_getaffinity_per_rank"]) == 2
    [row] = report["rows"]
    assert row["shape"] == [4, 16, 16, 16]
    for key in ("seconds", "gflops", "cores_used"):
        assert set(row[key]) == methods, key
    assert all(row["gflops"][m] > 0 for m in methods), row["gflops"]
    assert all(row["cores_used"][m] > 0 for m in methods), row["cores_used"]
    assert (tmp_path / "run" / "bench_matmul.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    output = result.stdout + result.stderr
    assert "| 4 x 16 x 16 x 16 | all processes | 2 x 2 |" in output
    assert "Emulated CPU devices (--xla_force_host_platform_device_count) are not separate hardware" in output


def test_global_mesh_model_parallel_across_processes_matches_numpy(tmp_path):
    """jax_distributed: one jit over the 4 devices of 2 processes, weights split over all 4."""
    import sys
    sys.path.insert(0, str(EXAMPLES))
    from global_mesh import global_batch, init, numpy_reference
    from launcher import load_result

    result = jaxlaunch("run", EXAMPLES / "global_mesh.yaml", "--run-dir", tmp_path / "run", "--set", "params.steps=8",
                       "--set", "jax_distributed_timeout=2m")
    assert result.returncode == 0, result.stdout + result.stderr
    out = load_result(tmp_path / "run")
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    started = next(e for e in events if e["event"] == "jax_distributed")  # its start-up time, on the timeline
    assert started["processes"] == 2 and 0 <= started["seconds"] < 120
    assert out["processes"] == 2 and out["global_devices"] == 4
    assert out["w1_shard_shape"] == [16, 8]  # hidden 32 over 4 devices of 2 processes: model parallel across hosts
    x, y = global_batch(128, 16, 4)
    losses, params = numpy_reference(init(16, 32, 4), x, y, 8, 0.2)
    np.testing.assert_allclose(out["losses"], losses, rtol=1e-4)
    np.testing.assert_allclose(out["w1"], params["w1"], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out["w2"], params["w2"], rtol=1e-4, atol=1e-5)


def test_a_file_the_job_never_closed_is_still_written(tmp_path):
    """Ranks end without CPython's slow interpreter teardown (bootstrap.fast_exit), which would
    otherwise flush files left open; fast_exit flushes them itself."""
    (tmp_path / "job.py").write_text(
        "import os\nKEEP = []\n\ndef main(ctx):\n"
        "    f = open(os.path.join(ctx.run_dir, f'note-{ctx.rank}.txt'), 'w')\n"
        "    f.write('written, never closed')\n    KEEP.append(f)\n    return 1\n")
    (tmp_path / "job.yaml").write_text("name: unclosed\nentrypoint: job.py:main\nprocesses_per_node: 2\n")
    result = jaxlaunch("run", tmp_path / "job.yaml", "--run-dir", tmp_path / "run")
    assert result.returncode == 0, result.stderr
    for rank in range(2):
        assert (tmp_path / "run" / f"note-{rank}.txt").read_text() == "written, never closed"


def test_checkpoint_benchmark_job_runs_every_writer_and_restores(tmp_path):
    """A small size only (the figures come from the full run docs/design/preemption.md quotes): every writer
    that is installed gets a row, both restores of ours are timed, the plot is written."""
    result = jaxlaunch("run", BENCHMARKS / "bench_checkpoint.yaml", "--run-dir", tmp_path / "run",
                       "--set", "params.sizes_mib=[8]", "--set", "params.repeats=1")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((tmp_path / "run" / "bench.json").read_text())
    [size] = report["sizes"]
    rows = {row["writer"]: row for row in size["rows"]}
    assert {"raw np.save + fsync", "ours, async", "ours, blocking=True", "old engine (v1, sync)"} <= set(rows)
    ours = rows["ours, async"]
    assert 0 < ours["blocking_s"] <= ours["total_s"]
    assert ours["restore_s"] > 0 and ours["restore_resharded_s"] > 0
    assert (tmp_path / "run" / "bench_checkpoint.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert "| 8 MiB | ours, async |" in result.stdout + result.stderr
