"""Pure pieces of the per-rank runtime: topology, device binding, results, entrypoint loading."""

import json
import os
import stat

import numpy as np
import pytest

from launcher.rundir.results import encode_result, load_result, write_result
from launcher.rundir import RunDirectory, atomic_write_bytes
from launcher.rank.bootstrap import load_entrypoint
from launcher.rank.topology import (EMULATED_PPN, cpu_device_flags, device_environment,
                                       local_rank_from_env, node_index_from_local_ranks, visible_gpus)


class TestLocalRank:
    def test_open_mpi(self):
        env = {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}
        assert local_rank_from_env(env) == (1, 4)

    def test_srun_task(self):
        env = {"SLURM_LOCALID": "3", "SLURM_STEP_ID": "0", "SLURM_PROCID": "7", "SLURM_TASKS_PER_NODE": "4(x2)"}
        assert local_rank_from_env(env) == (3, 4)

    def test_batch_script_environment_alone_is_not_a_task(self):
        # sbatch exports SLURM_LOCALID=0 to the batch script; mpirun children inherit it.
        assert local_rank_from_env({"SLURM_LOCALID": "0", "SLURM_PROCID": "0"}) is None

    def test_open_mpi_wins_over_inherited_slurm_variables(self):
        env = {"OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
               "SLURM_LOCALID": "0", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0"}
        assert local_rank_from_env(env) == (1, 2)

    def test_emulated_nodes(self):
        env = {EMULATED_PPN: "2", "OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_LOCAL_RANK": "3"}
        assert local_rank_from_env(env) == (1, 2)


@pytest.mark.parametrize("local_ranks, expected", [
    ([0, 1, 0, 1], [(0, 2), (0, 2), (1, 2), (1, 2)]),
    ([0, 0, 0], [(0, 3), (1, 3), (2, 3)]),
    ([0, 1, 2], [(0, 1)] * 3),
])
def test_node_index_from_blocks_of_local_ranks(local_ranks, expected):
    assert [node_index_from_local_ranks(r, local_ranks) for r in range(len(local_ranks))] == expected


def test_node_index_rejects_non_block_mapping():
    with pytest.raises(RuntimeError, match="not in blocks"):
        node_index_from_local_ranks(0, [1, 0])


class TestDeviceBinding:
    def test_cpu_sets_host_device_count_and_keeps_other_flags(self):
        env = device_environment("cpu", 2, 0, {"XLA_FLAGS": "--xla_foo=1 --xla_force_host_platform_device_count=8"})
        assert env == {"JAX_PLATFORMS": "cpu",
                       "XLA_FLAGS": "--xla_foo=1 --xla_force_host_platform_device_count=2"}
        assert cpu_device_flags("", 3) == "--xla_force_host_platform_device_count=3"

    @pytest.mark.parametrize("local_rank, expected", [(0, "0,1"), (1, "2,3"), (3, "6,7")])
    def test_gpu_binding_follows_the_local_rank(self, local_rank, expected):
        assert device_environment("gpu", 2, local_rank, {}) == {"JAX_PLATFORMS": "cuda",
                                                                 "CUDA_VISIBLE_DEVICES": expected}

    def test_slurm_per_task_binding_is_kept(self):
        assert visible_gpus(local_rank=3, devices_per_process=1, already_visible="5") == "5"

    def test_node_wide_list_is_sliced_by_local_rank(self):
        assert visible_gpus(local_rank=1, devices_per_process=2, already_visible="4,5,6,7") == "6,7"

    def test_too_few_gpus_is_a_clear_error(self):
        with pytest.raises(RuntimeError, match="lists only 3; request more GPUs per node"):
            visible_gpus(local_rank=1, devices_per_process=2, already_visible="0,1,2")


class TestResults:
    def test_json_values_and_arrays(self, tmp_path):
        run = RunDirectory(tmp_path)
        write_result(run, {"loss": np.float32(0.5), "steps": np.int64(3), "weights": np.arange(6.0).reshape(2, 3),
                           "nested": [{"ok": True}], "scalar_array": np.array(2.5), "nan": float("nan"),
                           "plain": 1.5})
        raw = json.loads(run.result_file.read_text())
        assert raw["loss"] == {"__scalar__": "float32", "value": 0.5}
        assert raw["steps"] == 3 and raw["scalar_array"] == 2.5  # int64 and float64: plain JSON (PLAIN_SCALARS)
        assert raw["nan"] == {"__float__": "nan"} and raw["plain"] == 1.5
        assert raw["weights"]["shape"] == [2, 3]
        loaded = load_result(tmp_path)
        np.testing.assert_array_equal(loaded["weights"], np.arange(6.0).reshape(2, 3))
        assert loaded["nested"] == [{"ok": True}]
        assert type(loaded["loss"]) is np.float32 and type(loaded["steps"]) is int

    def test_unencodable_value_names_its_path(self):
        encoded = encode_result({"model": [1, object()]})
        assert encoded.unencodable == [("result.model[1]", "object")]
        assert encoded.value["model"][1]["__unencodable__"] == "object"

    def test_atomic_write_leaves_no_partial_file(self, tmp_path, monkeypatch):
        target = tmp_path / "result.json"
        target.write_text("old")

        def broken_replace(src, dst):
            raise OSError("disk full")
        monkeypatch.setattr("os.replace", broken_replace)
        with pytest.raises(OSError):
            atomic_write_bytes(target, b"new")
        assert target.read_text() == "old"
        assert [p.name for p in tmp_path.iterdir()] == ["result.json"]

    @pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
    def test_written_files_follow_the_umask(self, tmp_path, umask, mode):
        """spec.json, status.json, result.json and result.npz are made like any file: 0666 & ~umask."""
        from launcher.spec import JobSpec
        old = os.umask(umask)
        try:
            run = RunDirectory.create(JobSpec(name="x", entrypoint="m:f"), tmp_path / "run")
            run.update_status(state="RUNNING")
            write_result(run, {"weights": np.ones(3)})
        finally:
            os.umask(old)
        for path in (run.spec_file, run.status_file, run.result_file, run.arrays_file):
            assert stat.S_IMODE(path.stat().st_mode) == mode, path.name


def test_run_directory_refuses_to_reuse_a_full_directory(tmp_path):
    from launcher.errors import UsageError
    from launcher.spec import JobSpec
    spec = JobSpec(name="x", entrypoint="m:f")
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "result.json").write_text("{}")
    with pytest.raises(UsageError, match="already holds files"):
        RunDirectory.create(spec, tmp_path / "old")
    run = RunDirectory.create(spec, tmp_path / "new")
    assert run.read_spec() == spec and run.logs.is_dir()


