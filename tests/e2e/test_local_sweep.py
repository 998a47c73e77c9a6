"""A local sweep end to end under mpirun: six configurations two at a time, one injected failure,
the other five complete; the table, `jaxlaunch results` and its plot. Declaring and expanding
sweeps and the array scripts are in tests/unit/test_sweeps.py."""

import json

import pytest

from conftest import EXAMPLES, jaxlaunch
from launcher.sweeps.directory import SweepDirectory


@pytest.mark.e2e
def test_local_sweep_two_at_a_time_one_injected_failure_keeps_the_other_five(tmp_path):
    sweep_dir = tmp_path / "sweep"
    result = jaxlaunch("run", EXAMPLES / "sweep_train.yaml", "--max-parallel", "2", "--set", "params.steps=20",
                       "--set", "params.fail_when={seed: 1, learning_rate: 0.03}", "--run-dir", sweep_dir,
                       timeout=300)
    assert result.returncode == 1, result.stderr  # one configuration failed
    assert "sweep of 6 configurations" in result.stderr and ", 2 at a time" in result.stderr
    assert "sweep done: 5 COMPLETED, 1 FAILED (of 6)" in result.stderr
    assert "injected failure at step 5" in result.stderr  # the failing task's reason, shown
    record = json.loads((sweep_dir / "sweep.json").read_text())
    assert record["backend"] == "local" and record["keys"] == ["params.learning_rate", "params.seed"]
    from launcher import load_result
    for task in record["tasks"]:
        run = sweep_dir / task["folder"]
        state = json.loads((run / "status.json").read_text())["state"]
        values = task["values"]
        if values == {"params.learning_rate": 0.03, "params.seed": 1}:
            assert state == "FAILED" and not (run / "result.json").exists()
            assert "injected failure" in (run / "output.log").read_text()
        else:
            assert state == "COMPLETED"
            assert load_result(run)["config"] == {"learning_rate": values["params.learning_rate"],
                                                  "seed": values["params.seed"]}
    # the table on stdout: 6 rows, one FAILED
    rows = [line for line in result.stdout.splitlines() if line.strip()[:1].isdigit()]
    assert len(rows) == 6 and sum("FAILED" in row for row in rows) == 1
    results = jaxlaunch("results", sweep_dir, "--best", "final_loss", "--plot", "final_loss")
    assert results.returncode == 0, results.stderr
    assert "best final_loss (min)" in results.stdout and "params.learning_rate=0.1" in results.stdout.splitlines()[-1]
    assert (sweep_dir / "final_loss.png").stat().st_size > 10_000
    assert SweepDirectory(sweep_dir).read()["tasks"] == record["tasks"]
