"""Entry point of every rank: `python -m launcher.rank.bootstrap` (started by mpirun or srun).

Order matters: MPI and the device environment are set up BEFORE JAX is imported, because JAX
reads XLA_FLAGS / CUDA_VISIBLE_DEVICES once, at import. For a script or module entrypoint the
rank does not start JAX at all (unless jax_distributed is true): the program does, and may call
jax.distributed.initialize() first, which jax_runtime.py answers with jaxlaunch's coordinator.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import time
import traceback

from ..environment import ATTEMPT_ENV, RUN_DIR_ENV  # noqa: F401  (also re-exported)
from . import program
from .program import JOB_MODULE_PREFIX, load_entrypoint  # noqa: F401  (also re-exported)
from .topology import node_name


def program_environment(topology, coordinator: str, spec_env: dict) -> dict[str, str]:
    """The variables torchrun-style code reads (torchrun sets the same names), and JAX's
    coordinator address: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, NODE_RANK, GROUP_RANK,
    MASTER_ADDR, MASTER_PORT, JAX_COORDINATOR_ADDRESS. A coordinator the spec's env sets wins."""
    host, _, port = coordinator.rpartition(":")
    env = {"RANK": topology.rank, "LOCAL_RANK": topology.local_rank, "WORLD_SIZE": topology.size,
           "LOCAL_WORLD_SIZE": topology.local_size, "NODE_RANK": topology.node_index,
           "GROUP_RANK": topology.node_index}
    coordinator_env = {"MASTER_ADDR": host, "MASTER_PORT": port, "JAX_COORDINATOR_ADDRESS": coordinator}
    env.update({key: value for key, value in coordinator_env.items() if key not in spec_env})
    return {key: str(value) for key, value in env.items()}


def exception_summary(exc: BaseException) -> str:
    """`Type: first line of the message`. Not traceback's last line: JAX appends a note ("For
    simplicity, JAX has removed its internal frames...") that would hide the error itself."""
    if isinstance(exc, SystemExit):
        return f"SystemExit: sys.exit({exc.code!r}) called"
    kind = type(exc)
    module = kind.__module__.removeprefix(JOB_MODULE_PREFIX)  # a job file's module: its file name
    name = kind.__qualname__ if module in ("builtins", "__main__") else f"{module}.{kind.__qualname__}"
    message = str(exc).strip().splitlines()
    return f"{name}: {message[0]}" if message else name


def _job_frames(tb):
    """The traceback from the job's own first frame on: the frames of this bootstrap, of running
    the program (program.py) and of runpy say nothing about the job's error."""
    skipped = tb
    while skipped is not None and (skipped.tb_frame.f_code.co_filename in _LAUNCH_FILES
                                   or skipped.tb_frame.f_code.co_filename.startswith("<frozen runpy")):
        skipped = skipped.tb_next
    return skipped or tb


def _fail(comm, output, run, rank: int, exc: BaseException, exit_code: int = 1, step=None) -> None:
    """Show the traceback, keep it in the run directory, and bring the whole job down.

    Without MPI_Abort the other ranks would wait forever in their next collective.
    """
    text = "".join(traceback.format_exception(type(exc), exc, _job_frames(exc.__traceback__)))
    try:
        if run is not None:  # first line: the one-line summary `jaxlaunch run` prints
            summary = exception_summary(exc)
            run.rank_error(rank).write_text(f"{summary}\n\n{text}")
            from ..rundir import atomic_write_json

            atomic_write_json(run.rank_error_record(rank), {
                "rank": rank, "host": node_name(os.environ), "pid": os.getpid(), "time": time.time(),
                "exit_code": exit_code, "signal": None, "error": summary, "traceback": text,
                "kind": "exit" if isinstance(exc, SystemExit) else "exception",
                "step": step if isinstance(step, int) else None,  # the last step it reported
            })
        # What python itself prints: the traceback, or for sys.exit(N) nothing (for sys.exit("msg"), msg).
        shown = text
        if isinstance(exc, SystemExit):
            shown = "" if exc.code is None or isinstance(exc.code, int) else f"{exc.code}\n"
        if output is not None:
            output.stop()
            if shown:
                output.write_direct(shown)
        elif shown:
            sys.stderr.write(shown)
            sys.stderr.flush()
    finally:
        if comm is not None and comm.Get_size() > 1:
            comm.Abort(exit_code)
        os._exit(exit_code)


