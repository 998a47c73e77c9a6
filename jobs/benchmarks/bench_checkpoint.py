"""Checkpoint benchmark: our engine against a raw write, orbax and the old engine, side by side.

The state: a dict of `leaves` float32 arrays of random values (constant data would compress to
nothing in orbax), sharded by rows over every device of the job (jax.devices(): 1 process x 2 CPU
devices with jobs/benchmarks/bench_checkpoint.yaml, 2 x 2 over a global mesh with bench_checkpoint_2proc.yaml).

Writers, each measured from the call until the bytes are durable (fsynced):
  raw np.save + fsync   the disk's limit: this process's shards, already in host memory, written with
                        np.save into one file per process, flush, os.fsync, fsync of the folder
  ours, async           ctx.checkpoints' engine (launcher.rank.checkpoints.Checkpoints): save()
                        returns once the state is in host memory (blocking), wait() once the files
                        and folders are fsynced and the folder is renamed into place (total)
  ours, blocking=True   the same engine, save(..., blocking=True)
  old engine (v1)       the engine this one replaces (launcher/rank/checkpoints.py before format 2),
                        its write path reproduced here: np.asarray of every leaf, np.savez into a
                        BytesIO, one fsynced write, manifest, fsync, rename. It cannot save arrays
                        spread over several processes, so it has no row in a multi-process run.
  orbax async           orbax-checkpoint's AsyncCheckpointer(StandardCheckpointHandler()), when
                        installed (pip install -e '.[orbax]'): save() then wait_until_finished().
                        Its array data goes through TensorStore, whose file driver fsyncs its data
                        files, manifests and their folders (Context file_io_sync, default true; strace
                        of a save shows those fsync calls), so no os.sync() is added. The small
                        metadata files orbax writes from Python (_METADATA, _CHECKPOINT_METADATA,
                        commit_success.txt, ...) and the final rename of its folder are not fsynced,
                        so the timed total ends with an fsync of every file and folder of the
                        checkpoint (fsync_tree): the same durability as the other writers, at the
                        price of a few fsyncs of small or already clean files.
                        orbax compresses chunks (zstd); random float32 hardly compresses.

Columns: blocking = how long the training loop is stopped (a synchronous writer: its total); total =
until durable; GB/s = state bytes (1e9) / total; total / raw = median over repeats of this writer's
total over the raw write's total in the same repeat; restore = reading the checkpoint back onto the
same layout (like=the saved state; raw: np.load of its file, host memory only), resharded = onto
another layout via like= (the devices in reverse order, sharded by columns instead of rows: every
device needs a part of every saved piece); peak host = growth of the process's peak resident memory
(VmHWM, reset through /proc/self/clear_refs before the save) from the call until durable.

The device-to-host copy that an async save cannot avoid, measured on the same state: `np.asarray`
of every shard after copy_to_host_async (what our engine does: on the CPU platform a zero-copy view,
on a GPU the real copy) and a forced copy (np.array(copy=True): a memcpy on the CPU, copy + memcpy on
a GPU). The criterion "async blocking <= device-to-host copy + 10%" is checked against the first.

Fairness: the disk of a VM swings between runs, so every repeat runs every writer once, in a
rotated order, and the figures are medians over repeats. Every save gets a freshly computed state
(JAX caches an array's host copy after its first np.asarray, so a state saved twice would skip its
device-to-host copy); restores read cold files (their pages dropped from the page cache with
posix_fadvise, see params.cold_restore); a measurement's files are deleted once it is done. One
untimed warm-up round at 4 MiB comes first. Timings are per process; a multi-process figure is the
slowest process's.

Params (--set params.X=...): sizes_mib [64, 512, 2048], repeats 3, leaves 4, cold_restore true,
orbax true (false skips it even if installed). Writes bench.json and bench_checkpoint.png into the
run directory; rank 0 prints the table.
"""

from __future__ import annotations

import gc
import io
import json
import logging
import os
import re
import shutil
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from mpi4py import MPI

from launcher.rundir import atomic_write_bytes
from launcher.rank.checkpoints import Checkpoints

MiB = 1 << 20
COLUMNS = 1024          # every leaf is (rows, COLUMNS) float32
WARMUP_MIB = 4
RAW, OURS_ASYNC, OURS_SYNC, OLD, ORBAX = (
    "raw np.save + fsync", "ours, async", "ours, blocking=True", "old engine (v1, sync)", "orbax async")