def test_load_entrypoint_from_file_and_module(tmp_path, monkeypatch):
    (tmp_path / "helper.py").write_text("VALUE = 41\n")
    (tmp_path / "job.py").write_text("import helper\ndef main(ctx): return helper.VALUE + 1\n")
    assert load_entrypoint(f"{tmp_path}/job.py:main")(None) == 42
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", list(__import__("sys").path))
    assert load_entrypoint("helper:VALUE") == 41
    with pytest.raises(AttributeError, match="has no function 'nope'"):
        load_entrypoint(f"{tmp_path}/job.py:nope")


class TestBootstrapPieces:
    def test_devices_are_bound_by_local_rank_not_global_rank(self):
        from types import SimpleNamespace

        from launcher.rank.bootstrap import setup_devices
        from launcher.rank.topology import Topology

        spec = SimpleNamespace(platform="gpu", devices_per_process=2, hang_timeout=None)
        topology = Topology(rank=5, size=8, local_rank=1, local_size=4, node_index=1, num_nodes=2)
        assert setup_devices(spec, topology, {})["CUDA_VISIBLE_DEVICES"] == "2,3"

    def test_exception_summary_is_the_exception_not_a_note(self):
        from launcher.rank.bootstrap import exception_summary

        error = TypeError("shapes do not match\nsecond line")
        error.add_note("For simplicity, JAX has removed its internal frames from the traceback")
        assert exception_summary(error) == "TypeError: shapes do not match"
        assert exception_summary(SystemExit(3)) == "SystemExit: sys.exit(3) called"

        Custom = type("Custom", (Exception,), {"__module__": "jaxlaunch_job_train"})
        assert exception_summary(Custom()) == "train.Custom"


