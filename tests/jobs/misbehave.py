"""Rank `params.rank` misbehaves in one of several ways while every other rank waits in
launcher.allreduce; the fail-fast and hang tests run it (tests/e2e/test_supervision.py)."""

import os
import signal
import sys
import time

import numpy as np

import launcher


def _wait_in_allreduce():
    return launcher.allreduce(np.ones(4, np.float32))


def stuck_outside_collectives(seconds):
    """Where a hung rank sits: not in any collective, the hang report must point here."""
    time.sleep(seconds)


def main(ctx):
    how = ctx.params["how"]
    bad_rank = int(ctx.params.get("rank", 1))
    launcher.allreduce(np.ones(2, np.float32))  # everyone completes collective #1 first
    if ctx.rank != bad_rank:
        total = _wait_in_allreduce()  # collective #2: never completes when the bad rank does not come
        return {"total": np.asarray(total).tolist(), "rank": ctx.rank}
    time.sleep(float(ctx.params.get("delay", 0.5)))  # the others are inside allreduce by now
    (ctx.run_dir / f"ready-rank-{ctx.rank}").write_text(str(os.getpid()))
    if how == "raise":
        raise RuntimeError(f"rank {ctx.rank} failed on purpose")
    if how == "exit3":
        sys.exit(3)
    if how == "segfault":
        os.kill(os.getpid(), signal.SIGSEGV)
    if how == "os_exit0":
        os._exit(0)
    if how == "sys_exit0":
        sys.exit(0)
    if how == "return":
        return {"left": "early"}
    if how == "sigkill":  # the test kills this process from outside, as the OOM killer would
        time.sleep(120)
    if how == "hang":
        stuck_outside_collectives(float(ctx.params.get("seconds", 600)))
    if how == "jit_raise":
        import jax
        import jax.numpy as jnp

        @jax.jit
        def f(x):
            return jnp.dot(x, jnp.ones((3, 3)))  # shapes (2,) x (3, 3) do not match
        f(jnp.ones(2))
    raise ValueError(f"unknown how={how!r}")


def exit_at_end(ctx):
    """Every rank does its collectives, then rank 0 calls sys.exit(0) at the very end of main."""
    total = launcher.allreduce(np.float32(ctx.rank + 1))
    if ctx.rank == 0:
        sys.exit(0)
    return {"total": float(total)}


def per_rank_value(ctx):
    """Each rank returns something different: result.json must hold rank 0's."""
    launcher.barrier()
    return {"rank": ctx.rank, "attempt": ctx.attempt}


def fail_first_attempt(ctx):
    """Rank 1 fails on attempt 0; attempt 1 succeeds (restart tests)."""
    launcher.barrier()
    if ctx.attempt == 0 and ctx.rank == 1:
        raise RuntimeError("attempt 0 fails on purpose")
    return {"attempt": ctx.attempt}


def fail_after_result(ctx):
    """Rank 0 returns at once (its result gets written); rank 1 fails a moment later."""
    if ctx.rank == 1:
        time.sleep(1.0)
        raise RuntimeError("rank 1 fails after rank 0 returned")
    return {"rank": 0}


def hang_before_the_first_collective(ctx):
    """Rank `params.rank` stalls before the job's FIRST collective (a rank stuck in start-up, the
    commonest real hang) while the others wait in it. params.case says how they wait:
    `device`: allreduce of a jax array (mpi4jax; on the CPU its dispatch blocks until done);
    `host`: allreduce of a NumPy array (a blocking MPI call);
    `in_flight`: allreduce of a jax array whose result is never used: main returns at once and the
    collective is still in flight while the rank waits for it to finish before exiting."""
    import jax.numpy as jnp

    if ctx.rank == int(ctx.params.get("rank", 1)):
        stuck_outside_collectives(float(ctx.params.get("seconds", 600)))
        return None
    case = ctx.params["case"]
    value = np.ones(4, np.float32) if case == "host" else jnp.ones(4, jnp.float32)
    total = launcher.allreduce(value)
    if case == "in_flight":
        return {"returned": True}
    return {"total": np.asarray(total).tolist()}