SHORT_NAMES = {RAW: "raw\nnp.save", OURS_ASYNC: "ours\nasync", OURS_SYNC: "ours\nblocking", OLD: "old\nengine (v1)",
               ORBAX: "orbax\nasync"}  # the PNG's tick labels
D2H_CHECK_SLACK = 1.10  # async blocking <= device-to-host copy + 10%
THROUGHPUT_TARGET = 0.8  # total throughput >= 0.8x raw, i.e. total / raw <= 1.25


# --- the job's processes ---------------------------------------------------------------------

class Processes:
    """Barriers and "the slowest process" over the job's processes (nothing to do with one). A
    process that is done waits with sleeps: Open MPI's blocking calls spin at 100% of a core, which
    would slow down a process still writing on the same node."""

    def __init__(self, ctx):
        self.rank, self.size = ctx.rank, ctx.size
        self.comm = MPI.COMM_WORLD.Clone() if ctx.size > 1 else None

    def barrier(self):
        if self.comm is not None:
            request = self.comm.Ibarrier()
            while not request.Test():
                time.sleep(0.001)

    def slowest(self, value: float) -> float:
        if self.comm is None:
            return value
        self.barrier()
        return self.comm.allreduce(value, op=MPI.MAX)

    def clone(self):
        return None if self.comm is None else self.comm.Clone()


# --- host memory ---------------------------------------------------------------------------

def _status_kib(field_name: str) -> int:
    with open("/proc/self/status") as handle:
        return int(re.search(rf"^{field_name}:\s+(\d+) kB", handle.read(), re.M).group(1))


class PeakMemory:
    """Growth of this process's peak resident memory over a stretch of code. Linux resets the peak
    (VmHWM) to the current RSS when "5" is written to /proc/self/clear_refs; where that is not
    allowed, ru_maxrss stands in (it only counts a new lifetime peak: a lower bound)."""

    def __init__(self):
        try:
            with open("/proc/self/clear_refs", "w") as handle:
                handle.write("5")
            self.resettable = True
        except OSError:
            self.resettable = False

    def start(self):
        import resource

        gc.collect()
        if self.resettable:
            with open("/proc/self/clear_refs", "w") as handle:
                handle.write("5")
            self._before = _status_kib("VmRSS")
        else:
            self._before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    def growth_bytes(self) -> int:
        import resource

        peak = _status_kib("VmHWM") if self.resettable else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return max(0, peak - self._before) * 1024


# --- files -------------------------------------------------------------------------------------

def fsync_path(path: Path) -> None:
    from launcher.rank.checkpoints.storage import fsync_dir

    fsync_dir(path)  # opens read-only and fsyncs: works for files as for folders


def fsync_tree(folder: Path) -> None:
    """Every file and folder under `folder`, and `folder` in its parent, made durable."""
    for root, _, files in os.walk(folder):
        for name in files:
            fsync_path(Path(root) / name)
        fsync_path(Path(root))
    fsync_path(folder.parent)


def drop_from_page_cache(folder: Path) -> None:
    """A cold read for the restore that follows: the files' (clean, fsynced) pages leave the cache."""
    for root, _, files in os.walk(folder):
        for name in files:
            fd = os.open(Path(root) / name, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def leaves_of(state) -> list:
    return [state[key] for key in sorted(state)]


# --- the writers -------------------------------------------------------------------------------

class RawWrite:
    """np.save of this process's shards (host copies made once per size) into one file, fsynced."""
    name = RAW
    reshards = False

    def __init__(self, processes: Processes):
        self.rank = processes.rank
        self.host_shards: list = []

    def prepare(self, state) -> None:
        self.host_shards = [np.array(shard.data) for leaf in leaves_of(state) for shard in leaf.addressable_shards]

    def start(self, folder: Path, state) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / f"process-{self.rank}.npy", "wb") as handle:
            for array in self.host_shards:
                np.save(handle, array)
            handle.flush()
            os.fsync(handle.fileno())
        fsync_path(folder)

    def finish(self) -> None:
        pass

    def restore(self, folder: Path, like):
        with open(folder / f"process-{self.rank}.npy", "rb") as handle:
            return [np.load(handle) for _ in self.host_shards]

    def expected(self, saved_state):
        return self.host_shards


