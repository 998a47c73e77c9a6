"""Where a rank's main thread is, read from its Python stack by the monitor thread: for the hang
watchdog's allowances (compiling, a checkpoint save or restore) and for the roll-call that names the
rank holding a job up (launcher/supervisor/rollcall.py).

A place is the innermost frame of the job's own code (`where`) and what the thread does there
(`kind`), from the frames inside it (jaxlaunch's, JAX's) or, when there are none, from the call
the job's own line is making: JAX's jit dispatch is C++ and leaves no Python frame, so a rank
waiting inside XLA's cross-process collective sits at the line that calls the jitted function.
The callee is found from the line's source, by name lookups only (no attribute's code is run).

kinds: `xla` (a JAX computation or its result), `collective` (a launcher collective), `barrier`
(launcher.barrier, multihost_utils.sync_global_devices, JAX's coordination barrier), `mpi4jax`, `mpi`
(the program's own mpi4py call),
`checkpoint` (a save or restore), `compiling` (tracing, lowering or compiling with XLA), `child`
(a wait on its own child process: subprocess, os.system, os.waitpid), `network` (a socket, an HTTP
client: an upload, an evaluation server), `callback` (a host callback that XLA runs in this thread:
jax.pure_callback, io_callback), `own` (the job's own code or a call it makes that is none of these:
a loader, a lock, a sleep).

The hang watchdog weighs them (launcher/supervisor/watchdog.py): a rank in a WAITING kind waits for
its peers; a rank in an ELSEWHERE kind waits for something outside the job that may well answer,
and is not a culprit on the short bound; a rank in `own` with no CPU, no I/O and no busy child is.
"""

from __future__ import annotations

import ast
import contextlib
import gc
import hashlib
import inspect
import itertools
import linecache
import operator
import os
import sys
import threading
from pathlib import Path

LAUNCHER_DIR = str(Path(__file__).resolve().parent.parent) + os.sep
# Kinds in which a rank waits for its peers; any other kind is where a rank may hold them up.
WAITING_KINDS = ("xla", "collective", "barrier", "mpi4jax", "mpi")
# Kinds in which a rank waits on something outside the job (its child, the network, a host
# callback): not held up by a peer, not proven stuck either.
ELSEWHERE_KINDS = ("child", "network", "callback")

# Frames of JAX that trace, lower or compile (measured on jax 0.10.2: compile_or_get_cached and
# backend_compile_and_load in compiler.py, lowering in interpreters/mlir.py and pxla.py, tracing in
# partial_eval.py); never a frame that runs a computation.
_COMPILE_FILES = ("jax/_src/compiler.py", "jax/_src/interpreters/mlir.py", "jax/_src/interpreters/partial_eval.py")
_COMPILE_FUNCTIONS = ("lower", "_cached_lowering", "_create_pjit_jaxpr", "trace_to_jaxpr", "_infer_params")
_BARRIER_FUNCTIONS = ("sync_global_devices", "wait_at_barrier", "barrier")
# Library files whose frames say the thread waits on its child or on the network (paths end so).
_CHILD_FILES = ("/subprocess.py", "/multiprocessing/popen_fork.py", "/multiprocessing/popen_spawn_posix.py")
_NETWORK_FILES = ("/socket.py", "/ssl.py", "/http/client.py", "/urllib/request.py", "/xmlrpc/client.py")
_NETWORK_PACKAGES = ("/urllib3/", "/requests/", "/httpx/", "/httpcore/", "/aiohttp/", "/grpc/", "/botocore/",
                     "/boto3/", "/s3transfer/", "/google/cloud/", "/google/auth/", "/fsspec/", "/gcsfs/", "/s3fs/")
_CALLBACK_FILES = ("jax/_src/callback.py",)
# Builtin calls a job's line may make (no Python frame below it) that wait on a child or the network.
_CHILD_CALLS = {"os.system", "os.wait", "os.waitpid", "os.wait3", "os.wait4", "os.waitid"}
_NETWORK_MODULES = ("socket", "_socket", "ssl", "_ssl")


def _library_roots() -> tuple[str, ...]:
    roots = {os.path.join(prefix, "lib") + os.sep for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix}}
    return tuple(roots)


