"""Local runs as first-class jobs: `status` lists the recent ones, `logs RUN_DIR` prints them (shell
completion, which Click generates, is in tests/unit/test_shell_completion.py)."""

import os

from conftest import EXAMPLES, TEST_JOBS, jaxlaunch


def test_status_lists_recent_local_runs_and_logs_reads_them(tmp_path):
    env = {**os.environ, "JAXLAUNCH_HOME": str(tmp_path / "home")}  # no Slurm jobs known
    assert jaxlaunch("run", EXAMPLES / "normalize.yaml", cwd=tmp_path, env=env).returncode == 0
    assert jaxlaunch("run", TEST_JOBS / "fail_on_rank.yaml", cwd=tmp_path, env=env).returncode == 1
    status = jaxlaunch("status", cwd=tmp_path, env=env)
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    assert lines[0].split() == ["LOCAL", "RUN", "STATE", "DURATION", "RESULT"]
    assert lines[2].startswith("runs/fail-on-rank-") and "FAILED" in lines[2] and "rank 1 on" in lines[2]
    assert lines[3].startswith("runs/normalize-") and "COMPLETED" in lines[3] and '"processes": 2' in lines[3]
    failed = tmp_path / lines[2].split()[0]
    logs = jaxlaunch("logs", failed, env=env)
    assert logs.returncode == 0
    assert "[rank 1]" in logs.stdout and "InjectedFailure" in logs.stdout
    assert "rank 1 on" in logs.stderr and "failed first" in logs.stderr  # the root cause, after the log
    one = jaxlaunch("logs", failed, "--rank", "0", env=env)
    assert one.returncode == 0 and "[rank" not in one.stdout
    assert jaxlaunch("logs", failed, "--rank", "7", env=env).returncode == 2
