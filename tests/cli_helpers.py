"""The CLI as its unit tests call it: click's CliRunner in this process (exact output, exit code),
and a bounded wait for a command that may never answer."""

from __future__ import annotations

import threading

from click.testing import CliRunner

from launcher.cli import main


def invoke(*args):
    """`jaxlaunch ARGS...` (each argument str()-ed); click's Result."""
    return CliRunner().invoke(main, [str(a) for a in args])


def invoke_within(args, seconds=20):
    """The CLI's answer, or None if it had not answered after `seconds`."""
    answer = []
    thread = threading.Thread(target=lambda: answer.append(CliRunner().invoke(main, args)), daemon=True)
    thread.start()
    thread.join(seconds)
    return answer[0] if answer else None
