import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
JOBS = ROOT / "jobs"
TEST_JOBS = Path(__file__).resolve().parent / "jobs"
GOLDEN = Path(__file__).resolve().parent / "golden"  # expected scripts, shared by the tiers


def jaxlaunch(*args, timeout=180, env=None, cwd=None):
    """Run the installed `jaxlaunch` console script as a user would; returns CompletedProcess.
    `env` replaces the environment (default: this process's)."""
    exe = shutil.which("jaxlaunch", path=str(Path(sys.executable).parent)) or "jaxlaunch"
    return subprocess.run([exe, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env=os.environ if env is None else env, cwd=cwd)


@pytest.fixture(autouse=True)
def fresh_slurm_watcher(monkeypatch):
    """Each test starts with a Slurm watcher that follows no job (as each jaxlaunch command does)."""
    from launcher.backends.slurm import backend as slurm

    monkeypatch.setattr(slurm, "WATCHER", slurm.SlurmWatcher())


@pytest.fixture
def job_modules(tmp_path, monkeypatch):
    """Entrypoint modules the spec tests name (`m:f`, `mypkg.train:main`, `pkg.train:main`),
    importable like an installed package: load_spec checks that an entrypoint's module and function exist."""
    folder = tmp_path / "modules"
    folder.mkdir()
    (folder / "m.py").write_text("def f(ctx):\n    return 1\n")
    for package in ("mypkg", "pkg"):
        (folder / package).mkdir()
        (folder / package / "__init__.py").write_text("")
        (folder / package / "train.py").write_text("def main(ctx):\n    return 1\n")
    monkeypatch.syspath_prepend(str(folder))
    return folder


@pytest.fixture
def write_spec(tmp_path, job_modules):
    """Write a spec file from text; returns its path. Modules `m`, `mypkg.train`, `pkg.train` are importable."""
    def write(text, name="job.yaml"):
        path = tmp_path / name
        path.write_text(text)
        return path
    return write


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """A real two-node Slurm cluster (Debian's slurmctld/slurmd/munge) for the whole session.

    Skipped with the reason when the binaries are missing, except in CI (CI=true), where a
    skipped Slurm tier would let CI pass without testing Slurm, so it fails instead.
    """
    from slurm_cluster import LocalSlurmCluster, is_available

    available, reason = is_available()
    if not available:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but the Slurm tier cannot run: {reason}")
        pytest.skip(f"no local Slurm: {reason}")
    # 8 virtual nodes: `debug` and `urgent` hold node1-2 (the two-node tests), `wide` all 8.
    cluster = LocalSlurmCluster(tmp_path_factory.mktemp("slurm"), nodes=8).start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def charliecloud_image():
    """A charliecloud image directory with this checkout's jaxlaunch installed, and the repository
    and jobs/ as mount points (jobs/container/build_charliecloud_image.sh): jobs/ is mounted on its
    own, as the entrypoint's folder, when the working directory is elsewhere. It lives in build/ (ignored by
    git): a later session keeps its OS and venv and only reinstalls jaxlaunch (~7 s; the first build
    ~80 s). Skipped when ch-run is missing, except in CI (CI=true), which installs it."""
    if shutil.which("ch-run") is None:
        reason = "ch-run not found (Debian's charliecloud-runtime package)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but the container tests cannot run: {reason}")
        pytest.skip(reason)
    image = ROOT / "build" / "charliecloud-image"
    done = subprocess.run([str(ROOT / "jobs" / "container" / "build_charliecloud_image.sh"), str(image), str(ROOT),
                           str(JOBS)],
                          capture_output=True, text=True, timeout=900, env={**os.environ, "PYTHON": sys.executable})
    assert done.returncode == 0, f"building the image failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return image


@pytest.fixture
def slurm_env(slurm_cluster, tmp_path):
    """Environment for jaxlaunch commands against the test cluster, with a private job index."""
    return slurm_cluster.make_env(JAXLAUNCH_HOME=str(tmp_path / "home"))


# --- for tests/mpi (any MPI size) ---

@pytest.fixture
def comm():
    from mpi4py import MPI

    return MPI.COMM_WORLD


@pytest.fixture
def shared_dir(comm):
    """One folder for every rank (they share this machine's filesystem, as a cluster's); removed
    after, once every rank is done with it."""
    import tempfile

    path = tempfile.mkdtemp(prefix="jaxlaunch-mpi-") if comm.Get_rank() == 0 else None
    path = comm.bcast(path, root=0)
    yield path
    comm.barrier()
    if comm.Get_rank() == 0:
        shutil.rmtree(path, ignore_errors=True)
