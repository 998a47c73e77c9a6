"""The entrypoint of a function job (launcher.Executor): every rank runs the pickled
`fn(ctx, *args, **kwargs)` saved in RUN_DIR/function/.

    function/call.pkl    cloudpickle of (fn, args, kwargs)
    function/call.json   what pickled it: jaxlaunch and Python versions, the caller's sys.path,
                         and the signature, with the owner's key (launcher/owner_key.py), of
                         call.pkl together with what call.json says that decides what runs

The signature is checked before anything is unpickled or put on sys.path: a call.pkl someone else
put into the run directory would run their code as the job's owner, and so would a sys_path entry
that makes a function pickled by reference import from their folder. The versions are compared too, so a node with another Python or
jaxlaunch gets one clear line instead of an unpickling traceback (bytecode pickled by value only
loads in the Python minor version that made it).
"""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path

from ..rundir.names import CALL_FILE, CALL_RECORD, FUNCTION_FOLDER  # executor.py imports them here

ENTRYPOINT = "launcher.rank.function_job:main"


class FunctionVersionError(RuntimeError):
    """The function was pickled by another Python or jaxlaunch than the one on this node."""


class UntrustedCallError(RuntimeError):
    """call.pkl does not carry its owner's signature (launcher/owner_key.py): it is not unpickled."""


def call_record() -> dict:
    """What the pickling side records in call.json (it must agree with the ranks' side)."""
    from .. import __version__

    return {"jaxlaunch": __version__, "python": platform.python_version(),
            "python_executable": sys.executable, "sys_path": [p for p in sys.path if p]}


def check_versions(record: dict, where: Path) -> None:
    """Refuse a pickle made by another Python minor version or jaxlaunch version, naming both."""
    from .. import __version__

    here = platform.python_version()
    problems = []
    if record.get("python", "").split(".")[:2] != here.split(".")[:2]:
        problems.append(f"Python {record.get('python')} there, Python {here} here ({sys.executable})")
    if record.get("jaxlaunch") != __version__:
        problems.append(f"jaxlaunch {record.get('jaxlaunch')} there, jaxlaunch {__version__} here")
    if problems:
        raise FunctionVersionError(
            f"the function in {where} was pickled by another installation than this node runs: "
            f"{'; '.join(problems)}. fix: run the job with the same Python and jaxlaunch as the caller "
            f"(the same venv on a shared filesystem, or the same container image)")


def code_with_filename(rebuild, fields, filename: str):
    """A code object pickled by value, with the file name it was pickled under (see
    launcher.executor: cloudpickle alone would name it '<dynamic-code>')."""
    return rebuild(*fields).replace(co_filename=filename)


# What call.json says that decides what runs: signed with call.pkl (signed_bytes).
SIGNED_FIELDS = ("jaxlaunch", "python", "python_executable", "sys_path", "function", "module")


def signed_bytes(payload: bytes, record: dict) -> bytes:
    """call.pkl and call.json's SIGNED_FIELDS, as one byte string to sign."""
    decides = {name: record.get(name) for name in SIGNED_FIELDS}
    return payload + b"\0" + json.dumps(decides, sort_keys=True).encode()


def load_call(run_dir: Path):
    """(fn, args, kwargs) from RUN_DIR/function, after the signature and version checks. The
    caller's sys.path entries that exist here are appended, so modules it imported functions from by
    reference (a notebook's own helpers) import on the ranks too."""
    folder = Path(run_dir) / FUNCTION_FOLDER
    record = json.loads((folder / CALL_RECORD).read_text())
    payload = (folder / CALL_FILE).read_bytes()
    from ..owner_key import signed_by_owner

    if not isinstance(record, dict) or not signed_by_owner(signed_bytes(payload, record), record.get("signature")):
        raise UntrustedCallError(
            f"{folder / CALL_FILE} and {CALL_RECORD} are not signed with the key of the user who runs this job "
            f"(another user may have written them into the run directory): refusing to unpickle or import "
            f"anything. fix: submit the function again from your own account, into a run directory only you can "
            f"write")
    check_versions(record, folder)
    for entry in record.get("sys_path", []):
        if entry not in sys.path and os.path.isdir(entry):
            sys.path.append(entry)
    import cloudpickle  # noqa: F401  (pickles of functions by value need it importable)
    import pickle

    return pickle.loads(payload)


def main(ctx):
    fn, args, kwargs = load_call(ctx.run_dir)
    return fn(ctx, *args, **kwargs)
