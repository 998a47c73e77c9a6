"""The CLI through click's CliRunner: exact messages and exit codes, no tracebacks."""

import sys

import pytest

from launcher.cli import main
from launcher.launchers.mpirun import find_mpirun

from cli_helpers import invoke
from conftest import ROOT


def test_misspelled_key_exits_2_with_file_line_and_valid_keys(write_spec):
    path = write_spec("name: x\nentrypoint: m:f\nnodez: 2\n")
    result = invoke("run", path)
    assert result.exit_code == 2
    assert result.output == (
        f"Error: {path}:3: nodez: unknown key.\n"
        "  valid keys: args, async_checkpoints, collective_timeout, compile_cache, container, "
        "devices_per_process, entrypoint, env, hang_timeout, jax_distributed, jax_distributed_timeout, "
        "keep_checkpoints, max_parallel, max_restarts, name, nodes, output, params, platform, preemption_signal, "
        "processes_per_node, run_dir, setup, slurm, snapshot, stop_repeated_failures, sweep, sweep_limit, timeout, "
        "transport\n"
        "  fix: did you mean 'nodes'? rename or remove the key.\n")
    assert "Traceback" not in result.output


def test_bad_override_exits_2(write_spec):
    result = invoke("run", write_spec("name: x\nentrypoint: m:f\n"), "--set", "nodes=zero")
    assert result.exit_code == 2
    assert result.output.startswith("Error: --set nodes=zero: nodes: expected an integer")


def test_missing_spec_file_exits_2(tmp_path):
    result = invoke("run", tmp_path / "none.yaml")
    assert result.exit_code == 2
    assert result.output == f"Error: {tmp_path / 'none.yaml'}: no such file.\n  fix: check the path to the job spec.\n"


def test_unknown_option_is_a_usage_error(write_spec):
    result = invoke("run", write_spec("name: x\nentrypoint: m:f\n"), "--nope")
    assert result.exit_code == 2 and "No such option '--nope'" in result.output


def test_dry_run_prints_the_exact_command_and_environment(tmp_path):
    result = invoke("run", ROOT / "jobs" / "examples" / "normalize.yaml", "--run-dir", tmp_path / "r", "--dry-run",
                    "--set", "env.EXTRA=1 2")
    assert result.exit_code == 0, result.output
    root_flag = " --allow-run-as-root" if __import__("os").geteuid() == 0 else ""
    assert result.output == (
        "command:\n"
        f"  {find_mpirun()} -n 2 --oversubscribe --bind-to none{root_flag} {sys.executable} "
        "-m launcher.rank.bootstrap\n"
        "environment:\n"
        "  EXTRA='1 2'\n"
        "  GLIBC_TUNABLES=glibc.malloc.mmap_threshold=4294967296:glibc.malloc.trim_threshold=4294967296\n"
        "  JAXLAUNCH_EMULATED_PROCESSES_PER_NODE=1\n"
        f"  JAXLAUNCH_RUN_DIR={tmp_path / 'r'}\n")
    assert not (tmp_path / "r").exists()  # a dry run creates nothing


def test_run_into_a_used_directory_exits_2(tmp_path):
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "result.json").write_text("{}")
    result = invoke("run", ROOT / "jobs" / "examples" / "normalize.yaml", "--run-dir", tmp_path / "used")
    assert result.exit_code == 2
    assert result.output == f"Error: run directory {tmp_path / 'used'} already holds files; choose a new or empty one\n"


def test_help_lists_every_command():
    result = invoke("--help")
    assert result.exit_code == 0
    for command in main.commands:
        assert command in result.output


def test_every_command_has_the_help_text_the_generated_cli_reference_shows():
    """docs/reference/cli.md is generated from these (mkdocs-click); tests/unit/test_docs.py checks the page."""
    for name, command in main.commands.items():
        assert command.help and len(command.help.split()) >= 4, f"`jaxlaunch {name}` has no help text"


@pytest.mark.parametrize("command", ["run", "submit", "render"])
def test_print_spec_shows_each_resolved_value_with_its_type_and_runs_nothing(write_spec, tmp_path, command):
    path = write_spec("name: x\nentrypoint: m:f\nparams: {flag: on}\ntimeout: 1h\n")
    result = invoke(command, path, "--set", "params.lr=1e-3", "--set", "params.when=1:30",
                    "--run-dir", tmp_path / "run", "--print-spec")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    for expected in ("name = 'x'  (str)", "params.flag = 'on'  (str)", "params.lr = 0.001  (float)",
                     "params.when = '1:30'  (str)", "nodes = 1  (int)", "timeout = 3600  (int, seconds)",
                     "jax_distributed = False  (bool)", "run_dir = None  (null)", "slurm.launch = 'mpirun'  (str)",
                     "setup = []  (list)", "snapshot = False  (bool)", "container = None  (null)"):
        assert expected in lines
    assert "hang_timeout = 'auto'  (str)" in lines
    assert len(lines) == 44  # one line per key, params expanded
    assert not (tmp_path / "run").exists()


def test_print_spec_of_a_bad_spec_exits_2(write_spec):
    result = invoke("render", write_spec("name: x\nentrypoint: m:f\n"), "--set", "nodes=!!int x", "--print-spec")
    assert result.exit_code == 2 and result.output.startswith("Error: --set nodes=!!int x: nodes: !!int 'x'")


# --- a program's arguments, modules and SPEC (issue 44, item 6) ------------------------------------

def test_everything_after_the_double_dash_is_the_programs_even_where_spec_could_go():
    """Before: `jaxlaunch run --set entrypoint=pytest -n 2 -- -q mytests` took -q for SPEC."""
    result = invoke("run", "--set", "entrypoint=pytest", "-n", "2", "--print-spec", "--", "-q", "mytests")
    assert result.exit_code == 0, result.output
    assert "entrypoint = 'pytest'  (str; module" in result.output
    assert "args[0] = '-q'  (str)" in result.output and "args[1] = 'mytests'  (str)" in result.output


def test_a_module_runs_with_dash_m_as_python_does_and_a_bare_module_name_is_pointed_there():
    result = invoke("run", "-m", "pytest", "-n", "2", "--print-spec", "--", "-x")
    assert result.exit_code == 0, result.output
    assert "name = 'pytest'  (str)" in result.output and "args[0] = '-x'  (str)" in result.output
    bare = invoke("run", "pytest", "-n", "2")
    assert bare.exit_code == 2 and "jaxlaunch run -m pytest" in bare.output, bare.output
    both = invoke("run", "job.yaml", "-m", "pytest")
    assert both.exit_code == 2 and "give SPEC (job.yaml) or -m pytest, not both" in both.output


def test_an_argument_before_the_double_dash_is_refused_with_where_it_goes(write_spec):
    """Before: `jaxlaunch run train.py foo` passed foo to the program silently."""
    path = write_spec("name: x\nentrypoint: train.py\n")
    result = invoke("run", path, "foo")
    assert result.exit_code == 2
    assert f"foo: an argument after {path}, before `--`" in result.output
    assert f"fix: jaxlaunch run {path} -- foo" in result.output


def test_program_arguments_refused_for_a_function_are_located_after_the_double_dash(write_spec):
    """Issue 44, item 6: `-- ARG` refused for a function entrypoint was located at the spec's line 1."""
    result = invoke("run", write_spec("name: x\nentrypoint: m:f\n"), "--print-spec", "--", "--lr", "0.1")
    assert result.exit_code == 2
    assert result.output.startswith("Error: -- --lr 0.1: args: args are a script's or module's argv"), result.output