_LIBRARY_ROOTS = _library_roots()


def is_own_code(filename: str) -> bool:
    """True for the job's files: not jaxlaunch, not the standard library, not an installed package."""
    if filename.startswith("<"):
        return False
    path = os.path.abspath(filename)
    if path.startswith(LAUNCHER_DIR) or path.startswith(_LIBRARY_ROOTS):
        return False
    return "site-packages" not in path and "dist-packages" not in path


MAX_FRAMES = 100  # the innermost frames of a thread that stack_of reads (faulthandler's bound too)
_FRAME_ENTRY = operator.attrgetter("f_code.co_filename", "f_lineno", "f_code.co_name")


_READING = threading.Lock()  # one reader at a time: another's end must not turn the collector back on


@contextlib.contextmanager
def _collector_off():
    """Python's cyclic garbage collector off for the block, unless the program had it off already."""
    with _READING:
        collecting = gc.isenabled()
        gc.disable()
        try:
            yield
        finally:
            if collecting:
                gc.enable()


def _frame_objects(thread_id: int, limit: int = 1000) -> list:
    """The thread's frame objects, innermost first (at most `limit`), read safely from another
    thread (see stack_of): for stack_of, and for the callee of the job's line when it is stopped."""
    with _collector_off():
        top = sys._current_frames().get(thread_id)
        if top is None:
            return []
        frames = []
        try:
            # One C call from the top frame to the outermost: getattr(frame, "f_back") in a C loop,
            # no bytecode of ours in between. It ends with getattr(None, "f_back").
            frames.extend(itertools.accumulate(itertools.repeat("f_back", limit - 1), getattr, initial=top))
        except AttributeError:
            pass
    return [frame for frame in frames if frame is not None]


def stack_of(thread_id: int) -> list[tuple[str, int, str]]:
    """(file, line, function) of the thread's frames, innermost first: at most MAX_FRAMES, the
    innermost ones. [] for a thread with no Python frame (or none by that id).

    Why this read is safe while the thread runs in XLA, in MPI or in the job's code (the monitor
    reads the main thread every poll; CPython 3.11 and later): sys._current_frames() walks the
    thread states under the lock with which they are made and freed. faulthandler's dump of every
    thread, the reader before, walks them without it (it is written for signal handlers) and read
    the half-made state of a C thread entering Python (PyGILState_Ensure: mpi4jax's debug log on
    XLA's threads, a ctypes callback), a NULL frame pointer that killed the rank (issue 51, finding
    10). The collector is off, for microseconds, while frame objects are made: on 3.11 an
    allocation can run a collection whose finalizers hand the GIL over, which can deadlock
    sys._current_frames() (CPython gh-106883) or let the thread pop the frame whose object f_back
    is making. f_back is then followed in one C call (itertools.accumulate of getattr), so the GIL
    stays here and the thread pushes or pops no frame during the walk; a frame object stays valid
    after its frame ends (CPython gives it a copy), and CPython skips frames not yet started."""
    return [_FRAME_ENTRY(frame) for frame in _frame_objects(thread_id, MAX_FRAMES)]


def all_stacks() -> str:
    """Every thread's stack, innermost frame first, in faulthandler's words ("Thread 0x... (most
    recent call first):"): for the log when the job is being stopped. Read as stack_of reads one."""
    current = threading.get_ident()
    with _collector_off():
        threads = list(sys._current_frames())
    lines = []
    for ident in threads:
        frames = stack_of(ident)
        if not frames:
            continue
        lines.append(f"{'Current thread' if ident == current else 'Thread'} 0x{ident:016x} (most recent call first):")
        lines += [f'  File "{filename}", line {line} in {function}' for filename, line, function in frames]
        lines.append("")
    return "\n".join(lines)


def fingerprint(frames: list[tuple[str, int, str]]) -> str:
    """A short name for a stack (every frame's file, line and function): two ranks at the same
    place of the same program have the same one, and a thread whose stack did not change keeps it."""
    return hashlib.blake2b(repr(frames).encode(), digest_size=8).hexdigest()


def innermost_place(frames: list[tuple[str, int, str]]) -> str:
    """'file.py:LINE in FUNCTION' of the innermost frame of the job's own code, else the innermost."""
    own = next((f for f in frames if is_own_code(f[0])), None)
    chosen = own or (frames[0] if frames else None)
    return describe(chosen) if chosen is not None else "(no Python frame)"


