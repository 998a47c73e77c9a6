"""Sweeps: one spec, many configurations.

- `plan.py`: `--sweep KEY=V1,V2` / `range(...)` and the spec's `sweep:` section, expanded into a
  cartesian product of configurations, each validated as a spec before anything runs.
- `directory.py`: the sweep directory: `sweep.json` (the configurations, read and checked here)
  and one ordinary run directory per configuration (`task-000/`, ...).
- `local.py`: `jaxlaunch run` with a sweep: the configurations on this machine, N at a time.
- `array.py`: `jaxlaunch submit` with a sweep: Slurm job arrays (grouped, split, submitted).
- `status.py`: every task's state, the counts, and `--wait` for a whole sweep (local or Slurm).
- `table.py`: `jaxlaunch results`: every task's result.json in one table (printed, CSV, JSON).
- `metrics.py`: one column of that table: the best configuration (`--best`) and a plot (`--plot`).
"""
