"""How fast a hang is named and ended (issue 33): runs tests/jobs/hangs.yaml, a global-mesh job whose
rank 1 stops entering the jitted step at step 8 (alive, stuck in its loader), with hang_timeout=5,
at 2 and 16 ranks, locally (`jaxlaunch run`) and on Slurm (`jaxlaunch submit --wait`, when
SLURM_CONF is set), and prints, per run, the seconds from the stall to the roll-call (failure.json
written) and to the job's end (status.json's `ended`).

    .venv/bin/python jobs/benchmarks/measure_hangs.py [--where local,slurm] [--repeat N]

What is measured is jaxlaunch itself, so this is a script that runs jaxlaunch, not a jaxlaunch job.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "tests" / "jobs" / "hangs.yaml"
HANG_TIMEOUT = 5
LAYOUTS = {2: (2, 1), 16: (8, 2)}  # ranks: (nodes, processes per node)


def once(where: str, ranks: int, folder: Path) -> dict:
    nodes, per_node = LAYOUTS[ranks]
    run_dir = folder / f"{where}-{ranks}"
    exe = shutil.which("jaxlaunch", path=str(Path(sys.executable).parent)) or "jaxlaunch"
    command = [exe, "run" if where == "local" else "submit", str(SPEC), "--run-dir", str(run_dir),
               "--set", f"nodes={nodes}", "--set", f"processes_per_node={per_node}",
               "--set", "params.how=loader", "--set", f"hang_timeout={HANG_TIMEOUT}", "--set", "timeout=600"]
    if where == "slurm":
        command += ["--wait", "--set", "slurm.partition=wide", "--set", "slurm.max_requeues=0"]  # end, not requeue
    result = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if not (run_dir / "failure.json").exists():
        raise SystemExit(f"{' '.join(command)} wrote no failure.json:\n{result.stdout[-2000:]}{result.stderr[-3000:]}")
    failure = json.loads((run_dir / "failure.json").read_text())
    status = json.loads((run_dir / "status.json").read_text())
    stalled = float((run_dir / "stalled").read_text().split()[0])
    return {"where": where, "ranks": ranks, "exit": result.returncode, "to_roll_call": failure["time"] - stalled,
            "to_end": status["ended"] - stalled, "culprits": [c["rank"] for c in failure["hang"]["roll_call"]["culprits"]]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--where", default="local", help="local, slurm or local,slurm (slurm: SLURM_CONF must name "
                                                          "a cluster with a `wide` partition of 8 nodes)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    places = args.where.split(",")
    rows = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as folder:
        for where in places:
            for ranks in LAYOUTS:
                runs = [once(where, ranks, Path(folder) / str(i)) for i in range(args.repeat)]
                assert all(r["culprits"] == [1] and r["exit"] == 124 for r in runs), runs
                rows.append((where, ranks, [r["to_roll_call"] for r in runs], [r["to_end"] for r in runs]))
    print(f"hang_timeout={HANG_TIMEOUT} s; seconds from rank 1's stall, median (min-max) of {args.repeat} runs")
    print(f"{'where':<6} {'ranks':>5}  {'to the roll-call':>20}  {'to the end':>20}")
    for where, ranks, roll, end in rows:
        def show(values):
            return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"
        print(f"{where:<6} {ranks:>5}  {show(roll):>20}  {show(end):>20}")


if __name__ == "__main__":
    main()
