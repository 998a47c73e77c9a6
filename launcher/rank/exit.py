"""A rank's program ends as it would under `python prog.py`.

CPython's shutdown (Py_FinalizeEx) first calls `threading._shutdown`: the hooks registered with
`threading._register_atexit` (concurrent.futures tells its idle workers to quit there), then it
joins every non-daemon thread; then the `atexit` handlers (the program's, and JAX's, which shuts
jax.distributed down); then it flushes the standard streams. Joining first, as this rank once did,
waits forever on an idle pool worker that a live object holds: orbax's CheckpointManager keeps one.
So the rank calls the interpreter's own `threading._shutdown`, and `atexit`'s own runner, in that
order, while its output still carries the `[rank N]` prefix. Only the interpreter's teardown after
that (~0.5 s with JAX loaded) is skipped: bootstrap.fast_exit.

A program whose threads keep its rank from exiting for EXIT_REPORT_SECONDS is named while it
waits: which threads (name, innermost frame), on the console and in events.jsonl (`exit_waiting`).
"""

from __future__ import annotations

import atexit
import sys
import threading

EXIT_REPORT_SECONDS = 10.0
EXIT_HANDLERS_SECONDS = 10.0  # the exit handlers' bound once jax.distributed's shutdown was abandoned


def waiting_threads() -> list[dict]:
    """The program's non-daemon threads still alive: their names and innermost frames."""
    from .stacks import describe, stack_of

    threads = []
    for thread in threading.enumerate():
        if thread is threading.main_thread() or thread.daemon or not thread.is_alive():
            continue
        stack = stack_of(thread.ident) if thread.ident is not None else []
        threads.append({"name": thread.name, "where": describe(stack[0]) if stack else "(no Python frame)"})
    return threads


def join_threads_as_python_does(report, after: float = EXIT_REPORT_SECONDS) -> None:
    """`threading._shutdown()`: the threading atexit hooks, then every non-daemon thread joined.
    `report(threads)` is called once if that takes longer than `after` seconds."""
    finished = threading.Event()

    def watch() -> None:
        if not finished.wait(after):
            threads = waiting_threads()
            if threads:
                report(threads)

    threading.Thread(target=watch, name="jaxlaunch-exit-watch", daemon=True).start()
    try:
        threading._shutdown()
    finally:
        finished.set()


def run_exit_handlers(bound: float = EXIT_HANDLERS_SECONDS) -> None:
    """The `atexit` handlers, as the interpreter runs them (last registered first; an exception is
    printed and the next handler runs). When jaxlaunch gave up on jax.distributed.shutdown(), JAX's
    own handler would wait for it again: then they run in a thread, and the rank waits `bound`
    seconds for them at most."""
    runtime = sys.modules.get("launcher.rank.jax_runtime")
    if not getattr(runtime, "SHUTDOWN_ABANDONED", False):
        atexit._run_exitfuncs()
        return
    handlers = threading.Thread(target=atexit._run_exitfuncs, name="jaxlaunch-atexit", daemon=True)
    handlers.start()
    handlers.join(bound)
