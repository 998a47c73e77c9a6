"""Scripts and modules as entrypoints, without mpirun: the spec's four kinds and their checks, a
.py given where SPEC goes, `-- ARG...`, running a program with its argv, the answer to
jax.distributed.initialize(), launcher.context(), the preemption signal and exit codes."""

import os
import signal
import sys
import types

import pytest
from click.testing import CliRunner

from launcher.cli import main as cli
from launcher.errors import SpecError
from launcher.spec import load_spec


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# --- the spec -------------------------------------------------------------------------------

def test_a_script_is_resolved_next_to_the_spec_and_must_exist_and_parse(tmp_path):
    write(tmp_path / "src" / "train.py", "import sys\nprint(sys.argv)\n")
    spec = load_spec(write(tmp_path / "job.yaml", "name: x\nentrypoint: src/train.py\nargs: [--lr, '0.1']\n"))
    assert spec.entrypoint == str(tmp_path / "src" / "train.py")
    assert (spec.entrypoint_kind, spec.runs_program, spec.args) == ("script", True, ["--lr", "0.1"])
    with pytest.raises(SpecError, match=r"job\.yaml:2: entrypoint: file 'nope\.py' not found"):
        load_spec(write(tmp_path / "job.yaml", "name: x\nentrypoint: nope.py\n"))
    write(tmp_path / "broken.py", "def f(:\n")
    with pytest.raises(SpecError, match=r"broken\.py:1: the script has a syntax error"):
        load_spec(write(tmp_path / "job.yaml", "name: x\nentrypoint: broken.py\n"))


def test_a_module_must_be_found_and_a_package_needs_main(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "tool" / "__init__.py", "")
    write(tmp_path / "tool" / "train.py", "print('hi')\n")
    spec_file = tmp_path / "job.yaml"
    assert load_spec(write(spec_file, "name: x\nentrypoint: tool.train\n")).entrypoint_kind == "module"
    with pytest.raises(SpecError, match=r"'tool' is a package without a __main__ module"):
        load_spec(write(spec_file, "name: x\nentrypoint: tool\n"))
    write(tmp_path / "tool" / "__main__.py", "")
    assert load_spec(spec_file).entrypoint == "tool"
    assert load_spec(write(spec_file, "name: x\nentrypoint: pytest\n")).runs_program  # an installed one
    with pytest.raises(SpecError, match=r"module 'no_such_tool' not found"):
        load_spec(write(spec_file, "name: x\nentrypoint: no_such_tool\n"))


def test_a_script_where_the_spec_goes_is_a_spec_of_defaults_named_after_it(tmp_path):
    script = write(tmp_path / "my train!.py", "print(1)\n")
    spec = load_spec(script, ["nodes=2"], program_args=["--lr", "0.1"])
    assert (spec.name, spec.entrypoint, spec.nodes, spec.args) == ("my-train-", str(script), 2, ["--lr", "0.1"])
    assert spec.processes_per_node == 1 and spec.params == {}


def test_program_args_are_appended_to_the_specs_and_a_wrong_args_is_reported(tmp_path):
    write(tmp_path / "t.py", "")
    spec_file = write(tmp_path / "job.yaml", "name: x\nentrypoint: t.py\nargs: [-v]\n")
    assert load_spec(spec_file, program_args=["--lr", "1"]).args == ["-v", "--lr", "1"]
    with pytest.raises(SpecError, match=r"job\.yaml:3: args"):
        load_spec(write(spec_file, "name: x\nentrypoint: t.py\nargs: -v\n"), program_args=["x"])


def test_cli_takes_args_after_dashes_and_short_options_for_nodes_and_processes(tmp_path):
    script = write(tmp_path / "t.py", "")
    result = CliRunner().invoke(cli, ["run", str(script), "-N", "2", "-n", "4", "--print-spec", "--", "--lr", "3"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "nodes = 2  (int)" in lines and "processes_per_node = 4  (int)" in lines
    assert "args[0] = '--lr'  (str)" in lines and "args[1] = '3'  (str)" in lines
    assert any(l.startswith("entrypoint = ") and "(str; script: " in l for l in lines)
    # without `--`, an option meant for the program is refused, not swallowed
    refused = CliRunner().invoke(cli, ["run", str(script), "--lr", "3"])
    assert refused.exit_code == 2 and "No such option '--lr'" in refused.output
    assert "fix: options of the job's own program go after `--`: jaxlaunch run SPEC -- --lr ..." in refused.output


# --- running a program ----------------------------------------------------------------------

@pytest.fixture
def isolated_sys(monkeypatch):
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))


def test_run_program_runs_a_script_as_main_with_argv_and_its_folder_on_the_path(tmp_path, isolated_sys):
    from launcher.rank.program import run_program

    write(tmp_path / "helper_mod_for_script.py", "VALUE = 7\n")
    out = tmp_path / "seen.txt"
    script = write(tmp_path / "prog.py", "import sys, helper_mod_for_script\n"
                                         f"open({str(out)!r}, 'w').write(repr((__name__, sys.argv[1:], "
                                         "helper_mod_for_script.VALUE)))\n")
    run_program(str(script), "script", ["--n", "2"])
    assert out.read_text() == "('__main__', ['--n', '2'], 7)"