def setup_devices(spec, topology, env) -> dict[str, str]:
    """The device environment of this rank, chosen by its LOCAL rank (never the global one: rank 5
    of a 4-GPU node must take GPU 1, not GPU 5)."""
    from .topology import device_environment

    return device_environment(spec.platform, spec.devices_per_process, topology.local_rank, env, spec.hang_timeout)


def _job_context(spec, run, comm, topology, monitor):
    """The rank's JobContext, with its devices: this starts JAX's backend (jax.local_devices)."""
    import jax  # noqa: E402  (after the device environment, on purpose)
    import numpy as np
    from jax.sharding import Mesh

    from .checkpoints import Checkpoints
    from .context import DEVICE_AXIS, JobContext

    try:
        devices = jax.local_devices()
    except (AssertionError, RuntimeError) as exc:  # JAX's words for no CUDA: a bare AssertionError
        if spec.platform != "gpu":
            raise
        from .topology import BINDING_FIX, GPU_FIX, binding_beyond_node, missing_for_gpu

        beyond = binding_beyond_node(os.environ.get("CUDA_VISIBLE_DEVICES"), topology.local_rank)
        if beyond:
            raise RuntimeError(f"platform: gpu, on {socket.gethostname()}: {beyond}. Fix: {BINDING_FIX}") from None
        why = missing_for_gpu() or f"JAX could not start its CUDA backend ({exc!r})"
        raise RuntimeError(f"platform: gpu, but on {socket.gethostname()}: {why}. Fix: {GPU_FIX}") from None
    mesh = Mesh(np.array(devices), (DEVICE_AXIS,))
    return JobContext(rank=topology.rank, size=topology.size, local_rank=topology.local_rank,
                      local_size=topology.local_size, node_index=topology.node_index,
                      num_nodes=topology.num_nodes, local_devices=devices, mesh=mesh, run_dir=run.path,
                      params=dict(spec.params), attempt=int(os.environ.get(ATTEMPT_ENV, "0")),
                      checkpoints=Checkpoints(run.checkpoints, keep=spec.keep_checkpoints, rank=topology.rank,
                                              comm=comm.Clone(), devices=devices, mesh=mesh,
                                              asynchronous=spec.async_checkpoints),
                      progress=monitor.progress)


_LAUNCH_FILES = {__file__, program.__file__}
NO_RESULT = object()  # a script or module that never called set_result


