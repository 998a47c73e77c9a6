"""Entry point of every rank: `python -m launcher.rank.bootstrap` (started by mpirun or srun).

Order matters: MPI and the device environment are set up BEFORE JAX is imported, because JAX
reads XLA_FLAGS / CUDA_VISIBLE_DEVICES once, at import.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import socket
import sys
import time
import traceback
from pathlib import Path

from ..environment import ATTEMPT_ENV, RUN_DIR_ENV  # noqa: F401  (also re-exported)
from .topology import node_name

JOB_MODULE_PREFIX = "jaxlaunch_job_"  # job files are imported as modules named jaxlaunch_job_<stem>


def load_entrypoint(entrypoint: str, code: Path | None = None):
    """The function named by 'pkg.module:function' or '/abs/path/file.py:function'. `code`: the
    run's snapshot of the job's code (spec key snapshot), searched first for modules."""
    target, _, function = entrypoint.rpartition(":")
    if code is not None:
        sys.path.insert(0, str(code))
    if target.endswith(".py"):
        path = Path(target)
        sys.path.insert(0, str(path.parent))  # let the job import its sibling modules
        spec = importlib.util.spec_from_file_location(f"{JOB_MODULE_PREFIX}{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    else:
        sys.path.insert(1 if code is not None else 0, os.getcwd())
        module = importlib.import_module(target)
    try:
        return getattr(module, function)
    except AttributeError:
        raise AttributeError(f"entrypoint {entrypoint!r}: {target} has no function {function!r}") from None


def start_jax_distributed(jax, comm, platform: str, timeout: int = 900) -> float:
    """jax.distributed.initialize with its coordinator found through MPI: rank 0 picks a free
    port and broadcasts host:port (JAX 0.10 does not detect Open MPI 5's mpirun by itself).
    Every process gets `timeout` seconds to connect (the spec's jax_distributed_timeout).

    JAX's coordination service is unauthenticated, and by default listens on every interface
    ([::]:port), where every user of a shared cluster can reach it. It binds to the address the
    ranks use instead: 127.0.0.1 when every rank runs on rank 0's host, else that host's address
    (JAX_COORDINATOR_BIND_ADDRESS, when set, still wins). Returns the seconds it took."""
    started = time.perf_counter()
    hosts = comm.allgather(socket.gethostname())
    address = None
    if comm.Get_rank() == 0:
        host = "127.0.0.1" if len(set(hosts)) == 1 else socket.gethostbyname(socket.gethostname())
        with socket.socket() as probe:
            probe.bind((host, 0))
            port = probe.getsockname()[1]
        address = f"{host}:{port}"
    address = comm.bcast(address, root=0)
    if platform == "cpu":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=address, num_processes=comm.Get_size(),
                               process_id=comm.Get_rank(), initialization_timeout=int(timeout),
                               coordinator_bind_address=os.environ.get("JAX_COORDINATOR_BIND_ADDRESS") or address)
    return time.perf_counter() - started


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


def _fail(comm, output, run, rank: int, exc: BaseException, exit_code: int = 1) -> None:
    """Show the traceback, keep it in the run directory, and bring the whole job down.

    Without MPI_Abort the other ranks would wait forever in their next collective.
    """
    text = "".join(traceback.format_exception(exc))
    try:
        if run is not None:  # first line: the one-line summary `jaxlaunch run` prints
            summary = exception_summary(exc)
            run.rank_error(rank).write_text(f"{summary}\n\n{text}")
            from ..rundir import atomic_write_json

            atomic_write_json(run.rank_error_record(rank), {
                "rank": rank, "host": node_name(os.environ), "pid": os.getpid(), "time": time.time(),
                "exit_code": exit_code, "signal": None, "error": summary, "traceback": text,
                "kind": "exit" if isinstance(exc, SystemExit) else "exception",
            })
        if output is not None:
            output.write_direct(text)
            output.stop(timeout=1.0)
        else:
            sys.stderr.write(text)
            sys.stderr.flush()
    finally:
        if comm is not None and comm.Get_size() > 1:
            comm.Abort(exit_code)
        os._exit(exit_code)


def setup_devices(spec, topology, env) -> dict[str, str]:
    """The device environment of this rank, chosen by its LOCAL rank (never the global one: rank 5
    of a 4-GPU node must take GPU 1, not GPU 5)."""
    from .topology import device_environment

    return device_environment(spec.platform, spec.devices_per_process, topology.local_rank, env)


def main() -> None:
    from mpi4py import MPI  # MPI_Init happens here; JAX is not imported yet

    from ..rundir import RunDirectory
    from .channel import ControlClient
    from .monitor import RankMonitor
    from .output import RankOutput
    from .topology import Topology, local_rank_from_env, node_index_from_local_ranks

    from .preemption import NOTICE, install_usr2_handler

    install_usr2_handler()  # a preemption notice, before anything else can be interrupted by it
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    output = run = None
    try:
        run = RunDirectory(os.environ[RUN_DIR_ENV])
        output = RankOutput(run.rank_log(rank), rank).start()
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

        import jax  # noqa: E402  (after the device environment, on purpose)
        import numpy as np
        from jax.sharding import Mesh

        from ..rundir.results import write_result
        from .context import DEVICE_AXIS, JobContext

        if spec.jax_distributed:
            seconds = start_jax_distributed(jax, comm, spec.platform, spec.jax_distributed_timeout)
            if rank == 0:
                run.log_event("jax_distributed", seconds=round(seconds, 3), processes=size)
        try:
            devices = jax.local_devices()
        except (AssertionError, RuntimeError) as exc:  # JAX's words for no CUDA: a bare AssertionError
            if spec.platform != "gpu":
                raise
            from .topology import GPU_FIX, missing_for_gpu

            why = missing_for_gpu() or f"JAX could not start its CUDA backend ({exc!r})"
            raise RuntimeError(f"platform: gpu, but on {socket.gethostname()}: {why}. Fix: {GPU_FIX}") from None
        from .preflight import run_preflight

        # Before the job's code: all ranks must run the same software on the devices they should.
        run_preflight(comm, run, rank, devices, spec.devices_per_process)
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s",
                            stream=sys.stderr)
        from .checkpoints import Checkpoints

        mesh = Mesh(np.array(devices), (DEVICE_AXIS,))
        ctx = JobContext(rank=rank, size=size, local_rank=local_rank, local_size=local_size or 1,
                         node_index=node_index, num_nodes=num_nodes, local_devices=devices,
                         mesh=mesh, run_dir=run.path,
                         params=dict(spec.params), attempt=int(os.environ.get(ATTEMPT_ENV, "0")),
                         checkpoints=Checkpoints(run.checkpoints, keep=spec.keep_checkpoints, rank=rank,
                                                 comm=comm.Clone(), devices=devices, mesh=mesh,
                                                 asynchronous=spec.async_checkpoints),
                         progress=monitor.progress)
        function = load_entrypoint(spec.entrypoint, run.code if spec.snapshot else None)
        if rank == 0:
            run.log_event("main_started", attempt=ctx.attempt)  # start-up ends here (launcher/goodput.py)
        started = time.perf_counter()
        try:
            value = function(ctx)
        except SystemExit as exc:
            if exc.code not in (None, 0):
                raise
            value = None  # sys.exit(0) ends main successfully, like a return
        # Let asynchronously dispatched mpi4jax calls finish before exit (mpi4jax issue #22).
        collectives = sys.modules.get("launcher.rank.collectives")
        collectives.wait_pending() if collectives else jax.effects_barrier()
        ctx.checkpoints.wait()  # a save still being written: on disk (or its error raised) before the end
        monitor.stop()
        monitor.finish()
        if NOTICE.agreed is not None:
            # Stopped at the agreed point after a preemption notice: the work is not finished,
            # so there is no result; the run resumes from its checkpoint.
            ctx.logger.info("stopped after a preemption notice (%s) at should_stop() call %d, after %.2f s",
                            ", ".join(NOTICE.agreed["sources"]), NOTICE.agreed["call"],
                            time.perf_counter() - started)
        else:
            if rank == 0:
                write_result(run, value)
            ctx.logger.info("entrypoint finished in %.2f s", time.perf_counter() - started)
        output.stop()
    except SystemExit as exc:
        _fail(comm, output, run, rank, exc, exc.code if isinstance(exc.code, int) and exc.code else 1)
    except BaseException as exc:  # noqa: BLE001  (any failure must abort every rank)
        _fail(comm, output, run, rank, exc)


def fast_exit(code: int = 0) -> None:
    """End the rank without CPython's interpreter teardown, which costs ~0.5 s with JAX loaded
    (measured: `python -c "import jax, mpi4jax; jax.devices()"` 2.33 s, with this 1.83 s), after
    doing what teardown would have done that matters: the atexit handlers (jax.distributed's
    shutdown among them), a flush of every open Python file (a job that wrote without closing
    keeps its data), MPI_Finalize. Called only once the job's result and done-file are written."""
    import atexit
    import gc
    import io

    atexit._run_exitfuncs()
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
