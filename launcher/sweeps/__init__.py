"""Sweeps: one spec, many configurations.

- `plan.py`: `--sweep KEY=V1,V2` / `range(...)` and the spec's `sweep:` section, expanded into a
  cartesian product of configurations, each validated as a spec before anything runs.
- `directory.py`: the sweep directory: `sweep.json` (the configurations, read and checked here)
  and one ordinary run directory per configuration (`task-000/`, ...).
- `tasks.py`: a sweep's progress whatever ran it: each task's state (TaskState), the counts and the
  summary line of `status` and `--wait` (each backend says its tasks' states: Backend.sweep_states;
  how a backend runs a sweep lives in its package, launcher/backends/local/array.py and
  launcher/backends/slurm/array.py).
- `table.py`: `jaxlaunch results`: every task's result.json in one table (printed, CSV, JSON).
- `metrics.py`: one column of that table: the best configuration (`--best`) and a plot (`--plot`).
"""
