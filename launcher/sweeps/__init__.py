"""Sweeps: one spec, many configurations.

- `plan.py`: `--sweep KEY=V1,V2` / `range(...)` and the spec's `sweep:` section, expanded into a
  cartesian product of configurations, each validated as a spec before anything runs.
- `directory.py`: the sweep directory: `sweep.json` (the configurations) and one ordinary run
  directory per configuration (`task-000/`, ...).
- `local.py`: `jaxlaunch run` with a sweep: the configurations on this machine, N at a time.
- `array.py`: `jaxlaunch submit` with a sweep: Slurm job arrays, status, wait.
- `table.py`: `jaxlaunch results`: every task's result.json in one table (CSV, JSON, plot, best).
"""
