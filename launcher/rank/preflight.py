"""Cross-rank preflight at job start: every rank reports its software and devices; rank 0
compares them and the job stops at once, with a table that marks the odd rank out, when they
differ. Catches what otherwise shows up hours into a job: a node with another venv (other
versions of jax, mpi4jax, numpy...), a wrong device count, two ranks bound to one GPU. Ranks in a
container image report the image's software, and its jaxlaunch must be the host's version.

The report is saved as RUN_DIR/preflight.json. Costs one gather and one broadcast of small
dicts, and package versions read from metadata (nothing extra is imported).
"""

from __future__ import annotations

import os
import socket
import sys
from importlib import metadata

from ..environment import HOST_VERSION_ENV

PACKAGES = ("jax", "jaxlib", "mpi4jax", "mpi4py", "numpy")
# Fields every rank must agree on; the rest is for the record.
MUST_MATCH = ("python", "python_version", "jaxlaunch", *PACKAGES, "mpi_library", "platform", "device_count")


class PreflightError(RuntimeError):
    """The ranks differ in a way that would make the job fail or compute wrong results later."""


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "missing"


NVIDIA_GPUS = "/proc/driver/nvidia/gpus"


def gpu_identities(visible: list[str], info_dir: str = NVIDIA_GPUS, order: str | None = None) -> list[str]:
    """Each CUDA_VISIBLE_DEVICES entry as the GPU's UUID where the driver's files tell (an index is
    resolved by PCI bus order, which is CUDA's when CUDA_DEVICE_ORDER=PCI_BUS_ID or every GPU of the
    node is the same model); otherwise the entry as written."""
    import glob

    order = os.environ.get("CUDA_DEVICE_ORDER", "") if order is None else order
    gpus = []
    for path in glob.glob(os.path.join(info_dir, "*", "information")):
        try:
            fields = dict(line.split(":", 1) for line in open(path).read().splitlines() if ":" in line)
        except OSError:
            continue
        fields = {k.strip(): v.strip() for k, v in fields.items()}
        if fields.get("GPU UUID"):
            gpus.append((fields.get("Bus Location", os.path.basename(os.path.dirname(path))),
                         fields["GPU UUID"], fields.get("Model", "")))
    gpus.sort()
    by_index = {str(i): uuid for i, (_, uuid, _) in enumerate(gpus)}
    if order != "PCI_BUS_ID" and len({model for _, _, model in gpus}) > 1:
        by_index = {}  # CUDA's default order (fastest first) may differ from the bus order
    return [by_index.get(entry, entry) for entry in visible]


def local_report(rank: int, devices, mpi_library: str, platform: str | None = None) -> dict:
    """What this rank runs with: host, interpreter, package versions, MPI, devices. `devices` is
    None before a script or module has started JAX (it may start jax.distributed itself): then
    the spec's `platform` stands for them, and no device is counted."""
    from .. import __version__

    platform = devices[0].platform if devices else (platform or "none")
    devices = devices or []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "") if platform == "gpu" else ""
    return {
        "rank": rank, "host": socket.gethostname(), "python": sys.executable,
        "python_version": sys.version.split()[0], "jaxlaunch": __version__,
        **{package: _version(package) for package in PACKAGES},
        # "Open MPI v5.0.11, package: ..., ident: ..., repo rev: ...": the name and version suffice
        "mpi_library": mpi_library.splitlines()[0].strip().rstrip("\x00").split(",")[0] if mpi_library else "",
        "platform": platform, "device_count": len(devices),
        # Physical GPUs this rank may use (CUDA_VISIBLE_DEVICES ids, shown), and the same as UUIDs where
        # the driver says which is which (for the duplicate-binding check: "0" and "GPU-5e08..." can
        # be one GPU; seen on an H100, 2026-11-26).
        "gpus": [g.strip() for g in visible.split(",") if g.strip()],
        "gpu_ids": gpu_identities([g.strip() for g in visible.split(",") if g.strip()]),
        "device_ids": [int(getattr(d, "id", i)) for i, d in enumerate(devices)],
    }


