"""Launch a Python function on every rank of a multi-host job, and get rank 0's return value back.

    import launcher

    ex = launcher.Executor("local", nodes=1, processes_per_node=2)      # or "slurm", spec="job.yaml"
    job = ex.submit(lambda ctx, x: launcher.allreduce(x * ctx.rank), 3.0)
    job.result()                   # rank 0's return value; JobFailedError (rank, remote traceback) if it failed
    jobs = ex.map(fn, items)       # one job per item: a Slurm job array, or local runs max_parallel at a time

A function job is an ordinary job whose entrypoint is launcher.rank.function_job:main: it has
a run directory, a supervisor, hang reports, ctx.checkpoints, preemption and requeue, and the
same handles as spec jobs (`jaxlaunch status/logs/cancel JOBID` work on it). The function, its
arguments and what pickled them go into RUN_DIR/function/ (cloudpickle, so closures, lambdas and
functions defined in a notebook or __main__ travel by value).
"""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path
from typing import Any, Callable, Iterable

from .backends import RUN_DEFAULT, get_backend
from .backends.base import Job
from .errors import UsageError
from .rank.function_job import (CALL_FILE, CALL_RECORD, ENTRYPOINT, FUNCTION_FOLDER, call_record,
                                   code_with_filename)

MAX_SEARCH_DEPTH = 6  # how deep the search for an unpicklable object goes (closures of closures ...)


def _job_name(fn: Callable) -> str:
    """A valid job name from the function's name (`<lambda>` -> `lambda`)."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "", getattr(fn, "__name__", "") or "") or "function"
    return name[:64] if name[0].isalnum() else f"fn{name}"[:64]


def _names_used(code) -> set[str]:
    """Global names a function's code (and the code of functions nested in it) refers to."""
    names = set(code.co_names)
    for const in code.co_consts:
        if inspect.iscode(const):
            names |= _names_used(const)
    return names


def _parts(obj, name: str) -> list[tuple[str, Any]]:
    """The objects `obj` holds that pickling it would pickle too, each with a readable name."""
    if inspect.isfunction(obj):
        code = obj.__code__
        parts = [(f"the closure variable {var!r} of {name}", cell.cell_contents)
                 for var, cell in zip(code.co_freevars, obj.__closure__ or ()) if _cell_filled(cell)]
        parts += [(f"the global {n!r} used by {name}", obj.__globals__[n]) for n in sorted(_names_used(code))
                  if n in obj.__globals__ and not inspect.ismodule(obj.__globals__[n])]
        parts += [(f"default {i} of {name}", d) for i, d in enumerate(obj.__defaults__ or ())]
        return parts
    if inspect.ismethod(obj):
        return [(f"{name}.__self__", obj.__self__), (f"{name}.__func__", obj.__func__)]
    if isinstance(obj, dict):
        return [(f"{name}[{k!r}]", v) for k, v in obj.items()]
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [(f"{name}[{i}]", v) for i, v in enumerate(obj)]
    if hasattr(obj, "__dict__") and not isinstance(obj, type):
        return [(f"{name}.{k}", v) for k, v in vars(obj).items()]
    return []


def _cell_filled(cell) -> bool:
    try:
        cell.cell_contents
        return True
    except ValueError:
        return False


def find_unpicklable(obj, name: str, depth: int = 0, seen: set | None = None) -> tuple[str, Any, Exception] | None:
    """The innermost part of `obj` that cloudpickle refuses: (its name, the object, the error), or
    None when `obj` pickles."""
    import cloudpickle

    seen = set() if seen is None else seen
    if id(obj) in seen:
        return None
    seen.add(id(obj))
    try:
        cloudpickle.dumps(obj)
        return None
    except Exception as exc:  # noqa: BLE001  (any failure to pickle is what we look for)
        error = exc
    if depth < MAX_SEARCH_DEPTH:
        for part_name, part in _parts(obj, name):
            found = find_unpicklable(part, part_name, depth + 1, seen)
            if found is not None:
                return found
    return name, obj, error


def _dumps_keeping_filenames(obj) -> bytes:
    """cloudpickle.dumps, except that code pickled by value keeps its file name. cloudpickle 3.1
    writes '<dynamic-code>' instead, and the remote traceback of a failed function job then names
    no file and shows no source line; with the name kept, a file on a shared filesystem shows both."""
    import copyreg
    import io
    import types
    from collections import ChainMap

    import cloudpickle

    code_reduce = getattr(cloudpickle.cloudpickle, "_code_reduce", None)
    if code_reduce is None:  # another cloudpickle layout: its own behaviour, whatever it is
        return cloudpickle.dumps(obj)

    def reduce_code(code):
        rebuild, fields = code_reduce(code)
        return code_with_filename, (rebuild, fields, code.co_filename)

    class Pickler(cloudpickle.Pickler):
        dispatch_table = ChainMap({types.CodeType: reduce_code}, cloudpickle.Pickler.dispatch_table,
                                  copyreg.dispatch_table)

    buffer = io.BytesIO()
    Pickler(buffer, protocol=cloudpickle.DEFAULT_PROTOCOL).dump(obj)
    return buffer.getvalue()