def describe(entry: tuple[str, int, str]) -> str:
    filename, line, function = entry
    return f"{filename}:{line} in {function}"


def where_is(thread_id: int) -> str:
    """'file.py:LINE in FUNCTION' for the innermost frame of the job's own code in that thread,
    else the innermost frame at all."""
    return innermost_place(stack_of(thread_id))


def _kind_of_frame(filename: str, function: str) -> tuple[str, str] | None:
    """(kind, detail) that one library frame says the thread is in, or None."""
    path = filename.replace(os.sep, "/")
    if path.startswith(LAUNCHER_DIR.replace(os.sep, "/")):
        if "/rank/checkpoints/" in path:
            # Its agreement between ranks (one tracked MPI call) is a wait for peers.
            return ("collective", "a checkpoint's agreement") if function == "_collective" else ("checkpoint", function)
        if "/rank/collectives/" in path:
            return ("barrier", "launcher.barrier") if function == "barrier" else ("collective", f"launcher.{function}")
        if path.endswith("/rank/preemption.py") and function == "should_stop":
            # one MPI allreduce of every rank's notice flag: a wait for peers like any collective
            return "collective", "ctx.should_stop"
        return None
    if "/orbax/" in path:
        return "checkpoint", f"orbax {function}"
    if any(path.endswith(f) for f in _CALLBACK_FILES):
        return "callback", function
    if any(path.endswith(f) for f in _CHILD_FILES):
        return "child", function
    if any(path.endswith(f) for f in _NETWORK_FILES) or any(p in path for p in _NETWORK_PACKAGES):
        return "network", function
    if "/mpi4jax/" in path:
        return "mpi4jax", f"mpi4jax.{function}"
    if "/jax/" in path or "/jaxlib/" in path:
        if any(path.endswith(f) for f in _COMPILE_FILES) or function.startswith(_COMPILE_FUNCTIONS):
            return "compiling", function
        if function in _BARRIER_FUNCTIONS or path.endswith("jax/experimental/multihost_utils.py"):
            return "barrier", function
        return "xla", function
    return None


def phase(thread_id: int, frames: list[tuple[str, int, str]] | None = None) -> str | None:
    """'compiling' or 'checkpoint' while the thread is in one (anywhere on its stack), else None.
    Called every monitor poll: file names only, no source. `frames`: stack_of(thread_id), if read."""
    for filename, _, function in stack_of(thread_id) if frames is None else frames:
        found = _kind_of_frame(filename, function)
        if found is not None and found[0] in ("compiling", "checkpoint"):
            return found[0]
    return None


def place(thread_id: int, frames: list[tuple[str, int, str]] | None = None) -> dict:
    """{"kind", "detail", "where"} of the thread (see the module doc). `frames`: stack_of(thread_id),
    if read already."""
    frames = stack_of(thread_id) if frames is None else frames
    if not frames:
        return {"kind": "own", "detail": None, "where": "(no Python frame)"}
    own_index = next((i for i, f in enumerate(frames) if is_own_code(f[0])), None)
    where = describe(frames[own_index if own_index is not None else 0])
    inner = frames[:own_index] if own_index is not None else frames
    kinds = [k for k in (_kind_of_frame(f[0], f[2]) for f in frames) if k]
    if any(kind == "compiling" for kind, _ in kinds):
        return {"kind": "compiling", "detail": next(d for k, d in kinds if k == "compiling"), "where": where}
    # Inside the job's line: the innermost library frame says whether the thread waits for peers;
    # the outermost frame of that kind says what the job called (allreduce, not an MPI helper).
    inner_kinds = [k for k in (_kind_of_frame(f[0], f[2]) for f in inner) if k]
    if inner_kinds and inner_kinds[0][0] in WAITING_KINDS:
        # A barrier made of XLA or MPI calls (multihost_utils.sync_global_devices) is a barrier.
        kind = "barrier" if any(k == "barrier" for k, _ in inner_kinds) else inner_kinds[0][0]
        detail = [d for k, d in inner_kinds if k == kind][-1]
        return {"kind": kind, "detail": detail, "where": where}
    checkpoint = [d for k, d in kinds if k == "checkpoint"]
    if checkpoint:
        return {"kind": "checkpoint", "detail": checkpoint[-1], "where": where}
    # The job's own function running as XLA's host callback (pure_callback runs it in the thread
    # that dispatched the computation): whatever it does, its peers wait for XLA, not for a culprit.
    callback = [d for k, d in kinds if k == "callback"]
    if callback:
        return {"kind": "callback", "detail": callback[-1], "where": where}
    if inner_kinds:
        return {"kind": inner_kinds[0][0], "detail": inner_kinds[-1][1], "where": where}
    if own_index is not None:
        callee = _callee_at(thread_id, frames[own_index])
        if callee is not None:
            kind, detail = callee
            return {"kind": kind, "detail": detail, "where": where}
    return {"kind": "own", "detail": None, "where": where}


