"""Shared by every tier. The tiers are the folders under tests/ (make test-unit, test-e2e, test-slurm,
test-mpi): unit (no mpirun, no Slurm: the inner loop, under 2 minutes), e2e (real mpirun and
`jaxlaunch run`), slurm (a real local cluster, slurm_cluster.py) and mpi (run by pytest and under
`mpirun -n 2`). Each test gets its folder's marker (`-m e2e`); helpers, jobs/ and golden/ live here."""

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
JOBS = ROOT / "jobs"
EXAMPLES = JOBS / "examples"  # the example jobs the docs run (normalize, train_data_parallel, programs/, ...)
BENCHMARKS = JOBS / "benchmarks"  # the benchmark jobs, with their result files
TEST_JOBS = TESTS / "jobs"
GOLDEN = TESTS / "golden"  # expected scripts, shared by the tiers
TIERS = ("unit", "e2e", "slurm", "mpi")


def pytest_collection_modifyitems(config, items):
    """The marker of each test's tier, from its folder; a test marked for another tier than its
    folder's (`@pytest.mark.slurm` in tests/unit) is an error: it would run, or be skipped, in the
    wrong `make` target."""
    misplaced = []
    for item in items:
        parts = item.path.relative_to(TESTS).parts if TESTS in item.path.parents else ()
        tier = parts[0] if len(parts) > 1 and parts[0] in TIERS else None
        if tier is None:
            continue
        others = {m.name for m in item.iter_markers() if m.name in TIERS and m.name != tier}
        if others:
            misplaced.append(f"{item.nodeid}: marked {', '.join(sorted(others))} but lives in tests/{tier}")
        item.add_marker(tier)
    if misplaced:
        raise pytest.UsageError("tests in the wrong tier's folder:\n  " + "\n  ".join(misplaced))


# --- the unit tier's guard: no mpirun, no Slurm (tests/unit/guard/sitecustomize.py) ----------------
# From the setup of each test under tests/unit to its teardown, its fixtures included, the test's
# process and every Python process it starts (a `jaxlaunch` console script, a helper script) refuse to
# start mpirun, prterun, srun, sbatch, squeue, scontrol and the like, and the test errors naming the
# command. Stand-ins a test writes into its tmp_path (a fake `sbatch`) and doctor's probes
# (`mpirun --version`, `scontrol ping`) are allowed. A test that needs more belongs in tests/e2e or tests/slurm.

UNIT = TESTS / "unit"
GUARD_DIR = UNIT / "guard"
_guard_spec = importlib.util.spec_from_file_location("unit_tier_guard", GUARD_DIR / "sitecustomize.py")
guard = importlib.util.module_from_spec(_guard_spec)
_guard_spec.loader.exec_module(guard)
guard.install()  # idle until a unit test sets guard.GUARD_ENV: a session may hold other tiers' tests too
_GUARD_SAVED = pytest.StashKey[dict]()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_setup(item):
    if UNIT in item.path.parents:
        basetemp = Path(item.config._tmp_path_factory.getbasetemp())
        log = basetemp / "unit-guard.log"
        log.unlink(missing_ok=True)
        changes = {guard.GUARD_ENV: str(log), guard.REAL_ENV: str(ROOT),
                   "PYTHONPATH": os.pathsep.join(filter(None, [str(GUARD_DIR), os.environ.get("PYTHONPATH")]))}
        item.stash[_GUARD_SAVED] = {name: os.environ.get(name) for name in changes}
        os.environ.update(changes)
    return (yield)


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_teardown(item, nextitem):
    try:
        return (yield)
    finally:
        saved = item.stash.get(_GUARD_SAVED, None)
        if saved is not None:
            log = Path(os.environ[guard.GUARD_ENV])
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            if log.exists():
                refused = log.read_text().strip()
                log.unlink()
                pytest.fail(f"{item.nodeid} started what the unit tier refuses:\n{refused}", pytrace=False)


def jaxlaunch(*args, timeout=180, env=None, cwd=None):
    """Run the installed `jaxlaunch` console script as a user would; returns CompletedProcess.
    `env` replaces the environment (default: this process's)."""
    exe = shutil.which("jaxlaunch", path=str(Path(sys.executable).parent)) or "jaxlaunch"
    return subprocess.run([exe, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env=os.environ if env is None else env, cwd=cwd)


@pytest.fixture(autouse=True)
def fresh_slurm_watcher(monkeypatch):
    """Each test starts with a Slurm watcher that follows no job (as each jaxlaunch command does)."""
    from launcher.backends.slurm import watcher

    monkeypatch.setattr(watcher, "WATCHER", watcher.SlurmWatcher())


@pytest.fixture
def fake_slurm(monkeypatch):
    """Slurm's commands answered in this process from what the test scripts (tests/fake_slurm.py):
    scheduler.call_slurm, the one door of every Slurm command, replaced by a FakeSlurm."""
    from fake_slurm import FakeSlurm
    from launcher.backends.slurm import scheduler

    fake = FakeSlurm()
    monkeypatch.setattr(scheduler, "call_slurm", fake)
    return fake


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # run directories go to ./runs
    return tmp_path


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The preemption tests' training job run once, uninterrupted (preemption_helpers.reference_result),
    for each module that compares interrupted runs with it."""
    from preemption_helpers import reference_result

    return reference_result(tmp_path_factory)


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
    and jobs/examples/ as mount points (launcher/container_image/build_charliecloud_image.sh):
    jobs/examples/ is mounted on its own, as the entrypoint's folder, when the working directory is
    elsewhere. It lives in build/ (ignored by git): a later session keeps its OS and venv and only
    reinstalls jaxlaunch (~7 s; the first build ~80 s). Skipped when ch-run is missing, except in CI
    (CI=true), which installs it."""
    if shutil.which("ch-run") is None:
        reason = "ch-run not found (Debian's charliecloud-runtime package)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but the container tests cannot run: {reason}")
        pytest.skip(reason)
    image = ROOT / "build" / "charliecloud-image"
    done = subprocess.run([str(ROOT / "launcher" / "container_image" / "build_charliecloud_image.sh"), str(image),
                           str(ROOT), str(EXAMPLES)],
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