def test_run_program_runs_a_module_like_python_m_and_passes_its_exit_on(tmp_path, monkeypatch, isolated_sys):
    from launcher.rank.program import exit_code, run_program, succeeded

    monkeypatch.chdir(tmp_path)
    write(tmp_path / "exiting_pkg_for_test" / "__init__.py", "")
    write(tmp_path / "exiting_pkg_for_test" / "__main__.py", "import sys\nsys.exit(int(sys.argv[1]))\n")
    for code, ok in ((0, True), (4, False)):
        with pytest.raises(SystemExit) as raised:
            run_program("exiting_pkg_for_test", "module", [str(code)])
        assert succeeded(raised.value) is ok and (ok or exit_code(raised.value) == 4)
    assert exit_code(SystemExit("a message")) == 1 and succeeded(SystemExit(None))


def test_program_environment_has_torchruns_names_and_the_specs_coordinator_wins():
    from launcher.rank.bootstrap import program_environment
    from launcher.rank.topology import Topology

    topology = Topology(rank=5, size=8, local_rank=1, local_size=4, node_index=1, num_nodes=2)
    env = program_environment(topology, "10.0.0.1:1234", {})
    assert env == {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "NODE_RANK": "1",
                   "GROUP_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1234",
                   "JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234"}
    assert "MASTER_PORT" not in program_environment(topology, "10.0.0.1:1234", {"MASTER_PORT": "99"})


# --- jax.distributed.initialize() in a rank --------------------------------------------------

def fake_initialize(coordinator_address=None, num_processes=None, process_id=None, local_device_ids=None,
                    cluster_detection_method=None, initialization_timeout=300, heartbeat_timeout_seconds=100,
                    shutdown_timeout_seconds=300, coordinator_bind_address=None, slice_index=None,
                    partition_index=None):
    fake_initialize.calls.append(dict(locals()))


def answer(**overrides):
    from launcher.rank.jax_runtime import InitializeAnswer

    fake_initialize.calls = []
    started = []
    settings = dict(address="127.0.0.1:4000", size=4, rank=2, platform="gpu", timeout=900,
                    started_by_jaxlaunch=False, jax_started=lambda: False, on_started=started.append)
    settings.update(overrides)
    return InitializeAnswer(**settings).wrap(fake_initialize), started


def test_initialize_without_arguments_gets_jaxlaunchs_coordinator_and_timeout(monkeypatch):
    monkeypatch.delenv("JAX_COORDINATOR_ADDRESS", raising=False)
    monkeypatch.delenv("JAX_COORDINATOR_BIND_ADDRESS", raising=False)
    initialize, started = answer()
    initialize()
    call = fake_initialize.calls[0]
    assert (call["coordinator_address"], call["num_processes"], call["process_id"]) == ("127.0.0.1:4000", 4, 2)
    assert call["initialization_timeout"] == 900 and call["coordinator_bind_address"] == "127.0.0.1:4000"
    assert call["cluster_detection_method"] == "deactivate"  # JAX's Slurm detection would rebind the GPU
    assert len(started) == 1
    # what the program gives wins (positional arguments too), and detection stays its choice
    initialize("10.1.1.1:99", 4, 2, initialization_timeout=30, cluster_detection_method="slurm")
    call = fake_initialize.calls[1]
    assert (call["coordinator_address"], call["initialization_timeout"]) == ("10.1.1.1:99", 30)
    assert call["coordinator_bind_address"] is None and call["cluster_detection_method"] == "slurm"


def test_initialize_after_jaxlaunch_started_it_does_nothing_unless_it_asks_for_other_ids():
    initialize, started = answer(started_by_jaxlaunch=True)
    initialize()
    initialize(num_processes=4, process_id=2)
    assert fake_initialize.calls == [] and started == []
    with pytest.raises(RuntimeError, match=r"num_processes=3 \(jaxlaunch has 4\).*jax_distributed: true"):
        initialize(num_processes=3)


def test_initialize_after_jax_started_says_to_set_jax_distributed():
    initialize, _ = answer(jax_started=lambda: True)
    with pytest.raises(RuntimeError, match="set jax_distributed: true in the spec"):
        initialize()
    assert fake_initialize.calls == []


