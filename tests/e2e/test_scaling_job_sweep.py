"""The scaling job (jobs/benchmarks/scaling.py, scaling.yaml) and its report (scaling_report.py) end to
end: the 4-configuration sweep with tiny sizes under mpirun, then the report. Timings are checked for
being there, finite and positive, never for their values: this is a test, not a benchmark. The
report's arithmetic and failure messages, on fake sweeps, are in tests/unit/test_scaling_job.py."""

import json
import math
import subprocess
import sys

import pytest

from conftest import BENCHMARKS, jaxlaunch

REPORT = BENCHMARKS / "scaling_report.py"
TINY = ["params.batch=32", "params.features=16", "params.hidden=32", "params.layers=2",
        "params.steps=5", "params.warmup=2"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def report(sweep_dir):
    return subprocess.run([sys.executable, str(REPORT), str(sweep_dir)], capture_output=True, text=True,
                          timeout=120)


def is_positive(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def test_sweep_and_report_end_to_end(tmp_path):
    sweep_dir = tmp_path / "scaling"
    sets = [arg for item in TINY for arg in ("--set", item)]
    run = jaxlaunch("run", BENCHMARKS / "scaling.yaml", "--run-dir", sweep_dir, "--sweep", "params.repeat=0", *sets,
                    timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "sweep of 4 configurations" in run.stderr + run.stdout

    made = report(sweep_dir)
    assert made.returncode == 0, made.stdout + made.stderr
    assert "strong scaling efficiency" in made.stdout and "weak scaling efficiency" in made.stdout

    document = json.loads((sweep_dir / "scaling.json").read_text())
    assert is_positive(document["strong_efficiency"]) and is_positive(document["weak_efficiency"])
    assert document["cpu_count"] >= 1
    for mode in ("strong", "weak"):
        rows = document["modes"][mode]
        assert [row["processes"] for row in rows] == [1, 2]
        assert rows[0]["efficiency"] == pytest.approx(1.0)
        for row in rows:
            assert is_positive(row["step_seconds"]) and is_positive(row["examples_per_second"])
            used = row["cores_used_per_process"]
            assert len(used) == row["processes"] and all(is_positive(u) for u in used), row
            # the pinning itself (not a timing): every thread of every process sits on its one core
            assert row["threads_pinned"] == 1.0, row
            assert all(u < 1.5 for u in used), f"a process used more than one core: {row}"
        if document["cpu_count"] >= 2:
            assert sorted(rows[1]["cores"]) == sorted(set(rows[1]["cores"])), "two processes on one core"
    batches = {(c["mode"], c["processes"]): c["per_process_batch"] for c in document["configurations"]}
    assert batches == {("strong", 1): 32, ("strong", 2): 16, ("weak", 1): 32, ("weak", 2): 32}
    assert all(c["replicas_in_sync"] for c in document["configurations"])
    assert (sweep_dir / "scaling.png").read_bytes()[:8] == PNG_MAGIC