class TestCollectiveTracker:
    class Output:
        def __init__(self, ready=False):
            self.ready = ready

        def is_ready(self):
            return self.ready

    def test_pending_until_the_latest_output_is_ready(self):
        from launcher.rank.monitor import CollectiveTracker

        tracker = CollectiveTracker()
        assert tracker.oldest_waiting() is None
        first = self.Output()
        tracker.dispatched(tracker.start("allreduce"), "allreduce", first)
        second = self.Output()
        tracker.dispatched(tracker.start("broadcast"), "broadcast", second)
        seq, name, waited = tracker.oldest_waiting()
        assert (seq, name) == (1, "allreduce") and waited < 1
        first.ready = second.ready = True
        tracker.observe()
        assert tracker.oldest_waiting() is None and tracker.completed() == 2

    def test_the_first_collective_is_pending_while_its_dispatch_blocks(self):
        """Its first call compiles, and on the CPU it runs inline: no output exists yet."""
        from launcher.rank.monitor import CollectiveTracker

        tracker = CollectiveTracker()
        tracker.start("allreduce")
        for _ in range(3):  # monitor polls while the main thread is still inside the call
            tracker.observe()
        assert tracker.oldest_waiting()[:2] == (1, "allreduce")

    def test_a_collective_in_its_dispatch_is_pending_though_the_one_before_finished(self):
        from launcher.rank.monitor import CollectiveTracker

        tracker = CollectiveTracker()
        tracker.dispatched(tracker.start("allreduce"), "allreduce", self.Output(ready=True))
        tracker.observe()
        tracker.start("allreduce")  # the next one: started, not yet dispatched
        for _ in range(3):
            tracker.observe()
        assert tracker.oldest_waiting()[:2] == (2, "allreduce")
        assert tracker.completed() == 1

    def test_a_blocking_call_after_an_unfinished_asynchronous_one_waits_for_it(self):
        from launcher.rank.monitor import CollectiveTracker

        tracker = CollectiveTracker()
        first = self.Output()
        tracker.dispatched(tracker.start("allreduce"), "allreduce", first)
        seq = tracker.start("barrier")
        tracker.enter(seq, "barrier")
        tracker.leave()
        assert tracker.oldest_waiting()[:2] == (1, "allreduce")
        first.ready = True
        tracker.observe()
        assert tracker.oldest_waiting() is None and tracker.completed() == 2

    def test_blocking_call_is_pending_between_enter_and_leave(self):
        from launcher.rank.monitor import CollectiveTracker

        tracker = CollectiveTracker()
        seq = tracker.start("barrier")
        tracker.enter(seq, "barrier")
        assert tracker.oldest_waiting()[:2] == (1, "barrier")
        tracker.leave()
        assert tracker.oldest_waiting() is None

    def test_a_busy_stream_of_collectives_does_not_look_like_a_hang(self, monkeypatch):
        import launcher.rank.monitor as monitor

        clock = [0.0]
        monkeypatch.setattr(monitor.time, "monotonic", lambda: clock[0])
        tracker = monitor.CollectiveTracker()
        outputs = []
        for poll in range(50):  # each poll: 10 new collectives; the ones seen at the last poll are done
            for output in outputs:
                output.ready = True
            outputs = []
            for _ in range(10):
                outputs.append(self.Output())
                tracker.dispatched(tracker.start("allreduce"), "allreduce", outputs[-1])
            clock[0] += 0.2
            assert tracker.oldest_waiting()[2] <= 0.4
        clock[0] += 30  # then nothing finishes any more: a hang
        assert tracker.oldest_waiting()[2] >= 30


def test_a_preemption_notice_during_mpi_init_does_not_kill_the_rank():
    """SIGUSR2 (scancel --signal=USR2, or mpirun forwarding a notice) while the rank is still in
    MPI_Init, which takes a second under load: the handler was installed only after it, and the
    signal's default action killed the rank (seen in CI). When MPI starts, the handler must be there.
    A subprocess whose `mpi4py` is a stand-in that records the SIGUSR2 disposition and stops."""
    import subprocess
    import sys
    import textwrap

    probe = textwrap.dedent("""
        import signal, sys, types
        class Stop(Exception):
            pass
        class Recorder(types.ModuleType):
            def __getattr__(self, name):
                print("SIGUSR2 handled at MPI start:", signal.getsignal(signal.SIGUSR2) not in (signal.SIG_DFL, None))
                raise Stop
        sys.modules["mpi4py"] = Recorder("mpi4py")
        from launcher.rank import bootstrap
        try:
            bootstrap.main()
        except Stop:
            pass
    """)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert "SIGUSR2 handled at MPI start: True" in done.stdout, done.stdout + done.stderr
