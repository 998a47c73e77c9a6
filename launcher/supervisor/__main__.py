"""`python -m launcher.supervisor RUN_DIR -- LAUNCH...`: what batch scripts rendered before the
Slurm backend had its own program ran. Slurm keeps a job's script from its submission, so a job
queued (or requeued) across an upgrade still runs this line: it goes on as
`python -m launcher.backends.slurm.batch`, the program scripts run now. Run by name, not imported:
the supervisor package does not depend on any backend."""

import runpy

if __name__ == "__main__":
    runpy.run_module("launcher.backends.slurm.batch", run_name="__main__", alter_sys=True)