def process_started() -> float | None:
    """When this process started (seconds since the epoch), from Linux's /proc; None elsewhere."""
    try:
        ticks = int(open("/proc/self/stat").read().rpartition(")")[2].split()[19])  # field 22: since boot
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - age
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def main() -> None:
    from .preemption import NOTICE, install_usr2_handler

    # A preemption notice, before anything else can be interrupted by it: MPI_Init below takes a
    # second under load, and SIGUSR2's default action would end the rank (seen in CI).
    install_usr2_handler()
    # The start-up budget (launcher/rundir/goodput.py): when each phase of this rank's start ended.
    startup = {"process": process_started()}
    from mpi4py import MPI  # MPI_Init happens here; JAX is not imported yet

    startup["mpi"] = time.time()

    from ..rundir import RunDirectory
    from .channel import ControlClient
    from .monitor import RankMonitor
    from .output import RankOutput
    from .topology import Topology, local_rank_from_env, node_index_from_local_ranks

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    output = run = monitor = None
    try:
        run = RunDirectory(os.environ[RUN_DIR_ENV])
        output = RankOutput(run.rank_log(rank), rank).start()
        # jaxlaunch's own lines through its own logger and handler: the root logger, its level and
        # handlers are the program's (a logging.basicConfig of its own takes effect, as under python).
        logger = jaxlaunch_logger()
        spec = run.read_spec()  # the model only (launcher.spec loads lazily): no YAML loader in the ranks
        monitor = RankMonitor(run, rank, size, spec.collective_timeout, client=ControlClient.from_env(rank)).start()

        local = local_rank_from_env(os.environ)
        if local is None:  # no launcher variable: ask MPI which ranks share this host
            shared = comm.Split_type(MPI.COMM_TYPE_SHARED)
            local = (shared.Get_rank(), shared.Get_size())
        local_rank, local_size = local
        node_index, num_nodes = node_index_from_local_ranks(rank, comm.allgather(local_rank))
        topology = Topology(rank=rank, size=size, local_rank=local_rank, local_size=local_size or 1,
                            node_index=node_index, num_nodes=num_nodes)

        os.environ.update(setup_devices(spec, topology, os.environ))
        if spec.platform == "gpu":  # MPI reads GPU memory only where doctor's probe said it can
            from .topology import cuda_mpi_environment

            os.environ.update(cuda_mpi_environment(os.environ, MPI.Get_library_version()))
        from . import compile_cache

        # JAX's persistent cache, shared by the job's attempts: set before JAX is imported.
        cache = compile_cache.cache_folder(spec.compile_cache, run.path, spec.platform)
        os.environ.update(compile_cache.environment(cache, os.environ,
                                                    private_parent=spec.compile_cache == compile_cache.RUN_DIR_CACHE))
        compile_cache.count_after_jax_import()
        from .jax_runtime import InitializeAnswer, coordinator_address
        from .jax_runtime import start_jax_distributed as start_runtime

        address = coordinator_address(comm)  # one per attempt: a requeued job never reads the last one's
        os.environ.update(program_environment(topology, address, spec.env))
        os.environ["JAXLAUNCH_TRANSPORT"] = spec.collectives_transport()[0]  # collectives/choice.py reads it
        if spec.preemption_signal is not None:
            NOTICE.deliver = getattr(signal, spec.preemption_signal)

        from ..rundir.results import write_result
        from .context import RESULT, context_built, set_context
        from .program import run_program, succeeded

        def log_runtime_start(seconds: float, by: str = "jaxlaunch") -> None:
            if rank == 0:
                run.log_event("jax_distributed", seconds=round(seconds, 3), processes=size, started_by=by)

        if spec.jax_distributed:
            import jax  # noqa: E402  (after the device environment, on purpose)

            log_runtime_start(start_runtime(jax, address, size, rank, spec.platform, spec.jax_distributed_timeout))
            startup["jax_distributed"] = time.time()
        # A program's own jax.distributed.initialize() gets jaxlaunch's coordinator and timeout.
        InitializeAnswer(address, size, rank, spec.platform, spec.jax_distributed_timeout,
                         started_by_jaxlaunch=spec.jax_distributed,
                         jax_started=(lambda: True) if not spec.runs_program else context_built,
                         on_started=lambda seconds: log_runtime_start(seconds, "program")).install()
        from .preflight import run_preflight

        # Before the job's code: all ranks must run the same software on the devices they should.
        if spec.runs_program:  # a program starts JAX itself (maybe jax.distributed first): no devices yet
            run_preflight(comm, run, rank, None, None, spec.platform)
            set_context(build=lambda: _job_context(spec, run, comm, topology, monitor))
        else:
            ctx = _job_context(spec, run, comm, topology, monitor)
            startup["devices"] = time.time()  # JAX imported, its backend and devices up
            run_preflight(comm, run, rank, ctx.local_devices, spec.devices_per_process)
            set_context(ctx)
        startup["preflight"] = time.time()
        code = run.code if spec.snapshot else None
        function = None if spec.runs_program else load_entrypoint(spec.entrypoint, code)
        if rank == 0:
            run.log_event("main_started", attempt=int(os.environ.get(ATTEMPT_ENV, "0")),  # start-up ends here
                          transport=os.environ["JAXLAUNCH_TRANSPORT"],
                          startup={k: round(v, 3) for k, v in startup.items() if v is not None})
        started = time.perf_counter()
        value = None
        try:
            if spec.runs_program:
                run_program(spec.entrypoint, spec.entrypoint_kind, spec.args, code)
            else:
                value = function(ctx)
        except SystemExit as exc:
            if not succeeded(exc):
                raise  # sys.exit(0) ends the entrypoint successfully, like a return
        if value is None:  # what set_result() gave; a program that set none has no result at all
            value = RESULT.get("value", NO_RESULT if spec.runs_program else None)
        # Let asynchronously dispatched mpi4jax calls finish before exit (mpi4jax issue #22).
        collectives = sys.modules.get("launcher.rank.collectives")
        if collectives:
            collectives.wait_pending()
        elif "jax" in sys.modules:  # a program's own mpi4jax calls too (starts no backend)
            sys.modules["jax"].effects_barrier()
        if context_built():
            from .context import context

            context().checkpoints.wait()  # a save still being written: on disk (or its error raised) before the end
        if rank == 0 and compile_cache.COUNTER.listening and os.environ.get("JAX_COMPILATION_CACHE_DIR"):
            run.log_event("compile_cache", folder=os.environ["JAX_COMPILATION_CACHE_DIR"], **compile_cache.COUNTER.counts)
        from .exit import join_threads_as_python_does, run_exit_handlers
        from .jax_runtime import shutdown_jax_distributed

        def threads_hold_the_exit(threads: list[dict]) -> None:
            names = "; ".join(f"{t['name']} at {t['where']}" for t in threads)
            logger.warning("the program has returned, but its process waits for %d non-daemon thread(s) "
                           "to end, as python would: %s", len(threads), names)
            run.log_event("exit_waiting", rank=rank, threads=threads)

        # The program's end, as python's: its threads' exit hooks and non-daemon threads first.
        join_threads_as_python_does(threads_hold_the_exit)
        # JAX's runtime, ours or the program's, shut down on every rank while the monitor still answers.
        shutdown_seconds = shutdown_jax_distributed()
        if shutdown_seconds is not None and rank == 0:
            run.log_event("jax_distributed_shutdown", seconds=round(shutdown_seconds, 3))
        monitor.stop()
        monitor.finish()
        if NOTICE.stopped is not None:
            # Stopped after a preemption notice: the work is not finished, so there is no result;
            # the run resumes from its checkpoint.
            how = (f"at should_stop() call {NOTICE.agreed['call']}" if NOTICE.agreed is not None
                   else f"after the notice was delivered as {NOTICE.delivered['signal']}")
            logger.info("stopped after a preemption notice (%s) %s, after %.2f s",
                        ", ".join(NOTICE.agreed["sources"] if NOTICE.agreed else NOTICE.names(NOTICE.sources)),
                        how, time.perf_counter() - started)
        else:
            if rank == 0 and value is not NO_RESULT:
                write_result(run, value)
            logger.info("entrypoint finished in %.2f s", time.perf_counter() - started)
        # The program's atexit handlers (and JAX's), while their lines still carry the rank's prefix.
        run_exit_handlers()
        output.stop()
    except SystemExit as exc:
        from .program import exit_code

        _fail(comm, output, run, rank, exc, exit_code(exc), step=_last_step(monitor))
    except BaseException as exc:  # noqa: BLE001  (any failure must abort every rank)
        _fail(comm, output, run, rank, exc, step=_last_step(monitor))


