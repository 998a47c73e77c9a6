"""A job whose rank 1 raises at step `params.fail_at`: on every attempt (`params.on: every`, the
program's own bug) or on the first only (`on: first`, a one-off). For the governor's tests
(launcher/supervisor/governor.py)."""

import time


def main(ctx):
    fail_at, on = int(ctx.params.get("fail_at", 5)), ctx.params.get("on", "every")
    steps = int(ctx.params.get("steps", 10))
    for step in range(steps):
        ctx.report(step, total=steps)
        if step == fail_at and ctx.rank == 1 and (on == "every" or ctx.attempt == 0):
            raise ValueError(f"a batch that cannot be read, at step {step}")
        time.sleep(0.05)
    return {"attempt": ctx.attempt}
