"""`jaxlaunch logs RUN_DIR -f` on a local run: new output is printed as the ranks write it, and
following stops once the run has ended (its supervisor here is this test process)."""

import os
import socket
import threading
import time

from click.testing import CliRunner

from launcher.backends.local.backend import _start_ticks
from launcher.cli import main
from launcher.rundir import RunDirectory
from launcher.spec import JobSpec


def running_run(path, processes=2):
    run = RunDirectory.create(JobSpec(name="x", entrypoint="m:f", processes_per_node=processes), path)
    run.update_status(state="RUNNING", backend="local", started=time.time(), supervisor_pid=os.getpid(),
                      supervisor_start=_start_ticks(os.getpid()), supervisor_host=socket.gethostname())
    return run


def follow(args):
    answer = []
    thread = threading.Thread(target=lambda: answer.append(CliRunner().invoke(main, args)), daemon=True)
    thread.start()
    return thread, answer


def append(path, text):
    with open(path, "a") as out:
        out.write(text)


def test_follow_prints_every_ranks_new_lines_until_the_run_ends(tmp_path):
    run = running_run(tmp_path / "run")
    append(run.rank_log(0), "step 0\n")
    thread, answer = follow(["logs", str(run.path), "-f"])
    time.sleep(1.0)
    assert thread.is_alive() and not answer  # still following a running job
    append(run.rank_log(1), "rank one here\n")
    append(run.rank_log(0), "step 1\nstep ")
    time.sleep(0.8)
    append(run.rank_log(0), "2\n")  # a line completed later is printed whole, once
    time.sleep(0.8)
    run.update_status(state="COMPLETED", exit_code=0, ended=time.time())
    thread.join(30)
    assert answer, "still following a run that ended"
    result = answer[0]
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert [line for line in lines if line.startswith("[rank 0]")] == ["[rank 0] step 0", "[rank 0] step 1",
                                                                       "[rank 0] step 2"]
    assert "[rank 1] rank one here" in lines


def test_follow_one_rank_and_a_run_that_already_ended(tmp_path):
    run = running_run(tmp_path / "run")
    append(run.rank_log(1), "hello\n")
    thread, answer = follow(["logs", str(run.path), "--rank", "1", "-f"])
    time.sleep(0.8)
    append(run.rank_log(1), "world\n")
    time.sleep(0.8)
    run.update_status(state="FAILED", exit_code=1, ended=time.time())
    thread.join(30)
    assert answer and answer[0].exit_code == 0 and answer[0].output == "hello\nworld\n", answer
    thread, answer = follow(["logs", str(run.path), "-f"])  # ended: prints what there is and returns
    thread.join(30)
    assert answer and answer[0].exit_code == 0 and answer[0].output == "[rank 1] hello\n[rank 1] world\n"