def test_the_answer_is_installed_when_the_module_is_first_imported(tmp_path, monkeypatch):
    from launcher.rank.jax_runtime import AfterImport

    write(tmp_path / "late_module_for_hook.py", "def initialize():\n    return 'original'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    hook = AfterImport("late_module_for_hook", lambda module: seen.append(module.initialize()))
    sys.meta_path.insert(0, hook)
    try:
        import late_module_for_hook  # noqa: F401
    finally:
        sys.modules.pop("late_module_for_hook", None)
        if hook in sys.meta_path:
            sys.meta_path.remove(hook)
    assert seen == ["original"] and hook not in sys.meta_path


# --- launcher.context(), preemption, exit codes ------------------------------------------------

def test_context_outside_jaxlaunch_says_so_and_inside_is_built_once():
    import launcher
    from launcher.rank import context as module

    saved = dict(module._CURRENT)
    try:
        module.set_context()
        with pytest.raises(RuntimeError, match="works only in a process jaxlaunch started"):
            launcher.context()
        built = []
        module.set_context(build=lambda: built.append(1) or types.SimpleNamespace(rank=0))
        assert not module.context_built()
        assert launcher.context() is launcher.context() and built == [1] and module.context_built()
    finally:
        module._CURRENT.clear()
        module._CURRENT.update(saved)


def test_a_notice_is_delivered_once_as_the_programs_signal():
    from launcher.rank.preemption import StopNotice

    received = []
    previous = signal.signal(signal.SIGUSR1, lambda *a: received.append("USR1"))
    try:
        notice = StopNotice()
        assert notice.stopped is None
        notice.deliver = signal.SIGUSR1
        notice.set("supervisor")
        notice.set("SIGUSR2")
        assert received == ["USR1"]
        assert notice.stopped["signal"] == "SIGUSR1" and notice.stopped["sources"] == ["supervisor"]
        # SIGTERM made a notice by should_stop(): our own handler, which a second SIGTERM would end
        ours = StopNotice()
        ours.deliver, ours.sigterm_enabled = signal.SIGTERM, True
        ours.set("supervisor")
        assert ours.delivered is None
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_a_programs_own_exit_code_is_the_jobs():
    from launcher.supervisor.supervise import _program_exit_code

    def failure(**first):
        return {"first_failure": first}
    assert _program_exit_code(failure(kind="exit", exit_code=5)) == 5
    assert _program_exit_code(failure(kind="exception", exit_code=1)) is None
    assert _program_exit_code(failure(kind="exit", exit_code=0)) is None
    assert _program_exit_code(None) is None


def test_hang_report_names_a_rank_that_had_left_its_entrypoint():
    from launcher.supervisor.root_cause import hang_lines, hang_report

    report = hang_report(2, [{"rank": 0, "host": "n0", "where": "x.py:3 in <module>", "waiting_in": None,
                              "collectives_started": 0}], [], finished_ranks={1})
    lines = hang_lines(report)
    assert lines[1].startswith("  rank 1: had left its entrypoint (ended without an error)")


def test_launcher_context_is_public_api():
    import launcher

    assert "context" in launcher.__all__ and callable(launcher.context)
    assert os.environ.get("RANK") is None or True  # the unit tier sets no rank variables of its own


def test_explain_says_what_each_rank_runs_and_torchruns_variables(tmp_path):
    from launcher.backends import get_backend
    from launcher.cli.explain_table import format_explain

    script = write(tmp_path / "train.py", "")
    spec = load_spec(script, ["processes_per_node=4"], program_args=["--lr", "1"])
    text = format_explain(spec, get_backend("local"), tmp_path / "run")
    assert f"runs {script} (script: a .py file run as __main__" in text and "with argv ['--lr', '1']" in text
    assert "with torchrun's variables: RANK=<RANK> LOCAL_RANK=<LOCAL> WORLD_SIZE=4 LOCAL_WORLD_SIZE=4" in text


def test_args_for_a_function_entrypoint_are_refused_not_dropped(tmp_path):
    write(tmp_path / "job.py", "def main(ctx):\n    return 1\n")
    spec_file = write(tmp_path / "job.yaml", "name: x\nentrypoint: job.py:main\n")
    with pytest.raises(SpecError, match=r"args: args are a script's or module's argv, and the entrypoint "
                                        r"'job\.py:main' is a function: it gets ctx\.params instead"):
        load_spec(spec_file, program_args=["--lr", "1"])


def test_an_attempt_ends_preempted_or_completed_by_its_entrypoints_kind():
    """A function's ranks stop together (all), a program's handler may act on any rank; a program
    completes without a result, a function needs rank 0's."""
    from launcher.spec import JobSpec
    from launcher.supervisor.attempt import ended_well

    program = JobSpec(name="x", entrypoint="train.py", processes_per_node=2)
    function = JobSpec(name="x", entrypoint="m:f", processes_per_node=2)
    one_stopped = [{"rank": 0, "stopped": {"signal": "SIGTERM"}}, {"rank": 1, "stopped": None}]
    both_ran = [{"rank": 0}, {"rank": 1}]
    assert ended_well(one_stopped, program, has_result=False) == "PREEMPTED"
    assert ended_well(one_stopped, function, has_result=True) == "COMPLETED"
    assert ended_well([{**d, "stopped": {"call": 3}} for d in both_ran], function, has_result=False) == "PREEMPTED"
    assert ended_well(both_ran, program, has_result=False) == "COMPLETED"
    assert ended_well(both_ran, function, has_result=False) is None  # rank 0 wrote no result
    assert ended_well(both_ran[:1], program, has_result=False) is None  # rank 1 never said it was done