def _callee_at(thread_id: int, entry: tuple[str, int, str]) -> tuple[str, str] | None:
    """The callee of the job's line `entry`, from its frame object (the innermost one with that
    file, line and function)."""
    try:
        for frame in _frame_objects(thread_id):
            code = frame.f_code
            if (code.co_filename, frame.f_lineno, code.co_name) == entry:
                return callee_of(frame)
    except Exception:  # noqa: BLE001  (the thread moved on: no callee, the place still stands)
        return None
    return None


def callee_of(frame) -> tuple[str, str] | None:
    """(kind, name) of the function the frame's current line calls, when the line's source is one
    call of a plain name or dotted name (`step(w, x)`, `self.train_step(...)`, `time.sleep(1)`)."""
    try:
        code = frame.f_code
        positions = list(code.co_positions())
        lineno, end_lineno, col, end_col = positions[frame.f_lasti // 2]
        if lineno is None or col is None or end_col is None:
            return None
        lines = [linecache.getline(code.co_filename, n) for n in range(lineno, (end_lineno or lineno) + 1)]
        if len(lines) == 1:
            text = lines[0][col:end_col]
        else:
            text = "".join([lines[0][col:], *lines[1:-1], lines[-1][:end_col]])
        node = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError, IndexError, AttributeError, TypeError):
        return None
    if not isinstance(node, ast.Call):
        return None
    names = []
    func = node.func
    while isinstance(func, ast.Attribute):
        names.append(func.attr)
        func = func.value
    if not isinstance(func, ast.Name):
        return None
    names.append(func.id)
    names.reverse()
    label = ".".join(names)
    value = _lookup(frame, names)
    if value is _MISSING:
        return "own", label
    return _kind_of_callable(value, label)


_MISSING = object()


def _lookup(frame, names: list[str]):
    namespaces = (frame.f_locals, frame.f_globals, vars(__builtins__) if not isinstance(__builtins__, dict)
                  else __builtins__)
    value = next((ns[names[0]] for ns in namespaces if names[0] in ns), _MISSING)
    for name in names[1:]:
        if value is _MISSING:
            break
        try:
            value = inspect.getattr_static(value, name)
        except AttributeError:
            return _MISSING
    return value


def _kind_of_callable(value, label: str) -> tuple[str, str]:
    module = getattr(type(value), "__module__", "") or ""
    own_module = getattr(value, "__module__", "") or ""
    if type(value).__name__ in ("PjitFunction", "PmapFunction") or module.startswith(("jax", "jaxlib")) \
            or hasattr(value, "lower") and hasattr(value, "trace"):
        return "xla", label
    if own_module.startswith("mpi4jax"):
        return "mpi4jax", label
    if own_module.startswith("mpi4py") or module.startswith("mpi4py"):
        return "mpi", label  # the program's own MPI call (comm.Barrier(), comm.allreduce(...))
    if own_module.startswith("jax"):
        return "xla", label
    if label in _CHILD_CALLS or own_module == "subprocess":
        return "child", label
    owner = getattr(value, "__objclass__", None) or getattr(value, "__self__", None)
    owner_module = getattr(owner if isinstance(owner, type) else type(owner), "__module__", "") or ""
    if owner_module in _NETWORK_MODULES or own_module in _NETWORK_MODULES:
        return "network", label
    return "own", label