class OursWrite:
    """One Checkpoints per writer over its own folder, as a job would keep it; a step per save."""
    reshards = True

    def __init__(self, ctx, processes: Processes, folder: Path, asynchronous: bool):
        self.name = OURS_ASYNC if asynchronous else OURS_SYNC
        self.blocking = not asynchronous
        self.checkpoints = Checkpoints(folder, keep=1, rank=ctx.rank, comm=processes.clone(),
                                       devices=ctx.local_devices, mesh=ctx.mesh, asynchronous=asynchronous)
        self.step = 0

    def prepare(self, state) -> None:
        pass

    def start(self, folder: Path, state) -> None:
        self.step += 1
        self.checkpoints.save(self.step, state, blocking=self.blocking)

    def finish(self) -> None:
        self.checkpoints.wait()

    def restore(self, folder: Path, like):
        return self.checkpoints.restore(like=like)[1]

    def expected(self, saved_state):
        return saved_state


class OldEngineWrite:
    """The v1 engine's synchronous path (one process): every leaf gathered with np.asarray, np.savez
    into a BytesIO, one write + fsync, the manifest, fsync of the folder, rename, fsync of the parent.
    Its restore: np.load of the .npz, then jax.device_put onto like's sharding."""
    name = OLD
    reshards = True

    def prepare(self, state) -> None:
        pass

    def start(self, folder: Path, state) -> None:
        temp = folder.with_name(f".tmp-{folder.name}")
        temp.mkdir(parents=True)
        arrays = {f"leaf_{i}": np.asarray(leaf) for i, leaf in enumerate(leaves_of(state))}
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        self._write(temp / "arrays.npz", buffer.getvalue())
        manifest = {"format": "jaxlaunch-checkpoint", "version": 1, "leaves": [
            {"key": key, "dtype": a.dtype.name, "shape": list(a.shape)} for key, a in arrays.items()]}
        self._write(temp / "manifest.json", json.dumps(manifest).encode())
        fsync_path(temp)
        os.rename(temp, folder)
        fsync_path(folder.parent)

    @staticmethod
    def _write(path: Path, data: bytes) -> None:
        with open(path, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())

    def finish(self) -> None:
        pass

    def restore(self, folder: Path, like):
        with np.load(folder / "arrays.npz", allow_pickle=False) as stored:
            arrays = [stored[f"leaf_{i}"] for i in range(len(like))]
        return {key: jax.device_put(array, like[key].sharding) for key, array in zip(sorted(like), arrays)}

    def expected(self, saved_state):
        return saved_state


class OrbaxWrite:
    """orbax-checkpoint's AsyncCheckpointer; the total ends with fsync_tree (see the module doc)."""
    name = ORBAX
    reshards = True

    def __init__(self, processes: Processes):
        import orbax.checkpoint as ocp

        self.ocp, self.rank = ocp, processes.rank
        self.checkpointer = ocp.AsyncCheckpointer(ocp.StandardCheckpointHandler())
        self.folder: Path | None = None

    def prepare(self, state) -> None:
        pass

    def start(self, folder: Path, state) -> None:
        folder.parent.mkdir(parents=True, exist_ok=True)
        self.folder = folder.absolute()
        self.checkpointer.save(self.folder, args=self.ocp.args.StandardSave(state))

    def finish(self) -> None:
        self.checkpointer.wait_until_finished()
        if self.rank == 0:
            fsync_tree(self.folder)

    def restore(self, folder: Path, like):
        target = {key: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding) for key, x in like.items()}
        return self.checkpointer.restore(folder.absolute(), args=self.ocp.args.StandardRestore(target))

    def expected(self, saved_state):
        return saved_state

    def close(self) -> None:
        self.checkpointer.close()


# --- measurements ------------------------------------------------------------------------------

@dataclass
class Sample:
    blocking: float
    total: float
    peak_bytes: int
    restore: float | None = None
    restore_resharded: float | None = None


@dataclass
class SizeResult:
    nbytes: int
    samples: dict = field(default_factory=dict)     # writer -> [Sample] (one per repeat)
    d2h: list = field(default_factory=list)         # np.asarray after copy_to_host_async (ours' way)
    forced_copy: list = field(default_factory=list)  # np.array(copy=True)