def compare(reports: list[dict], expected_devices: int | None, host_version: str | None = None) -> list[str]:
    """Problems found across the ranks' reports, each naming the odd rank(s) out. `host_version`:
    jaxlaunch's version on the host, when the ranks run in a container image."""
    problems = []
    inside = sorted({str(r.get("jaxlaunch")) for r in reports if r.get("jaxlaunch") != host_version})
    if host_version is not None and inside:
        problems.append(f"jaxlaunch: the container image has {', '.join(inside)}, the host (the job's supervisor) "
                        f"has {host_version}; they must be the same version: rebuild the image with "
                        f"jaxlaunch=={host_version}")
    for field in MUST_MATCH:
        values: dict = {}
        for report in reports:
            values.setdefault(str(report.get(field)), []).append(report["rank"])
        if len(values) > 1:
            common = max(values, key=lambda v: len(values[v]))
            odd = ", ".join(f"rank {', '.join(map(str, ranks))} has {value}"
                            for value, ranks in values.items() if value != common)
            problems.append(f"{field}: {odd}; the others have {common}")
    wrong_count = [] if expected_devices is None else \
        [r["rank"] for r in reports if r.get("device_count") != expected_devices]
    if wrong_count:
        problems.append(f"device_count: rank(s) {', '.join(map(str, wrong_count))} see a different number of "
                        f"devices than devices_per_process={expected_devices}")
    by_host: dict[str, dict[str, int]] = {}
    for report in reports:
        shown = report.get("gpus", [])
        for position, gpu in enumerate(report.get("gpu_ids") or shown):
            owner = by_host.setdefault(report["host"], {}).get(gpu)
            name = shown[position] if position < len(shown) else gpu
            if owner is not None:
                also = "" if name == gpu else f" ({gpu})"
                problems.append(f"GPU {name}{also} on {report['host']} is bound to rank {owner} and rank "
                                f"{report['rank']}: two ranks would share one GPU (check CUDA_VISIBLE_DEVICES and "
                                f"the binding)")
            else:
                by_host[report["host"]][gpu] = report["rank"]
    return problems


def format_reports(reports: list[dict], problems: list[str]) -> str:
    """One row per rank; a `!` marks each value that differs from the majority."""
    from tabulate import tabulate

    columns = ["rank", "host", "python", "jaxlaunch", *PACKAGES, "mpi_library", "platform", "device_count", "gpus"]
    majority = {}
    for column in columns[1:]:
        counts: dict = {}
        for report in reports:
            counts[str(report.get(column))] = counts.get(str(report.get(column)), 0) + 1
        majority[column] = max(counts, key=counts.get)
    rows = []
    for report in reports:
        row = []
        for column in columns:
            value = str(report.get(column))
            odd = column in MUST_MATCH and value != majority.get(column, value)
            row.append(("! " if odd else "") + value)
        rows.append(row)
    table = tabulate(rows, headers=columns)
    return "\n".join([*problems, "", table]) if problems else table


def gpu_warnings(report: dict) -> list[str]:
    """On GPU: mpi4jax's CUDA bridge, and whether the MPI is CUDA-aware."""
    if report["platform"] != "gpu":
        return []
    warnings = []
    try:
        from mpi4jax import has_cuda_support  # mpi4jax's own check for its CUDA bridge
        bridge = has_cuda_support()
    except ImportError:
        bridge = None
    if bridge is False:
        warnings.append("mpi4jax was built without its CUDA bridge: collectives of GPU arrays will fail. Fix: "
                        "rebuild it with CUDA_PATH set to the CUDA toolkit (pip install --no-build-isolation "
                        "--force-reinstall --no-binary mpi4jax mpi4jax)")
    aware = os.environ.get("MPI4JAX_USE_CUDA_MPI")
    if aware not in ("1", "true", "True"):
        warnings.append("MPI4JAX_USE_CUDA_MPI is not set: mpi4jax copies GPU buffers through host memory for "
                        "each collective. If the MPI is CUDA-aware (Open MPI built with --with-cuda; check "
                        "`ompi_info --parsable --all | grep mpi_built_with_cuda_support:value`), set "
                        "MPI4JAX_USE_CUDA_MPI=1 in the spec's env")
    return warnings


def run_preflight(comm, run, rank: int, devices, expected_devices: int | None, platform: str | None = None) -> dict:
    """Gather every rank's report on rank 0, compare, save preflight.json, and raise
    PreflightError on every rank if they differ (rank 0 decides; the verdict is broadcast).
    Without `devices` (a script's JAX has not started), the devices are not compared."""
    import time

    from mpi4py import MPI

    from ..rundir import atomic_write_json

    started = time.perf_counter()
    report = local_report(rank, devices, MPI.Get_library_version(), platform)
    own_seconds = time.perf_counter() - started
    reports = comm.gather(report, root=0)  # includes waiting for the slowest rank to get here
    verdict = None
    if rank == 0:
        problems = compare(reports, expected_devices, os.environ.get(HOST_VERSION_ENV))
        document = {"ok": not problems, "problems": problems, "warnings": gpu_warnings(report),
                    "ranks": reports, "seconds": None}
        if problems:  # the first line is the one-line summary `jaxlaunch run` and failure.json show
            verdict = (f"the ranks differ: {problems[0]}" + (f" (and {len(problems) - 1} more)" if len(problems) > 1
                                                             else "")
                       + "\npreflight, before the job's code ran:\n" + format_reports(reports, problems)
                       + f"\n(saved in {run.preflight_file})")
        document["seconds"] = round(time.perf_counter() - started, 4)
        document["report_seconds"] = round(own_seconds, 4)  # rank 0's own cost of its report
        atomic_write_json(run.preflight_file, document)
    verdict = comm.bcast(verdict, root=0)
    if verdict is not None:
        raise PreflightError(verdict)
    return report
