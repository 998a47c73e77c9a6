"""What an attacker sends to the control channel (tests/unit/test_control_attacks.py against the
server alone, tests/e2e/test_control_attacks_job.py against a real job's supervisor)."""

import socket

# Each one, sent without the secret, used to raise out of the serving thread.
KILLER_LINES = {
    "lone surrogate token": b'{"kind":"hello","rank":0,"token":"\\ud800"}\n',
    "deep nesting": b"[" * 5000 + b"\n",
    "deep nesting in an object": b'{"kind":"hello","x":' + b"[" * 5000 + b"\n",
    "not an object": b'["hello", 0]\n',
    "kind not a string": b'{"kind":["hello"],"rank":0}\n',
    "token not a string": b'{"kind":"hello","rank":0,"token":{"a":1}}\n',
    "NaN": b'{"kind":"hello","rank":NaN,"token":"x"}\n',
    "invalid utf-8": b'{"kind":"hello","token":"\xff\xfe"}\n',
    "no newline, 100 KiB": b"x" * 100_000,
}


def closed_by_server(sock, timeout=5.0) -> bool:
    """The server closed this connection (recv sees the end, or a reset)."""
    sock.settimeout(timeout)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False
