"""The control channel's hostile input (tests/hostile_input.py), 300 idle strangers and forged hellos
sent to a real running job's supervisor (`jaxlaunch run` under mpirun): the job completes with its
result. The same payloads against the server alone are in tests/unit/test_control_attacks.py."""

import json
import socket
import subprocess
import sys
from pathlib import Path

from conftest import TEST_JOBS
from hostile_input import KILLER_LINES, closed_by_server
from launcher import environment
from launcher.rundir import RunDirectory
from supervision_helpers import rank_pid, wait_for_file

JAXLAUNCH = str(Path(sys.executable).parent / "jaxlaunch")


def test_a_job_under_attack_without_the_secret_completes_with_its_result(tmp_path):
    """The payloads of tests/hostile_input.py, 300 idle strangers and forged hellos, sent to a running job's supervisor:
    the job used to end FAILED (4 runs of 4) with a correct result.json."""
    run_dir = tmp_path / "run"
    job = subprocess.Popen([JAXLAUNCH, "run", str(TEST_JOBS / "misbehave.yaml"), "--set", "entrypoint=steady.py:main",
                            "--set", "params.steps=40", "--run-dir", str(run_dir)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_file(run_dir / "ready-rank-1", 120)
        environ = Path(f"/proc/{rank_pid(run_dir, 0)}/environ").read_bytes().split(b"\0")
        where = next(v.split(b"=", 1)[1].decode() for v in environ if v.startswith(environment.CONTROL_ENV.encode() + b"="))
        host, _, port = where.rpartition(":")
        idle = [socket.create_connection((host, int(port)), timeout=5) for _ in range(300)]
        for payload in [*KILLER_LINES.values(),
                        b'{"kind":"hello","rank":1,"token":"0000"}\n',
                        b'{"kind":"abort","rank":1,"reason":"collective_timeout","message":"m","time":1}\n']:
            with socket.create_connection((host, int(port)), timeout=5) as sock:
                sock.sendall(payload)
                closed_by_server(sock, timeout=2)
        out, err = job.communicate(timeout=120)
        for sock in idle:
            sock.close()
    finally:
        job.kill()
    assert job.returncode == 0, err
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "COMPLETED"
    assert json.loads((run_dir / "result.json").read_text())["total"] == 80.0
    refused = [e for e in RunDirectory(run_dir).read_events() if e["event"] == "control_refused"]
    assert len(refused) >= len(KILLER_LINES)