def make_state(nbytes: int, leaves: int, sharding, seed: int) -> dict:
    """`leaves` arrays of (rows, COLUMNS) random float32 summing to nbytes; each process makes
    only the shards its devices hold."""
    rows = nbytes // 4 // leaves // COLUMNS

    def leaf(number):
        def values(index):
            start = index[0].start or 0
            rng = np.random.default_rng([seed, number, start])
            return rng.standard_normal((len(range(*index[0].indices(rows))), COLUMNS), dtype=np.float32)
        return jax.make_array_from_callback((rows, COLUMNS), sharding, values)

    return {f"w{number}": leaf(number) for number in range(leaves)}


def zeros_like_on(state: dict, sharding) -> dict:
    """The resharded restore's like=: zeros laid out by `sharding`, made on the devices."""
    return {key: jax.jit(lambda: jnp.zeros(x.shape, x.dtype), out_shardings=sharding)() for key, x in state.items()}


_negate = jax.jit(lambda tree: jax.tree.map(jnp.negative, tree))


def fresh(state: dict) -> dict:
    """New buffers (no host copy cached by JAX), the same size and layout; random data stays random."""
    return jax.block_until_ready(_negate(state))


def time_device_to_host(state: dict, forced: bool) -> float:
    shards = [shard.data for leaf in leaves_of(state) for shard in leaf.addressable_shards]
    started = time.perf_counter()
    if forced:
        host = [np.array(data, copy=True) for data in shards]
    else:
        for data in shards:
            data.copy_to_host_async()
        host = [np.asarray(data) for data in shards]
    seconds = time.perf_counter() - started
    del host
    return seconds


_equal = jax.jit(jnp.array_equal)


def check_restored(writer, restored, saved_state) -> None:
    """The restored values against what was saved (first repeat only: it reads everything)."""
    expected = writer.expected(saved_state)
    pairs = (zip(restored, expected) if isinstance(restored, list)
             else ((restored[key], expected[key]) for key in sorted(expected)))
    for got, want in pairs:
        if isinstance(got, np.ndarray):
            same = np.array_equal(got, want)
        else:  # on the devices, in got's layout (a jit needs its arguments on the same devices in one order)
            same = bool(_equal(got, jax.device_put(want, got.sharding)))
        if not same:
            raise AssertionError(f"{writer.name}: the restored state differs from the saved one")


class Bench:
    def __init__(self, ctx, processes: Processes, writers: list, cold_restore: bool):
        self.ctx, self.processes, self.writers = ctx, processes, writers
        self.cold_restore = cold_restore
        self.peak = PeakMemory()
        self.bench_dir = ctx.run_dir / "bench"
        self.counter = 0

    def _folder(self, writer) -> Path:
        """Where a save goes. Ours: its Checkpoints' folder (it names the step folder itself)."""
        if isinstance(writer, OursWrite):
            return writer.checkpoints.directory
        self.counter += 1
        slug = re.sub(r"[^a-z0-9]+", "-", writer.name.lower()).strip("-")
        return self.bench_dir / slug / f"save-{self.counter:04d}"

    def _remove(self, folder: Path) -> None:
        self.processes.barrier()
        if self.processes.rank == 0:
            shutil.rmtree(folder, ignore_errors=True)
        self.processes.barrier()

    def _timed_restore(self, writer, folder: Path, like, saved_state, check: bool) -> float:
        if self.cold_restore:
            drop_from_page_cache(folder)
        self.processes.barrier()
        started = time.perf_counter()
        restored = jax.block_until_ready(writer.restore(folder, like))
        seconds = self.processes.slowest(time.perf_counter() - started)
        if check:
            check_restored(writer, restored, saved_state)
        del restored
        return seconds

    def measure(self, writer, state: dict, resharded_like: dict, check: bool) -> Sample:
        folder = self._folder(writer)
        self.processes.barrier()
        self.peak.start()
        started = time.perf_counter()
        writer.start(folder, state)
        blocking = time.perf_counter() - started
        writer.finish()
        total = time.perf_counter() - started
        peak = self.peak.growth_bytes()
        sample = Sample(self.processes.slowest(blocking), self.processes.slowest(total),
                        int(self.processes.slowest(peak)))
        sample.restore = self._timed_restore(writer, folder, state, state, check)
        if writer.reshards:
            sample.restore_resharded = self._timed_restore(writer, folder, resharded_like, state, check)
        self._remove(folder)
        return sample

    def run_size(self, nbytes: int, leaves: int, repeats: int, saved, resharded, seed: int) -> SizeResult:
        result = SizeResult(nbytes, {writer.name: [] for writer in self.writers})
        state = make_state(nbytes, leaves, saved, seed)
        resharded_like = zeros_like_on(state, resharded)
        for writer in self.writers:
            writer.prepare(state)
        state = fresh(state)  # compiles the negation for this shape, untimed
        for repeat in range(repeats):
            if self.processes.rank == 0 and repeats > 1:
                print(f"bench_checkpoint: {nbytes // MiB} MiB, repeat {repeat + 1}/{repeats}", flush=True)
            state = fresh(state)
            result.d2h.append(self.processes.slowest(time_device_to_host(state, forced=False)))
            state = fresh(state)
            result.forced_copy.append(self.processes.slowest(time_device_to_host(state, forced=True)))
            shift = repeat % len(self.writers)  # rotated order: no writer always follows the same one
            for writer in self.writers[shift:] + self.writers[:shift]:
                state = fresh(state)
                result.samples[writer.name].append(self.measure(writer, state, resharded_like, check=repeat == 0))
        return result


