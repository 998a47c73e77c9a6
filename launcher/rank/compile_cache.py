"""JAX's persistent compilation cache for a job, shared by its attempts, restarts and requeues: a
restarted attempt loads its executables instead of compiling them again.

- Where: RUN_DIR/compile-cache/KEY by default (spec key `compile_cache: run_dir`), or KEY under a
  folder the user chooses (`compile_cache: /scratch/me/jax-cache`, shared by jobs), or off (null).
- KEY names what an executable depends on beyond what JAX's own cache key holds: the jaxlib version,
  the platform, and the machine's kind (the CPU's model and feature flags; on GPU, the GPU models).
  XLA compiles for the host CPU's features: an executable built on a login node with AVX-512 must not
  be loaded on a compute node without it.
- Permissions 0700: a cached executable is code this user will run.
- Every executable is cached (JAX's default skips compiles under 1 s; a job's small steps are what a
  restart recompiles most often), unless the environment sets JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS.
- The rank counts JAX's cache hits and misses (jax.monitoring) and rank 0 writes them to events.jsonl
  (`compile_cache`) when its entrypoint returns.

It is set through JAX's environment variables before JAX is imported, so it works for programs
that import JAX themselves.
"""

from __future__ import annotations

import hashlib
import os
import stat
import platform
import sys
from importlib import metadata
from pathlib import Path

RUN_DIR_CACHE = "run_dir"  # the spec's default: RUN_DIR/compile-cache
FOLDER = "compile-cache"


def machine_kind(platform_name: str) -> str:
    """What the machine's executables depend on: the CPU's model and feature flags, or on GPU the
    GPU models too (from the driver's files; JAX is not imported)."""
    parts = [platform.machine()]
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    for field in ("model name", "flags", "Features"):  # Features: aarch64's flags
        line = next((line for line in text.splitlines() if line.startswith(field)), "")
        parts.append(line.partition(":")[2].strip())
    if platform_name == "gpu":
        for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
            try:
                parts.append(next(line for line in info.read_text().splitlines() if line.startswith("Model")))
            except (OSError, StopIteration):
                pass
    return "\n".join(parts)


def cache_key(platform_name: str) -> str:
    try:
        jaxlib = metadata.version("jaxlib")
    except metadata.PackageNotFoundError:
        jaxlib = "none"
    digest = hashlib.sha256(machine_kind(platform_name).encode()).hexdigest()[:12]
    return f"jaxlib-{jaxlib}-{platform_name}-{digest}"


def cache_folder(setting: str | None, run_path: Path, platform_name: str) -> Path | None:
    """The folder this rank's executables are cached in, or None (off)."""
    if setting is None:
        return None
    base = run_path / FOLDER if setting == RUN_DIR_CACHE else Path(setting)
    return base / cache_key(platform_name)


class UnsafeCacheError(RuntimeError):
    """A cache folder another user owns or can write: its executables are code this user would run."""


def check_cache_folder(path: Path, ours: bool) -> None:
    """UnsafeCacheError unless `path` is safe to load executables from: ours, a real folder (not a
    link) and made 0700 (`ours`: the folders the cache lives in); for the chosen folder above them,
    writable by nobody else unless sticky, as /tmp is (else another user could swap ours for theirs)."""
    info = os.lstat(path)
    fix = "choose a compile_cache folder of your own (or the default, run_dir), or compile_cache: null"
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise UnsafeCacheError(f"compile_cache: {path} is not a folder (a symbolic link or a file). fix: {fix}")
    if ours:
        if info.st_uid != os.geteuid():
            raise UnsafeCacheError(f"compile_cache: {path} belongs to another user (uid {info.st_uid}), and cached "
                                   f"executables are code this job would run. fix: {fix}")
        os.chmod(path, 0o700)  # an existing folder too: mkdir's mode only holds for a new one
    elif info.st_uid != os.geteuid() and stat.S_IMODE(info.st_mode) & 0o022 and not info.st_mode & stat.S_ISVTX:
        raise UnsafeCacheError(f"compile_cache: {path} can be written by other users (mode "
                               f"{stat.S_IMODE(info.st_mode):o}, uid {info.st_uid}): they could replace the cache "
                               f"in it. fix: {fix}")


def environment(folder: Path | None, env, private_parent: bool = False) -> dict[str, str]:
    """JAX's variables for the cache in `folder` (made 0700; `private_parent`: its parent too, the
    run directory's compile-cache/), unless the user set the folder in the environment. Refuses a
    folder that is not safe to load executables from (check_cache_folder)."""
    if folder is None or env.get("JAX_COMPILATION_CACHE_DIR"):
        return {}
    for path in ([folder.parent] if private_parent else []) + [folder]:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not private_parent:
        check_cache_folder(folder.parent, ours=False)
    for path in ([folder.parent] if private_parent else []) + [folder]:
        check_cache_folder(path, ours=True)
    values = {"JAX_COMPILATION_CACHE_DIR": str(folder)}
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in env:
        values["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    return values


class CacheCounter:
    """JAX's persistent-cache hits and misses in this process, and the seconds it spent tracing,
    lowering and compiling (or loading from the cache): listeners on jax.monitoring. The seconds
    feed the start-up budget (launcher/rundir/goodput.py: compile before the first report)."""

    EVENTS = {"/jax/compilation_cache/cache_hits": "hits", "/jax/compilation_cache/cache_misses": "misses"}
    # JAX's duration events of a compile (jax/_src/dispatch.py, compiler.py, jax 0.10.2)
    DURATIONS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration",
                 "/jax/core/compile/backend_compile_duration", "/jax/compilation_cache/cache_retrieval_time_sec")

    def __init__(self):
        self.counts = {"hits": 0, "misses": 0}
        self.compile_seconds = 0.0
        self.listening = False

    def listen(self, jax_module=None) -> None:
        if self.listening:
            return
        monitoring = sys.modules.get("jax.monitoring")
        if monitoring is None:
            import jax.monitoring as monitoring  # noqa: PLC0415  (only once JAX is there)
        monitoring.register_event_listener(self._on_event)
        monitoring.register_event_duration_secs_listener(self._on_duration)
        self.listening = True

    def _on_event(self, event: str, **kwargs) -> None:
        name = self.EVENTS.get(event)
        if name is not None:
            self.counts[name] += 1

    def _on_duration(self, event: str, seconds: float, **kwargs) -> None:
        if event in self.DURATIONS:
            self.compile_seconds += seconds


COUNTER = CacheCounter()


def count_after_jax_import() -> None:
    """Count cache hits and misses from the moment JAX is imported (now, if it already is), without
    importing it: a program must be free to set JAX's environment first."""
    if "jax" in sys.modules:
        COUNTER.listen()
        return
    from .jax_runtime import AfterImport

    sys.meta_path.insert(0, AfterImport("jax", lambda module: COUNTER.listen()))
