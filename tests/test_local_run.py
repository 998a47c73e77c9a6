"""End to end: `jaxlaunch run` as a user types it, under a real mpirun."""

import json
import time

import numpy as np
import pytest

from conftest import JOBS, TEST_JOBS, jaxlaunch

pytestmark = pytest.mark.e2e


def test_normalize_job(tmp_path):
    result = jaxlaunch("run", JOBS / "normalize.yaml", "--run-dir", tmp_path / "run")
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
    result = jaxlaunch("run", JOBS / "convolve.yaml", "--run-dir", tmp_path / "run", "--set", "params.row_offset=1")
    assert result.returncode == 0, result.stdout + result.stderr
    rows = json.loads((tmp_path / "run" / "result.json").read_text())["values"]
    expected = [[11 + 9 * b, 20 + 9 * b, 29 + 9 * b] for b in range(8)]
    assert rows == expected


def test_convolve_default_rows_are_the_tutorial_result(tmp_path):
    result = jaxlaunch("run", JOBS / "convolve.yaml", "--run-dir", tmp_path / "run",
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


def test_bad_spec_through_the_console_script_has_no_traceback(write_spec):
    path = write_spec("name: x\nentrypoint: m:f\nnodez: 2\n")
    result = jaxlaunch("run", path)
    assert result.returncode == 2
    assert result.stderr.startswith(f"Error: {path}:3: nodez: unknown key.")
    assert "Traceback" not in result.stderr


def test_benchmark_job_runs_and_writes_table_json_and_plot(tmp_path):
    """A small run of the benchmark job: every method runs and agrees; timings are not judged here."""
    result = jaxlaunch("run", JOBS / "bench_allreduce.yaml", "--run-dir", tmp_path / "run",
                       "--set", "params.sizes=[8, 4096]", "--set", "params.repeat_scale=0.05",
                       "--set", "params.tree_leaves=10", "--set", "params.tree_bytes=40960", timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((tmp_path / "run" / "bench.json").read_text())
    assert [row["case"] for row in report["rows"]] == ["8 B", "4096 B", "10-leaf tree, 0 MiB"]
    for row in report["rows"]:
        assert set(row["seconds"]) == {"mpi4py", "mpi4jax per-leaf", "launcher", "jax.distributed"}
        assert all(0 < t < 60 for t in row["seconds"].values())
    assert (tmp_path / "run" / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| case | mpi4py | mpi4jax per-leaf | launcher | jax.distributed |" in result.stdout + result.stderr


def test_data_parallel_training_matches_single_process_numpy(tmp_path):
    """Gradients averaged over 2 processes x 2 devices must give exactly the full-batch descent."""
    result = jaxlaunch("run", JOBS / "train_data_parallel.yaml", "--run-dir", tmp_path / "run",
                       "--set", "params.steps=30")
    assert result.returncode == 0, result.stdout + result.stderr
    out = json.loads((tmp_path / "run" / "result.json").read_text())
    assert out["replicas_in_sync"] is True and out["devices"] == 4

    features, per_device, lr = 8, 64, 0.1
    true_w = np.random.default_rng(0).normal(size=features).astype(np.float32)
    xs, ys = [], []
    for rank in range(2):  # the job's data, rebuilt: 2 processes x 2 devices
        rng = np.random.default_rng([0, 1 + rank])  # params.seed 0
        x = rng.normal(size=(2, per_device, features)).astype(np.float32)
        xs.append(x.reshape(-1, features))
        ys.append((x @ true_w + 0.5 + 0.01 * rng.normal(size=(2, per_device)).astype(np.float32)).reshape(-1))
    x, y = np.concatenate(xs).astype(np.float64), np.concatenate(ys).astype(np.float64)
    w, b = np.zeros(features), 0.0
    for _ in range(30):
        residual = x @ w + b - y
        loss = np.mean(residual ** 2)  # the job reports the loss of its last step, before the update
        w, b = w - lr * 2 * x.T @ residual / len(y), b - lr * 2 * residual.mean()
    assert out["b"] == pytest.approx(b, abs=1e-4)
    assert out["final_loss"] == pytest.approx(loss, rel=1e-3)
    assert out["final_loss"] < out["first_loss"] / 10


def test_sharded_mlp_matches_numpy_backprop(tmp_path):
    """Model-parallel weights, data-parallel processes: the final weights equal plain NumPy
    gradient descent on both processes' data."""
    import sys
    sys.path.insert(0, str(JOBS))
    from sharded_mlp import batch, init

    result = jaxlaunch("run", JOBS / "sharded_mlp.yaml", "--run-dir", tmp_path / "run", "--set", "params.steps=5")
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
    """The job checks JAX against NumPy itself; here: it runs and reports every method."""
    result = jaxlaunch("run", JOBS / "bench_matmul.yaml", "--run-dir", tmp_path / "run",
                       "--set", "params.shapes=[[2, 32, 32, 32]]", "--set", "params.repeats=3")
    assert result.returncode == 0, result.stdout + result.stderr
    row = json.loads((tmp_path / "run" / "bench.json").read_text())["rows"][0]
    assert row["shape"] == [2, 32, 32, 32]
    assert set(row["seconds"]) == {"numpy (BLAS)", "jax.jit", "jax.jit, dispatch only (wrong)"}
