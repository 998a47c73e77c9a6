"""Containers on the local Slurm cluster: jobs/examples/normalize.yaml on two nodes with every rank in a
charliecloud image, under mpirun inside the allocation (the hybrid model: the host's mpirun and its
daemons, one ch-run per rank) and under srun --mpi=pmix. Rendering for apptainer and pyxis, which
this machine cannot run, is covered by golden files in test_render.py."""

import getpass
import json
import sys

import pytest

from conftest import EXAMPLES, ROOT, jaxlaunch

pytestmark = pytest.mark.slurm


@pytest.mark.parametrize("launch", ["mpirun", "srun"])
def test_normalize_on_two_nodes_in_a_charliecloud_image(slurm_env, charliecloud_image, tmp_path, launch):
    run_dir = tmp_path / "run"
    env = {**slurm_env, "USER": slurm_env.get("USER") or getpass.getuser()}  # ch-run needs it; sbatch passes it on
    result = jaxlaunch("submit", EXAMPLES / "normalize.yaml", "--set", "nodes=2", "--set", f"slurm.launch={launch}",
                       "--set", "container.runtime=charliecloud", "--set", f"container.image={charliecloud_image}",
                       "--wait", "--run-dir", run_dir, env=env, cwd=ROOT, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(result.stdout)["values"] == pytest.approx([0.1, 0.2, 0.3, 0.4], rel=1e-6)
    launch_line = (run_dir / "job.sbatch").read_text().splitlines()[-1]
    binds = " ".join(f"--bind={path}:{path}" for path in sorted([str(run_dir), str(ROOT)]))  # in path order
    assert launch_line.endswith(f" ch-run {binds} --cd={ROOT} "
                                f"{charliecloud_image} -- /opt/venv/bin/python -P -m launcher.rank.bootstrap")
    preflight = json.loads((run_dir / "preflight.json").read_text())
    assert preflight["ok"] and [r["rank"] for r in preflight["ranks"]] == [0, 1]
    assert {(r["python"], r["jaxlaunch"]) for r in preflight["ranks"]} == {("/opt/venv/bin/python", "0.1.0")}
    # the supervisor stays on the host (this venv's Python); only the ranks enter the image
    assert launch_line.startswith(f"exec {sys.executable} -m launcher.backends.slurm.batch {run_dir} -- ")
