"""Soak: N back-to-back 2-rank local runs of a small job; counts spurious failures and hangs and
prints the p50/p99 run time. Not part of the test run (it takes ~10 minutes for 200 runs):

    .venv/bin/python tests/soak.py --runs 200

A run is a hang when it takes more than --hang-seconds (it is then killed); any exit code but 0,
or a result that is not the expected one, is a spurious failure.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--hang-seconds", type=float, default=60)
    parser.add_argument("--spec", default=str(ROOT / "jobs" / "examples" / "normalize.yaml"))
    args = parser.parse_args()
    exe = os.path.join(os.path.dirname(sys.executable), "jaxlaunch")
    work = Path(tempfile.mkdtemp(prefix="jaxlaunch-soak-"))
    times, failures, hangs = [], [], 0
    expected = None
    for i in range(args.runs):
        run_dir = work / f"run-{i}"
        started = time.monotonic()
        try:
            done = subprocess.run([exe, "run", args.spec, "--run-dir", str(run_dir)], capture_output=True,
                                  text=True, timeout=args.hang_seconds)
        except subprocess.TimeoutExpired:
            hangs += 1
            print(f"run {i}: HANG (killed after {args.hang_seconds} s)", flush=True)
            continue
        elapsed = time.monotonic() - started
        times.append(elapsed)
        result = done.stdout.strip()
        expected = expected or result
        if done.returncode != 0 or result != expected:
            failures.append((i, done.returncode, done.stderr[-2000:]))
            print(f"run {i}: FAILED (exit code {done.returncode})\n{done.stderr[-2000:]}", flush=True)
        shutil.rmtree(run_dir, ignore_errors=True)
        if (i + 1) % 20 == 0:
            print(f"{i + 1} runs: {len(failures)} failed, {hangs} hung", flush=True)
    times.sort()
    p99 = times[min(len(times) - 1, int(round(0.99 * (len(times) - 1))))] if times else float("nan")
    report = {"runs": args.runs, "spurious_failures": len(failures), "hangs": hangs,
              "p50_seconds": round(statistics.median(times), 3) if times else None, "p99_seconds": round(p99, 3),
              "max_seconds": round(times[-1], 3) if times else None}
    print(json.dumps(report))
    shutil.rmtree(work, ignore_errors=True)
    return 0 if not failures and not hangs else 1


if __name__ == "__main__":
    sys.exit(main())
