"""JAX's own multi-process runtime (jax.distributed) in a rank: the coordinator's address, chosen
once per attempt; jaxlaunch's own start of it (spec key jax_distributed); and the answer to a
program that calls `jax.distributed.initialize()` itself, with no arguments, as it would on a
TPU pod or under srun.

JAX 0.10 cannot find its process ids under Open MPI 5's mpirun (jax#40512), and under mpirun in
a Slurm allocation its Slurm detection reads the batch step's variables: wrong ids, and a
device binding of its own on top of ours. So the rank wraps `jax.distributed.initialize`: the
arguments a program leaves out are filled from jaxlaunch's (coordinator, process count and id,
the spec's jax_distributed_timeout, the bind address), and JAX's cluster detection is switched
off for them. Arguments the program gives win.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import inspect
import logging
import os
import socket
import sys
import time

logger = logging.getLogger("jaxlaunch.rank")


def coordinator_address(comm) -> str:
    """host:port for JAX's coordinator (and MASTER_ADDR/MASTER_PORT), the same on every rank:
    rank 0 picks a free port on its host and broadcasts it. 127.0.0.1 when every rank runs on
    rank 0's host, else that host's address. Collective: every rank calls it."""
    hosts = comm.allgather(socket.gethostname())
    address = None
    if comm.Get_rank() == 0:
        host = "127.0.0.1" if len(set(hosts)) == 1 else socket.gethostbyname(socket.gethostname())
        with socket.socket() as probe:
            probe.bind((host, 0))
            port = probe.getsockname()[1]
        address = f"{host}:{port}"
    return comm.bcast(address, root=0)


def bind_address(address: str) -> str:
    """Where the coordinator listens. JAX's coordination service is unauthenticated, and by
    default listens on every interface ([::]:port), where every user of a shared cluster can
    reach it: it binds to the address the ranks use instead (JAX_COORDINATOR_BIND_ADDRESS, when
    set, still wins)."""
    return os.environ.get("JAX_COORDINATOR_BIND_ADDRESS") or address


def use_gloo_on_cpu(jax, platform: str) -> None:
    """Cross-process computations on CPU need a collectives implementation (gloo)."""
    if platform == "cpu":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")


def start_jax_distributed(jax, address: str, size: int, rank: int, platform: str, timeout: int = 900) -> float:
    """jaxlaunch's own start (jax_distributed: true). Every process gets `timeout` seconds to
    connect (the spec's jax_distributed_timeout). Returns the seconds it took."""
    started = time.perf_counter()
    use_gloo_on_cpu(jax, platform)
    jax.distributed.initialize(coordinator_address=address, num_processes=size, process_id=rank,
                               initialization_timeout=int(timeout), coordinator_bind_address=bind_address(address))
    return time.perf_counter() - started


# jax.distributed.shutdown() waits for every process (JAX's own limit is 300 s, and a process that
# never arrives, or a coordinator already gone, can hold it longer): a rank whose work is done
# gives it this long, then exits without it (Marin's lesson: shut down cleanly, but never hang on it).
SHUTDOWN_SECONDS = 60.0


def shutdown_jax_distributed(timeout: float = SHUTDOWN_SECONDS) -> float | None:
    """After a successful entrypoint: jax.distributed.shutdown() on this rank, within `timeout`
    seconds. Returns the seconds it took; None when the runtime was not running. On timeout it is
    abandoned (logged), and the rank's exit skips the exit handlers, where JAX would wait again."""
    jax = sys.modules.get("jax")
    if jax is None or not jax.distributed.is_initialized():
        return None
    import threading

    started = time.perf_counter()
    done = threading.Event()

    def shut_down():
        try:
            jax.distributed.shutdown()
        except Exception as exc:  # noqa: BLE001  (a peer gone first: nothing left to shut down)
            logger.warning("jax.distributed.shutdown() failed: %s", exc)
        done.set()

    threading.Thread(target=shut_down, name="jaxlaunch-jax-shutdown", daemon=True).start()
    if not done.wait(timeout):
        global SHUTDOWN_ABANDONED
        SHUTDOWN_ABANDONED = True
        logger.warning("jax.distributed.shutdown() did not return within %g s; this rank exits without it", timeout)
    return time.perf_counter() - started


SHUTDOWN_ABANDONED = False  # read by exit.run_exit_handlers: then JAX's own handler is left out (it would wait again)


class InitializeAnswer:
    """What `jax.distributed.initialize` does in a rank once wrapped (see the module's doc).

    started_by_jaxlaunch: jax_distributed is true, so jaxlaunch started the runtime before the
    entrypoint; a program's own call then does nothing (JAX itself would raise "should only be
    called once"), unless it asks for another process count or id. jax_started: a callable
    saying whether jaxlaunch started JAX's backend before the entrypoint could call initialize
    (a function entrypoint: always; a program: once it called launcher.context())."""

    def __init__(self, address: str, size: int, rank: int, platform: str, timeout: int,
                 started_by_jaxlaunch: bool, jax_started, on_started=None):
        self.address, self.size, self.rank = address, size, rank
        self.platform, self.timeout = platform, int(timeout)
        self.started_by_jaxlaunch = started_by_jaxlaunch
        self.jax_started = jax_started
        self.on_started = on_started  # called with the seconds initialize took

    def arguments(self, given: dict) -> dict:
        """The arguments JAX gets: the program's, and jaxlaunch's for the ones it left out."""
        filled = dict(given)
        ours = {"coordinator_address": os.environ.get("JAX_COORDINATOR_ADDRESS") or self.address,
                "num_processes": self.size, "process_id": self.rank}
        for key, value in ours.items():
            if filled.get(key) is None:
                filled[key] = value
        if "initialization_timeout" not in given:
            filled["initialization_timeout"] = self.timeout
        if filled.get("coordinator_bind_address") is None and filled["coordinator_address"] == self.address:
            filled["coordinator_bind_address"] = bind_address(self.address)
        if given.get("cluster_detection_method") is None and given.get("local_device_ids") is None:
            # jaxlaunch has bound this rank's devices (CUDA_VISIBLE_DEVICES); JAX's Slurm
            # detection would bind SLURM_LOCALID's GPU on top, which no longer exists.
            filled["cluster_detection_method"] = "deactivate"
        return filled

    def wrap(self, original):
        signature = inspect.signature(original)

        @functools.wraps(original)
        def initialize(*args, **kwargs):
            given = signature.bind_partial(*args, **kwargs).arguments
            if self.started_by_jaxlaunch:
                wrong = [f"{key}={given[key]!r} (jaxlaunch has {mine})" for key, mine in
                         (("num_processes", self.size), ("process_id", self.rank)) if given.get(key) not in (None, mine)]
                if wrong:
                    raise RuntimeError(f"jax.distributed.initialize({', '.join(wrong)}): jaxlaunch already started "
                                       f"jax.distributed for {self.size} processes (spec jax_distributed: true). "
                                       f"Fix: call it with no arguments, or set jax_distributed: false and let "
                                       f"the program start it")
                logger.info("jax.distributed.initialize(): already started by jaxlaunch (jax_distributed: true); "
                            "this call does nothing")
                return None
            if self.jax_started():
                raise RuntimeError(
                    "jax.distributed.initialize() must come before JAX starts its backend, and jaxlaunch "
                    "started it to give the job its devices (a main(ctx) function, or launcher.context() "
                    "called first). Fix: set jax_distributed: true in the spec (jaxlaunch then starts "
                    "jax.distributed before the job's code), or call launcher.context() after initialize")
            import jax

            use_gloo_on_cpu(jax, self.platform)
            started = time.perf_counter()
            result = original(**self.arguments(given))
            if self.on_started is not None:
                self.on_started(time.perf_counter() - started)
            return result

        initialize.jaxlaunch_answer = self
        return initialize

    def install(self) -> None:
        """Wrap jax.distributed.initialize now if JAX is imported, else the moment it is: the
        rank must not import JAX before a program runs (it may set JAX_PLATFORMS or XLA_FLAGS
        first, as scripts do)."""
        module = sys.modules.get("jax.distributed")
        if module is not None:
            self._wrap_module(module)
        else:
            sys.meta_path.insert(0, AfterImport("jax.distributed", self._wrap_module))

    def _wrap_module(self, module) -> None:
        if not hasattr(module.initialize, "jaxlaunch_answer"):
            module.initialize = self.wrap(module.initialize)


class AfterImport(importlib.abc.MetaPathFinder):
    """Calls `callback(module)` once the module `name` has been executed by its own loader."""

    def __init__(self, name: str, callback):
        self.name, self.callback = name, callback

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # once: the module is imported once
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run_module, callback = spec.loader.exec_module, self.callback

        def exec_module(module):
            run_module(module)
            callback(module)
        spec.loader.exec_module = exec_module
        return spec