def pickle_call(fn: Callable, args: tuple, kwargs: dict) -> bytes:
    """cloudpickle of (fn, args, kwargs); a UsageError naming the object that cannot be pickled
    (a lock, an open file or socket ...) before anything is submitted."""
    try:
        return _dumps_keeping_filenames((fn, args, kwargs))
    except Exception:  # noqa: BLE001
        pass
    found = None
    for name, part in [(f"the function {getattr(fn, '__qualname__', fn)}", fn),
                       *((f"argument {i}", a) for i, a in enumerate(args)),
                       *((f"keyword argument {k!r}", v) for k, v in kwargs.items())]:
        found = find_unpicklable(part, name)
        if found is not None:
            break
    if found is None:  # the parts pickle one by one but not together: say what cloudpickle said
        _dumps_keeping_filenames((fn, args, kwargs))
    name, obj, error = found
    raise UsageError(f"cannot send the function job to its ranks: {name} is a {type(obj).__module__}."
                     f"{type(obj).__qualname__}, which cannot be pickled ({type(error).__name__}: {error}).\n"
                     f"  fix: create it inside the function (each rank makes its own), or pass what it is "
                     f"made from (a path, a number) instead; nothing was submitted.")


def function_files(fn: Callable, args: tuple, kwargs: dict) -> dict[str, bytes]:
    """The files of RUN_DIR/function/ for one call."""
    from .owner_key import sign
    from .rank.function_job import signed_bytes

    payload = pickle_call(fn, args, kwargs)
    record = {**call_record(), "function": getattr(fn, "__qualname__", repr(fn)),
              "module": getattr(fn, "__module__", None)}
    # the ranks unpickle only what its owner wrote, from where its owner's sys.path says: both signed
    record["signature"] = sign(signed_bytes(payload, record))
    return {f"{FUNCTION_FOLDER}/{CALL_FILE}": payload,
            f"{FUNCTION_FOLDER}/{CALL_RECORD}": (json.dumps(record, indent=2) + "\n").encode()}


class Executor:
    """Runs Python functions as jaxlaunch jobs on `backend` ("local": mpirun on this machine;
    "slurm": sbatch). Configured like a spec: `spec` (a YAML file; its entrypoint is ignored) with
    `overrides` ("key=value", as --set), and/or keyword arguments for the same keys
    (`nodes=2, processes_per_node=4, slurm={"partition": "gpu"}, timeout="1h"`). A bad key is
    the same SpecError a spec file gets."""

    def __init__(self, backend: str = RUN_DEFAULT, spec: str | Path | None = None, overrides: Iterable[str] = (),
                 **fields):
        self.backend_name = backend
        self.backend = get_backend(backend)
        self.spec_path = None if spec is None else Path(spec)
        self.overrides = list(overrides)
        self.fields = fields

    def __repr__(self) -> str:
        return f"Executor({self.backend_name!r}, spec={self.spec_path}, {self.fields})"

    def job_spec(self, fn: Callable | None = None, params: dict | None = None):
        """The JobSpec a call of `fn` runs with (validated as a spec file is)."""
        from .spec.load import SWEEP_SECTION, build_spec, parse_overrides, read_spec_file

        if self.spec_path is not None:
            loaded = read_spec_file(self.spec_path)
            data = dict(loaded.data or {}) if isinstance(loaded.data, dict) else loaded.data
            lines, path = loaded.lines, self.spec_path
            if isinstance(data, dict):
                data.pop(SWEEP_SECTION, None)
        else:
            data, lines, path = {}, {}, Path("Executor")
        if isinstance(data, dict):
            data.update(self.fields)
            data["entrypoint"] = ENTRYPOINT
            data.setdefault("name", _job_name(fn) if fn is not None else "function")
            if params:
                data["params"] = {**(data.get("params") or {}), **params}
        return build_spec(path, data, lines, parse_overrides(self.overrides))

    def submit(self, fn: Callable, *args, **kwargs) -> Job:
        """Run `fn(ctx, *args, **kwargs)` on every rank of one job; returns its handle at once
        (`result()` is rank 0's return value)."""
        spec = self.job_spec(fn)
        files = function_files(fn, args, kwargs)  # refuses an unpicklable call before anything exists
        return self.backend.start(spec, None, files=files)  # Slurm checks the request against the cluster

    def map(self, fn: Callable, items: Iterable, max_parallel: int | None = None) -> list[Job]:
        """Run `fn(ctx, item)` as one job per item (ctx.params["map_index"] is its position): a
        Slurm job array, or local runs `max_parallel` at a time (default the spec's max_parallel,
        else 1). Returns the handles in the items' order."""
        from .sweeps.plan import Configuration, Sweep

        items = list(items)
        if not items:
            return []
        base = self.job_spec(fn)
        configurations = [Configuration(i, {"map_index": i}, self.job_spec(fn, {"map_index": i}))
                          for i in range(len(items))]
        files = [function_files(fn, (item,), {}) for item in items]
        sweep = Sweep(spec_path=self.spec_path or Path(f"{base.name}.map"), base=base, keys=["map_index"],
                      configurations=configurations)
        return self.backend.start_map(sweep, files, max_parallel or base.max_parallel)
