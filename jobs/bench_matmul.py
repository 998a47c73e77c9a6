"""Batched matmul: jitted JAX against NumPy's BLAS, timed correctly, side by side in one run.

JAX dispatches asynchronously: a call returns before the computation has run. Timing it without
`block_until_ready` measures only the dispatch; the "dispatch only" column shows that number so
the difference is visible. Correct figures: warm-up (and compilation) excluded, block_until_ready
on every repeat, median of repeats. Every process runs the same benchmark; rank 0 reports.
"""

import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from launcher.rundir import atomic_write_bytes

DEFAULT_SHAPES = [[256, 64, 64, 64], [32, 256, 256, 256], [4, 1024, 1024, 1024]]  # batch, m, k, n


def median_seconds(call, repeats, block=True):
    for _ in range(3):
        jax.block_until_ready(call())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = call()
        if block:
            jax.block_until_ready(out)
        times.append(time.perf_counter() - start)
    jax.block_until_ready(out)
    return float(np.median(times))


def main(ctx):
    shapes = ctx.params.get("shapes", DEFAULT_SHAPES)
    repeats = int(ctx.params.get("repeats", 20))
    matmul = jax.jit(jnp.matmul)
    rows = []
    for batch, m, k, n in shapes:
        rng = np.random.default_rng(ctx.rank)
        a = rng.standard_normal((batch, m, k), dtype=np.float32)
        b = rng.standard_normal((batch, k, n), dtype=np.float32)
        a_dev, b_dev = jax.device_put(a, ctx.local_devices[0]), jax.device_put(b, ctx.local_devices[0])
        np.testing.assert_allclose(np.asarray(matmul(a_dev, b_dev)), np.matmul(a, b), rtol=2e-3, atol=2e-3)
        flops = 2.0 * batch * m * k * n
        seconds = {
            "numpy (BLAS)": median_seconds(lambda: np.matmul(a, b), repeats),
            "jax.jit": median_seconds(lambda: matmul(a_dev, b_dev), repeats),
            "jax.jit, dispatch only (wrong)": median_seconds(lambda: matmul(a_dev, b_dev), repeats, block=False),
        }
        rows.append({"shape": [batch, m, k, n], "seconds": seconds,
                     "gflops": {name: flops / t / 1e9 for name, t in seconds.items()}})
    table = format_table(rows)
    if ctx.is_main:
        print(table, flush=True)
        atomic_write_bytes(ctx.run_dir / "bench.json", json.dumps({"rows": rows, "jax": jax.__version__,
                                                                  "numpy": np.__version__}, indent=2).encode())
    return {"rows": rows, "table": table}


def format_table(rows):
    names = list(rows[0]["seconds"])
    lines = ["| batch x m x k x n | " + " | ".join(names) + " |", "|" + "---|" * (len(names) + 1)]
    for row in rows:
        cells = [f"{row['seconds'][n] * 1e3:.3f} ms ({row['gflops'][n]:.1f} GFLOP/s)" for n in names]
        lines.append(f"| {' x '.join(map(str, row['shape']))} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