def _last_step(monitor) -> int | None:
    return getattr(getattr(monitor, "progress", None), "last_step", None)


def jaxlaunch_logger() -> logging.Logger:
    """The `jaxlaunch` logger (ctx.logger is its child `jaxlaunch.job`): INFO and up to stderr,
    with a handler of its own, not through the root logger, which is the program's."""
    logger = logging.getLogger("jaxlaunch")
    if not any(getattr(h, "jaxlaunch", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        handler.jaxlaunch = True
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger


def fast_exit(code: int = 0) -> None:
    """End the rank without CPython's interpreter teardown, which costs ~0.5 s with JAX loaded
    (measured: `python -c "import jax, mpi4jax; jax.devices()"` 2.33 s, with this 1.83 s). What
    python's exit does before that teardown was done by main (launcher/rank/exit.py: the threading
    hooks, non-daemon threads, atexit); what is left is a flush of every open Python file (a job
    that wrote without closing keeps its data) and MPI_Finalize. Called only once the job's
    result and done-file are written."""
    import gc
    import io

    is_file: dict[type, bool] = {}  # per type, not isinstance per object: ~15 ms instead of ~90 ms
    for obj in gc.get_objects():
        kind = type(obj)
        if is_file.setdefault(kind, issubclass(kind, io.IOBase)):
            try:
                if not obj.closed and obj.writable():
                    obj.flush()
            except (OSError, ValueError):
                pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    from mpi4py import MPI

    if MPI.Is_initialized() and not MPI.Is_finalized():
        MPI.Finalize()
    os._exit(code)


if __name__ == "__main__":
    main()
    fast_exit(0)
