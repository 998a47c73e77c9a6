"""A job that runs steadily for a few seconds (collectives, progress reports), then returns a
known result: the control-channel attack tests (tests/e2e/test_control_attacks_job.py) probe its supervisor
while it runs."""

import os
import time

import numpy as np

import launcher


def main(ctx):
    (ctx.run_dir / f"ready-rank-{ctx.rank}").write_text(str(os.getpid()))
    steps = int(ctx.params.get("steps", 40))
    total = 0.0
    for step in range(steps):
        total += float(np.asarray(launcher.allreduce(np.ones(1, np.float32)))[0])
        ctx.report(step, total=steps)
        time.sleep(float(ctx.params.get("step_seconds", 0.1)))
    return {"total": total, "size": ctx.size}