# --- the job -------------------------------------------------------------------------------

def check_sizes(sizes_mib: list, leaves: int, devices: int) -> None:
    for size in sizes_mib + [WARMUP_MIB]:
        rows, rest = divmod(size * MiB // 4 // leaves, COLUMNS)
        if size <= 0 or rest or size * MiB % (4 * leaves) or rows % devices:
            raise ValueError(f"params.sizes_mib: {size} MiB in {leaves} leaves of (rows, {COLUMNS}) float32 needs "
                             f"a whole number of rows that {devices} devices divide evenly")


def make_writers(ctx, processes: Processes, bench_dir: Path, use_orbax: bool) -> tuple[list, list]:
    notes = []
    writers = [RawWrite(processes),
               OursWrite(ctx, processes, bench_dir / "ours-async", asynchronous=True),
               OursWrite(ctx, processes, bench_dir / "ours-sync", asynchronous=False)]
    if ctx.size == 1:
        writers.append(OldEngineWrite())
    else:
        notes.append(f"{OLD}: no rows; it cannot save arrays spread over several processes.")
    if not use_orbax:
        notes.append(f"{ORBAX}: skipped (params.orbax=false).")
    elif ctx.size > 1 and jax.process_count() == 1:
        notes.append(f"{ORBAX}: skipped; several processes need jax.distributed (jax_distributed: true).")
    else:
        try:
            logging.getLogger("absl").setLevel(logging.ERROR)
            writers.append(OrbaxWrite(processes))
        except ImportError:
            notes.append(f"{ORBAX}: skipped; orbax-checkpoint is not installed (pip install -e '.[orbax]').")
    return writers, notes


def main(ctx):
    sizes_mib = [int(s) for s in ctx.params.get("sizes_mib", [64, 512, 2048])]
    repeats = int(ctx.params.get("repeats", 3))
    leaves = int(ctx.params.get("leaves", 4))
    cold_restore = bool(ctx.params.get("cold_restore", True))
    use_orbax = bool(ctx.params.get("orbax", True))
    devices = jax.devices()  # every device of the job: a global mesh when there are several processes
    check_sizes(sizes_mib, leaves, len(devices))
    logging.getLogger("jaxlaunch.checkpoints").setLevel(logging.WARNING)  # not a line per save

    # Saved: rows over the devices. Resharded: the devices in reverse order, columns instead of rows.
    saved = NamedSharding(Mesh(np.array(devices), ("devices",)), PartitionSpec("devices"))
    resharded = NamedSharding(Mesh(np.array(devices[::-1]), ("devices",)), PartitionSpec(None, "devices"))

    processes = Processes(ctx)
    bench = Bench(ctx, processes, [], cold_restore)
    writers, notes = make_writers(ctx, processes, bench.bench_dir, use_orbax)
    bench.writers = writers

    started = time.perf_counter()
    bench.run_size(WARMUP_MIB * MiB, leaves, 1, saved, resharded, seed=1)  # imports, thread pools: untimed
    results = [bench.run_size(size * MiB, leaves, repeats, saved, resharded, seed=0) for size in sizes_mib]
    for writer in writers:
        if isinstance(writer, OrbaxWrite):
            writer.close()
    processes.barrier()
    if ctx.is_main:
        shutil.rmtree(bench.bench_dir, ignore_errors=True)
    else:
        return None

    report = {
        "writers": [w.name for w in writers], "repeats": repeats, "leaves": leaves, "cold_restore": cold_restore,
        "processes": ctx.size, "devices": len(devices), "platform": devices[0].platform,
        "peak_memory_method": "VmHWM reset via clear_refs" if bench.peak.resettable else "ru_maxrss (lower bound)",
        "seconds": round(time.perf_counter() - started, 1), "notes": notes,
        "sizes": [summarize(result, writers) for result in results],
        "jax": jax.__version__, "numpy": np.__version__, "orbax": orbax_version(),
    }
    table = format_table(report)
    text = table + "\n" + footnote(report)
    print(text, flush=True)
    atomic_write_bytes(ctx.run_dir / "bench.json", (json.dumps(report, indent=2) + "\n").encode())
    plot(report, ctx.run_dir / "bench_checkpoint.png")
    medians = [{"nbytes": size["nbytes"], "d2h_s": size["d2h_s"], "forced_copy_s": size["forced_copy_s"],
                "rows": [{k: v for k, v in row.items() if k != "samples"} for row in size["rows"]]}
               for size in report["sizes"]]  # every repeat's figures are in bench.json
    return {"sizes": medians, "table": table, "checks": checks(report), "seconds": report["seconds"]}


def orbax_version():
    try:
        from orbax.checkpoint import __version__
        return __version__
    except ImportError:
        return None


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize(result: SizeResult, writers: list) -> dict:
    raw_totals = [s.total for s in result.samples[RAW]]
    rows = []
    for writer in writers:
        samples = result.samples[writer.name]
        total = _median([s.total for s in samples])
        rows.append({
            "writer": writer.name,
            "blocking_s": _median([s.blocking for s in samples]),
            "total_s": total,
            "gb_per_s": result.nbytes / total / 1e9,
            "total_vs_raw": _median([s.total / raw for s, raw in zip(samples, raw_totals)]),
            "restore_s": _median([s.restore for s in samples]),
            "restore_resharded_s": _median([s.restore_resharded for s in samples]),
            "peak_host_mib": max(s.peak_bytes for s in samples) / MiB,
            "samples": [vars(s) for s in samples],
        })
    return {"nbytes": result.nbytes, "d2h_s": _median(result.d2h), "forced_copy_s": _median(result.forced_copy),
            "d2h_samples": result.d2h, "forced_copy_samples": result.forced_copy, "rows": rows}


def size_label(nbytes: int) -> str:
    return f"{nbytes // (1 << 30)} GiB" if nbytes % (1 << 30) == 0 else f"{nbytes // MiB} MiB"


def seconds_text(value) -> str:
    return "" if value is None else f"{value:.3f}"


def format_table(report: dict) -> str:
    lines = ["| state | writer | blocking s | total s | GB/s | total / raw | D2H s (np.asarray / forced copy) "
             "| restore s | restore resharded s | peak host MiB |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for size in report["sizes"]:
        for row in size["rows"]:
            d2h = (f"{size['d2h_s']:.4f} / {size['forced_copy_s']:.4f}" if row["writer"] == OURS_ASYNC else "")
            restore = seconds_text(row["restore_s"]) + (" (np.load)" if row["writer"] == RAW else "")
            lines.append(f"| {size_label(size['nbytes'])} | {row['writer']} | {row['blocking_s']:.4f} "
                         f"| {row['total_s']:.3f} | {row['gb_per_s']:.2f} | {row['total_vs_raw']:.2f}x | {d2h} "
                         f"| {restore} | {seconds_text(row['restore_resharded_s'])} | {row['peak_host_mib']:.0f} |")
    return "\n".join(lines)


def checks(report: dict) -> list:
    """The targets: our async total within 1 / 0.8 of raw; async blocking <= D2H + 10%."""
    lines = []
    for size in report["sizes"]:
        rows = {row["writer"]: row for row in size["rows"]}
        ours, label = rows[OURS_ASYNC], size_label(size["nbytes"])
        ratio = ours["total_vs_raw"]
        lines.append(f"{label}: async total {ratio:.2f}x raw -> throughput {1 / ratio:.2f}x raw "
                     f"(target >= {THROUGHPUT_TARGET}x): {'ok' if 1 / ratio >= THROUGHPUT_TARGET else 'MISSED'}")
        limit = size["d2h_s"] * D2H_CHECK_SLACK
        lines.append(f"{label}: async blocking {ours['blocking_s']:.4f} s vs device-to-host {size['d2h_s']:.4f} s "
                     f"+ 10% = {limit:.4f} s: {'ok' if ours['blocking_s'] <= limit else 'MISSED'} "
                     f"(blocking - device-to-host = {(ours['blocking_s'] - size['d2h_s']) * 1e3:.1f} ms; "
                     f"a forced host copy takes {size['forced_copy_s']:.4f} s)")
    return lines


def footnote(report: dict) -> str:
    largest = report["sizes"][-1]
    peaks = ", ".join(f"{row['writer']} +{row['peak_host_mib']:.0f} MiB" for row in largest["rows"])
    notes = [
        f"median of {report['repeats']} repeat(s), writers interleaved (rotated order) in every repeat; "
        f"{report['processes']} process(es), {report['devices']} {report['platform']} devices in all, "
        f"{report['leaves']} float32 leaves sharded by rows; restores read {'cold' if report['cold_restore'] else 'warm'} "
        f"files; the whole run took {report['seconds']} s.",
        f"peak host memory of a {size_label(largest['nbytes'])} save (growth of the peak RSS from the call until "
        f"durable, {report['peak_memory_method']}): {peaks}.",
        *report["notes"],
        *checks(report),
    ]
    return "\n".join("  " + note for note in notes)


def plot(report: dict, path: Path) -> None:
    """Top: total save time per writer per size, the blocking part hatched. Bottom: restore times."""
    try:
        from matplotlib.figure import Figure  # a bare Figure: no pyplot global state, no GUI backend
    except ImportError:
        print(f"bench_checkpoint: matplotlib is not installed (pip install -e '.[bench]'); no {path.name}",
              flush=True)
        return
    sizes, writers = report["sizes"], report["writers"]
    colors = {name: f"C{i}" for i, name in enumerate(writers)}
    fig = Figure(figsize=(4.2 * len(sizes), 7.5), layout="constrained")
    axes = fig.subplots(2, len(sizes), squeeze=False)
    for column, size in enumerate(sizes):
        rows = {row["writer"]: row for row in size["rows"]}
        save_ax, restore_ax = axes[0][column], axes[1][column]
        xs = range(len(writers))
        save_ax.bar(xs, [rows[w]["total_s"] for w in writers], color=[colors[w] for w in writers])
        save_ax.bar(xs, [rows[w]["blocking_s"] for w in writers], facecolor="none", edgecolor="black",
                    hatch="///", linewidth=0.8)
        save_ax.set_title(f"save, {size_label(size['nbytes'])}")
        width = 0.4
        restore_ax.bar([x - width / 2 for x in xs], [rows[w]["restore_s"] or 0 for w in writers], width,
                       color=[colors[w] for w in writers])
        restore_ax.bar([x + width / 2 for x in xs], [rows[w]["restore_resharded_s"] or 0 for w in writers], width,
                       color=[colors[w] for w in writers], hatch="..", edgecolor="black", linewidth=0.8)
        restore_ax.set_title(f"restore, {size_label(size['nbytes'])}")
        for ax in (save_ax, restore_ax):
            ax.set_xticks(list(xs), [SHORT_NAMES[w] for w in writers], fontsize="small")
            ax.grid(True, axis="y", alpha=0.3)
        if column == 0:
            save_ax.set_ylabel("seconds until durable (median)\nhatched: blocking")
            restore_ax.set_ylabel("seconds (median)\nplain: same layout, dotted: resharded\nraw: np.load")
    processes = f"{report['processes']} process{'es' if report['processes'] > 1 else ''}"
    fig.suptitle(f"checkpoint save and restore, {processes} x {report['devices'] // report['processes']} "
                 f"{report['platform']} devices, random float32, median of {report['repeats']}")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    atomic_write_bytes(path, buffer.getvalue())
