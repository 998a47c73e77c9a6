"""What jobs/benchmarks/bench_scale.py runs at each rank count: one of three probes (params.probe).

- "failfast": every rank notes when its main began (the start-up figure), times
  ctx.should_stop() (params.calls calls, after a warm-up), rank 0 writes both to probe.json, then
  the last rank raises while the others wait in an allreduce (the fail-fast figure: from
  raised.json's time to the job's end in status.json).
- "hang": the last rank sleeps outside any collective while the others wait in an allreduce; the
  spec's collective_timeout fires (the hang report figure: from hang.json's time to the end,
  less collective_timeout).
- "preempt": every rank calls ctx.should_stop() every 20 ms until it says True (the driver sends
  the notice; the round trip is from the notice to the supervisor's 'stopped' event).
Every file is written atomically, once, by one rank: no polling, no effect on the timings.
"""

import json
import os
import time

import numpy as np

import launcher


def _write(path, value):
    tmp = path.with_name("." + path.name + ".tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)


def main(ctx):
    began = time.time()
    probe = ctx.params["probe"]
    last = ctx.size - 1
    began_all = launcher.allgather(np.array([began]))  # also the first collective: everyone is up
    if probe == "failfast":
        for _ in range(10):
            ctx.should_stop()
        calls = int(ctx.params.get("calls", 200))
        start = time.perf_counter()
        for _ in range(calls):
            ctx.should_stop()
        per_call = (time.perf_counter() - start) / calls
        costs = launcher.allgather(np.array([per_call]))
        if ctx.rank == 0:
            _write(ctx.run_dir / "probe.json", {"main_began": np.asarray(began_all).ravel().tolist(),
                                                "should_stop_seconds": np.asarray(costs).ravel().tolist()})
        launcher.allreduce(np.ones(1))  # probe.json is written before anyone fails
        if ctx.rank == last:
            _write(ctx.run_dir / "raised.json", {"time": time.time()})
            raise RuntimeError(f"rank {ctx.rank} failed on purpose")
        launcher.allreduce(np.ones(1))
    elif probe == "hang":
        if ctx.rank == last:
            _write(ctx.run_dir / "hang.json", {"time": time.time()})
            time.sleep(3600)
        launcher.allreduce(np.ones(1))
    elif probe == "preempt":
        if ctx.rank == 0:
            _write(ctx.run_dir / "polling.json", {"time": time.time()})
        while not ctx.should_stop():
            time.sleep(0.02)
    else:
        raise ValueError(f"unknown probe {probe!r}")
    return {"probe": probe}
