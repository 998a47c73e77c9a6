"""`jaxlaunch explain`: the per-rank plan (from the same binding code the ranks run) and the
resources. Checks against a real cluster are in test_slurm_explain.py."""

from pathlib import Path

import pytest
from click.testing import CliRunner

from launcher.cli import main
from launcher.cli.explain_table import plan_ranks
from launcher.backends.slurm.fit import _gres_gpus, _mem_request_mb, _slurm_seconds
from launcher.spec import load_spec

SPEC = "name: x\nentrypoint: m:f\nnodes: 2\nprocesses_per_node: 2\ndevices_per_process: 2\n"


def test_explain_table_for_2_nodes_x_2_processes_x_2_devices(write_spec, tmp_path):
    result = CliRunner().invoke(main, ["explain", str(write_spec(SPEC)), "--run-dir", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "x: 2 node(s) x 2 process(es) x 2 cpu device(s) = 4 ranks, 8 devices; on this machine, under mpirun"
    rows = [line.split() for line in lines[4:8]]
    assert [row[:6] for row in rows] == [["0", "0", "0", "2", "host", "devices"], ["1", "0", "1", "2", "host", "devices"],
                                         ["2", "1", "0", "2", "host", "devices"], ["3", "1", "1", "2", "host", "devices"]]
    assert [row[6] for row in rows] == ["0-1", "2-3", "4-5", "6-7"]  # global device indices
    assert all(row[7] == "Mesh(devices=2)" for row in rows)
    shared = next(line for line in lines if line.startswith("every rank also gets: "))
    assert "XLA_FLAGS=--xla_force_host_platform_device_count=2" in shared and "JAX_PLATFORMS=cpu" in shared
    assert f"JAXLAUNCH_RUN_DIR={tmp_path / 'run'}" in shared and "JAXLAUNCH_EMULATED_PROCESSES_PER_NODE=2" in shared
    resources = [line.split() for line in lines if line.startswith(("per node", "total"))]
    assert resources == [["per", "node", "2", "4", "2", "0"], ["total", "(2", "nodes)", "4", "8", "4", "0"]]


def test_gpu_binding_follows_the_local_rank_not_the_global_rank(write_spec):
    spec = load_spec(write_spec(SPEC + "platform: gpu\n"))
    rows = plan_ranks(spec, "slurm", Path("/r"))
    assert [r.env["CUDA_VISIBLE_DEVICES"] for r in rows] == ["0,1", "2,3", "0,1", "2,3"]
    assert [r.global_devices for r in rows] == ["0-1", "2-3", "4-5", "6-7"]


def test_cluster_value_parsers():
    assert _gres_gpus("gpu:4") == 4 and _gres_gpus("gpu:a100:4(S:0-1)") == 4 and _gres_gpus("(null)") == 0
    assert _gres_gpus("gpu:a100:2,gpu:v100:2") == 4
    assert _slurm_seconds("1-00:00:00") == 86400 and _slurm_seconds("UNLIMITED") is None
    assert _slurm_seconds("30:00") == 1800
    assert _mem_request_mb(["--mem=8G"]) == 8192 and _mem_request_mb(["--exclusive"]) is None


def test_a_sweep_is_checked_against_one_reading_of_the_cluster(write_spec, monkeypatch):
    from launcher.backends.slurm import scheduler

    calls = []
    answers = {"partition": "PartitionName=debug Default=YES TotalNodes=2 MaxNodes=UNLIMITED MaxTime=UNLIMITED "
                            "State=UP\n",
               "node": "NodeName=n1 Partitions=debug CPUTot=2 RealMemory=4000 Gres=(null)\n"
                       "NodeName=n2 Partitions=debug CPUTot=2 RealMemory=4000 Gres=(null)\n"}
    monkeypatch.setattr(scheduler, "call_slurm", lambda argv, **kw: calls.append(argv) or answers[argv[2]])
    from launcher.errors import UsageError
    from launcher.backends.slurm.fit import refuse_if_it_cannot_fit

    base = load_spec(write_spec("name: x\nentrypoint: m:f\n"))
    specs = [base.replace(nodes=n, processes_per_node=p) for n in (1, 2, 3) for p in (1, 2, 4)]
    with pytest.raises(UsageError) as refused:
        refuse_if_it_cannot_fit(specs)
    text = str(refused.value)
    assert len(calls) == 2  # one reading of partitions and nodes for the nine
    assert text.count("3 nodes requested") == 1 and text.count("4 CPUs per node requested") == 1


@pytest.mark.parametrize("settings", [["timeout=10m"], ["slurm.time=10m"], ["timeout=10m", "slurm.time=20m"]])
def test_the_time_limit_fix_the_fit_check_suggests_does_fit(write_spec, settings):
    """Issue 29: on a partition with MaxTime=5 it said "lower slurm.time (or timeout) to 00:05:00", and
    `--set timeout=5m` was refused again: Slurm's limit is the timeout plus a minute."""
    import re

    from launcher.backends.slurm.fit import check_against_cluster

    cluster = ([{"PartitionName": "short", "Default": "YES", "TotalNodes": "2", "MaxTime": "00:05:00"}], [])
    spec = load_spec(write_spec("name: x\nentrypoint: m:f\n"), overrides=settings)
    problems, _ = check_against_cluster(spec, cluster)
    assert len(problems) == 1 and "MaxTime 00:05:00" in problems[0], problems
    fixes = re.findall(r"--set (\S+?)(?= or less)", problems[0])
    assert fixes, problems[0]
    fixed = load_spec(write_spec("name: x\nentrypoint: m:f\n"), overrides=[*settings, *fixes])
    assert check_against_cluster(fixed, cluster) == ([], []), fixes


def test_what_platform_gpu_needs_on_this_machine():
    from launcher.rank.topology import missing_for_gpu

    assert missing_for_gpu(device_files=[], plugins=["jax-cuda12-plugin 0.10.2"]) == (
        "this machine has no NVIDIA GPU (no /dev/nvidia0)")
    assert "JAX's CUDA plugin is not installed" in missing_for_gpu(device_files=["/dev/nvidia0"], plugins=[])
    assert missing_for_gpu(device_files=["/dev/nvidia0"], plugins=["jax-cuda12-plugin 0.10.2"]) is None


def test_a_rank_bound_past_the_nodes_gpus_is_told_so_not_to_install_cuda():
    """Seen on a 1-GPU machine (H100, 2026-11-26): 2 ranks, rank 1 bound to GPU 1; JAX said
    CUDA_ERROR_NO_DEVICE and the rank's error advised installing JAX's CUDA build."""
    from launcher.rank.topology import binding_beyond_node

    why = binding_beyond_node("1", 1, device_files=["/dev/nvidia0"])
    assert why == ("local rank 1 was bound to GPU 1 (CUDA_VISIBLE_DEVICES=1), but this node has 1 GPU: "
                   "processes_per_node x devices_per_process asks for more GPUs per node than it has")
    assert binding_beyond_node("2,3", 1, device_files=["/dev/nvidia0", "/dev/nvidia1"]).startswith(
        "local rank 1 was bound to GPU 2, 3")
    assert binding_beyond_node("0", 0, device_files=["/dev/nvidia0"]) is None
    assert binding_beyond_node("GPU-5e08", 1, device_files=["/dev/nvidia0"]) is None  # UUIDs: cannot tell
    assert binding_beyond_node("1", 1, device_files=[]) is None  # no GPU at all: missing_for_gpu says so


def test_explain_says_before_a_local_run_that_its_ranks_would_be_bound_past_this_machines_gpus():
    """Noticed on a 1-GPU machine (H100, 2026-11-27): explain showed rank 1 on GPU 1 without a
    word; the run then refused rank 1 as it started."""
    from launcher.rank.topology import gpus_short_here

    one_gpu = ["/dev/nvidia0"]
    assert gpus_short_here(2, 1, None, one_gpu) == (
        "processes_per_node x devices_per_process = 2 x 1 binds 2 GPUs per node, but this machine has 1: "
        "local rank 1 and later would be bound to a GPU that is not there")
    assert gpus_short_here(2, 2, "0,1", [*one_gpu, "/dev/nvidia1"]).endswith(
        "but CUDA_VISIBLE_DEVICES=0,1 lists 2: local rank 1 and later would be bound to a GPU that is not there")
    assert gpus_short_here(1, 1, None, one_gpu) is None
    assert gpus_short_here(2, 1, "0,1", one_gpu) is None       # the environment's list is what is bound
    assert gpus_short_here(2, 1, "GPU-5e08", one_gpu) is None  # UUIDs: cannot tell
    assert gpus_short_here(4, 1, None, []) is None              # no GPU at all: missing_for_gpu says so


def test_the_local_backends_fit_names_the_gpu_shortfall_with_its_fix(monkeypatch):
    from launcher.backends.local import plan
    from launcher.spec import JobSpec

    monkeypatch.setattr(plan, "_missing_for_gpu", lambda spec: None)
    monkeypatch.setattr(plan, "gpus_short_here", lambda ppn, d, visible: f"{ppn}x{d} short of {visible}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    spec = JobSpec(name="j", entrypoint="m.py:f", platform="gpu", processes_per_node=2)
    assert plan.problems_here(spec) == [f"2x1 short of 0. Fix: {plan.BINDING_FIX}"]
    assert plan.problems_here(spec.replace(platform="cpu")) == []


@pytest.mark.skipif(Path("/dev/nvidia0").exists(), reason="this machine has a GPU")
def test_platform_gpu_without_a_gpu_is_refused_by_run_and_explain_not_a_bare_assertion(tmp_path):
    """Issue 29: `platform: gpu` on a host without a GPU failed in every rank with JAX's bare
    AssertionError, and explain showed `GPU 0` as if it would work."""
    from conftest import EXAMPLES, jaxlaunch

    result = jaxlaunch("run", EXAMPLES / "normalize.yaml", "--set", "platform=gpu", "--run-dir", tmp_path / "run",
                       timeout=60)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "AssertionError" not in result.stderr
    assert "platform: gpu, but this machine has no NVIDIA GPU (no /dev/nvidia0)" in result.stderr
    assert "fix: run on a GPU node" in result.stderr
    assert not (tmp_path / "run").exists()  # refused before anything was made

    explained = CliRunner().invoke(main, ["explain", str(EXAMPLES / "normalize.yaml"), "--set", "platform=gpu"])
    assert explained.exit_code == 2
    assert explained.output.splitlines()[-1].startswith(
        "refused: platform: gpu, but this machine has no NVIDIA GPU (no /dev/nvidia0). Fix: ")
    assert CliRunner().invoke(main, ["explain", str(EXAMPLES / "normalize.yaml")]).exit_code == 0


@pytest.mark.parametrize("settings, says", [
    ("", "device arrays travel over mpi4jax (MPI); auto: XLA's collectives need jax_distributed: true"),
    ("jax_distributed: true\n", "over mpi4jax (MPI); auto: on CPU, XLA's collectives go through gloo"),
    ("jax_distributed: true\nplatform: gpu\n", "over XLA's collectives over a mesh of every process (NCCL); auto: on GPU"),
    ("jax_distributed: true\ntransport: xla\n", "over XLA's collectives over a mesh of every process (gloo); "
                                                 "set in the spec (transport: xla)"),
    ("jax_distributed: true\nplatform: gpu\ntransport: mpi4jax\n", "over mpi4jax (MPI); set in the spec"),
])
def test_explain_says_which_transport_the_collectives_use_and_why(write_spec, settings, says):
    from launcher.cli.explain_table import transport_line
    line = transport_line(load_spec(write_spec(SPEC + settings)))
    assert line.startswith("launcher collectives: ") and says in line, line
    if "gpu" not in settings:  # (a GPU job is refused on this CPU machine before the plan is shown)
        result = CliRunner().invoke(main, ["explain", str(write_spec(SPEC + settings))])
        assert result.exit_code == 0 and line in result.output.splitlines(), result.output


def test_transport_xla_without_jax_distributed_is_refused_with_the_fix(write_spec):
    result = CliRunner().invoke(main, ["explain", str(write_spec(SPEC + "transport: xla\n"))])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "job.yaml:6: transport: XLA's collectives run over JAX's multi-process runtime; set jax_distributed: true" \
        in result.output, result.output


def test_explain_says_which_watchdog_a_program_gets_and_a_missing_time_limit_in_words(write_spec):
    """Issue 43: a program that never reports is watched through its ranks' stacks; issue 44: 'the
    whole job may run none (timeout)' read as nonsense."""
    from launcher.cli.explain_table import watchdog_lines

    lines = watchdog_lines(load_spec(write_spec("name: x\nentrypoint: m:f\n")))
    assert lines[0].startswith("hang watchdog: auto: 2 min when the ranks stall apart (a culprit), else max(10 min")
    assert lines[1] == ("progress: each ctx.report() and, in a job that never reports (most programs), each rank's "
                        "stack moving")
    assert lines[2] == "a launcher collective may wait 30 min; the whole job has no time limit (timeout: null)"
    off = watchdog_lines(load_spec(write_spec("name: x\nentrypoint: m:f\nhang_timeout: null\ntimeout: 5m\n")))
    assert off == ["hang watchdog: off (hang_timeout: null)",
                   "a launcher collective may wait 30 min; the whole job may run 5 min (timeout)"]


def test_more_processes_than_cores_is_a_warning_in_explain_and_run(write_spec, monkeypatch):
    """Issue 44, item 8: 64 processes on a 2-core machine ran without a word."""
    from launcher.backends.local import plan

    monkeypatch.setattr(plan.os, "cpu_count", lambda: 2)
    crowded = load_spec(write_spec("name: x\nentrypoint: m:f\nnodes: 4\nprocesses_per_node: 16\n"))
    assert plan.oversubscribed(crowded) == (
        "64 processes on 2 cores here: they take turns on the cores (oversubscribed), so each runs slower and "
        "timings mean little; fewer processes (-n, -N) fit this machine")
    assert plan.oversubscribed(load_spec(write_spec("name: x\nentrypoint: m:f\nprocesses_per_node: 2\n"
                                                    "devices_per_process: 4\n"))) is None  # emulated devices share
    result = CliRunner().invoke(main, ["explain", str(write_spec("name: x\nentrypoint: m:f\n")), "-n", "3"])
    assert result.output.rstrip().endswith("warning: 3 processes on 2 cores here: they take turns on the cores "
                                           "(oversubscribed), so each runs slower and timings mean little; fewer "
                                           "processes (-n, -N) fit this machine"), result.output


def test_a_job_without_a_time_limit_is_told_which_limit_of_the_partition_applies(write_spec):
    """Issue 44, item 4: a script submitted to Slurm got no #SBATCH --time and ran to the partition's
    limit without a word."""
    from launcher.backends.slurm.fit import check_against_cluster

    spec = load_spec(write_spec("name: x\nentrypoint: m:f\n"))
    cluster = ([{"PartitionName": "debug", "Default": "YES", "TotalNodes": "2", "MaxTime": "UNLIMITED",
                 "DefaultTime": "01:00:00"}], [])
    problems, warnings = check_against_cluster(spec, cluster)
    assert not problems and warnings == [
        "no time limit in the spec (timeout, slurm.time): partition 'debug''s limit applies, its DefaultTime 01:00:00; "
        "set timeout (the supervisor then stops the job with a hang report) or slurm.time"]
    cluster[0][0]["DefaultTime"] = "NONE"
    assert "its MaxTime UNLIMITED" in check_against_cluster(spec, cluster)[1][0]
    timed = load_spec(write_spec("name: x\nentrypoint: m:f\ntimeout: 1h\n"))
    assert check_against_cluster(timed, cluster) == ([], [])
