"""A job whose rank `params.fail_rank` raises while every other rank waits in launcher.allreduce."""

import time

import numpy as np

import launcher


class InjectedFailure(RuntimeError):
    pass


def main(ctx):
    if ctx.rank == int(ctx.params.get("fail_rank", 1)):
        time.sleep(float(ctx.params.get("delay", 0.5)))  # the others are inside allreduce by now
        raise InjectedFailure(f"rank {ctx.rank} failed on purpose")
    launcher.allreduce(np.ones(4, np.float32))  # never completes: the failing rank never joins
    return {"unreachable": True}


def sleep(ctx):
    """Sleeps params.seconds; for timeout and cancel tests."""
    print(f"sleeping {ctx.params['seconds']} s", flush=True)
    time.sleep(float(ctx.params["seconds"]))
    return {"slept": ctx.params["seconds"]}


def report(ctx):
    """Returns what the runtime told this rank, for topology tests."""
    import jax
    everyone = launcher.allgather(np.array([ctx.rank, ctx.local_rank, ctx.node_index, ctx.num_nodes,
                                            ctx.num_local_devices], np.int32))
    return {"ranks": everyone.reshape(ctx.size, 5).tolist(), "params": ctx.params,
            "env": {k: v for k, v in __import__("os").environ.items() if k.startswith("JOBTEST_")},
            "platform": jax.devices()[0].platform, "arrays": {"eye": np.eye(2)}}
