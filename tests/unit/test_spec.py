"""The job spec: valid specs load into one typed object; bad input gets file:line, key and fix."""

from pathlib import Path

import pytest

from launcher.errors import SpecError
from launcher.spec import format_slurm_time, load_spec, parse_duration

GOOD = """\
name: demo
entrypoint: mypkg.train:main
nodes: 2
processes_per_node: 4
devices_per_process: 2
platform: gpu
params: {lr: 0.1, layers: [1, 2]}
env: {OMP_NUM_THREADS: 4, FLAG: true}
setup: ["module load cuda/12"]
timeout: 1h30m
slurm:
  partition: gpu
  time: "02:00:00"
  gpus_per_node: 8
  extra: ["--mem=64G"]
"""


def error_of(write_spec, text, overrides=()):
    with pytest.raises(SpecError) as info:
        load_spec(write_spec(text), list(overrides))
    return str(info.value)


def test_valid_spec_loads_typed_values(write_spec):
    spec = load_spec(write_spec(GOOD))
    assert (spec.name, spec.nodes, spec.processes_per_node, spec.devices_per_process) == ("demo", 2, 4, 2)
    assert spec.num_processes == 8
    assert spec.timeout == 5400 and spec.slurm.time == 7200
    assert spec.env == {"OMP_NUM_THREADS": "4", "FLAG": "true"}
    assert spec.params == {"lr": 0.1, "layers": [1, 2]}
    assert spec.slurm.launch == "mpirun" and spec.slurm.extra == ["--mem=64G"]


def test_defaults(write_spec):
    spec = load_spec(write_spec("name: x\nentrypoint: m:f\n"))
    assert (spec.nodes, spec.processes_per_node, spec.devices_per_process, spec.platform) == (1, 1, 1, "cpu")
    assert spec.timeout is None and spec.run_dir is None and spec.slurm.partition is None


def test_misspelled_key_names_file_line_key_and_valid_keys(write_spec):
    path = write_spec("name: x\nentrypoint: m:f\nnodez: 2\n")
    message = error_of(write_spec, path.read_text())
    assert message == (
        f"{path}:3: nodez: unknown key.\n"
        "  valid keys: args, async_checkpoints, collective_timeout, compile_cache, container, "
        "devices_per_process, entrypoint, env, hang_timeout, jax_distributed, jax_distributed_timeout, "
        "keep_checkpoints, max_parallel, max_restarts, name, nodes, output, params, platform, preemption_signal, "
        "processes_per_node, run_dir, setup, slurm, snapshot, stop_repeated_failures, sweep, sweep_limit, timeout, "
        "transport\n"
        "  fix: did you mean 'nodes'? rename or remove the key.")


def test_nested_unknown_key_lists_the_section_keys(write_spec):
    message = error_of(write_spec, "name: x\nentrypoint: m:f\nslurm:\n  partiton: gpu\n")
    assert ":4: slurm.partiton: unknown key." in message
    assert "valid keys under slurm: account, checkpoint_notice, cpus_per_task, extra" in message
    assert "did you mean 'partition'?" in message


@pytest.mark.parametrize("text, expected", [
    ("name: x\nentrypoint: m:f\nnodes: two\n", ":3: nodes: expected an integer (got 'two')."),
    ("name: x\nentrypoint: m:f\nnodes: 0\n", ":3: nodes: must be at least 1 (got 0)."),
    ("name: x\nentrypoint: m:f\nplatform: tpu\n", ":3: platform: expected 'cpu' or 'gpu' (got 'tpu')."),
    ("name: x\nentrypoint: m:f\ntimeout: soon\n", ":3: timeout: 'soon' is not a duration"),
    ("name: x\nentrypoint: no-such-form\n", ":2: entrypoint: 'no-such-form' is not an entrypoint; write 'train.py', "
                                            "'pkg.module', 'file.py:function' or 'pkg.module:function'."),
    ("name: x\nentrypoint: nosuchmodule\n", ":2: entrypoint: module 'nosuchmodule' not found"),
    ("name: bad name\nentrypoint: m:f\n", ":1: name: 'bad name' is not a valid job name"),
    ("name: x\nentrypoint: m:f\nenv: {1BAD: x}\n", ":3: env: '1BAD' is not a valid environment variable name."),
    ("name: x\nentrypoint: m:f\nslurm: {extra: [mem=4G]}\n", "'mem=4G' is not an sbatch option; write it like '--mem=8G'"),
    ("name: x\n", ":1: entrypoint: required key is missing.\n  fix: add `entrypoint:`"),
    ("name: x\nentrypoint: m:f\nnodes: true\n", ":3: nodes: expected an integer (got True)."),
    ("- a\n- b\n", "the spec must be a YAML mapping"),
    ("name: x\nentrypoint: m:f\nslurm: {gpus_per_node: 2}\n", "slurm.gpus_per_node: GPUs requested but platform is 'cpu'"),
])
def test_bad_values_name_line_key_and_problem(write_spec, text, expected):
    assert expected in error_of(write_spec, text)


def test_wrong_type_shows_what_the_key_expects(write_spec):
    message = error_of(write_spec, "name: x\nentrypoint: m:f\nprocesses_per_node: [1]\n")
    assert message.endswith("expected: MPI processes per node.")


def test_gpu_count_must_cover_processes_times_devices(write_spec):
    message = error_of(write_spec, "name: x\nentrypoint: m:f\nplatform: gpu\nprocesses_per_node: 4\n"
                                   "devices_per_process: 2\nslurm: {gpus_per_node: 4}\n")
    assert "4 GPUs per node cannot give 4 processes x 2 devices; request at least 8" in message


def test_yaml_syntax_error_names_the_line(write_spec):
    path = write_spec("name: x\nentrypoint: [m:f\nnodes: 1\n")
    message = error_of(write_spec, path.read_text())
    assert message.startswith(f"{path}:") and "not valid YAML" in message


def test_duplicate_key_is_an_error(write_spec):
    message = error_of(write_spec, "name: x\nentrypoint: m:f\nnodes: 1\nnodes: 2\n")
    assert ":4: nodes: duplicate key (first set on line 3)." in message


def test_missing_file(tmp_path):
    with pytest.raises(SpecError, match="no such file"):
        load_spec(tmp_path / "nope.yaml")


def test_entrypoint_file_resolves_relative_to_the_spec(write_spec, tmp_path):
    (tmp_path / "job.py").write_text("def main(ctx): return 1\n")
    spec = load_spec(write_spec("name: x\nentrypoint: job.py:main\n"))
    assert spec.entrypoint == f"{tmp_path / 'job.py'}:main"
    message = error_of(write_spec, "name: x\nentrypoint: missing.py:main\n")
    assert ":2: entrypoint: file 'missing.py' not found" in message


class TestOverrides:
    def test_set_overrides_nested_and_parses_yaml_scalars(self, write_spec):
        spec = load_spec(write_spec(GOOD), ["nodes=3", "slurm.partition=debug", "params.lr=0.5",
                                           "slurm.launch=srun", "timeout=90"])
        assert spec.nodes == 3 and spec.slurm.partition == "debug" and spec.params["lr"] == 0.5
        assert spec.slurm.launch == "srun" and spec.timeout == 90

    def test_set_errors_name_the_override(self, write_spec):
        message = error_of(write_spec, GOOD, ["nodes=many"])
        assert message.startswith("--set nodes=many: nodes: expected an integer (got 'many').")
        message = error_of(write_spec, GOOD, ["nodez=2"])
        assert message.startswith("--set nodez=2: nodez: unknown key.")

    def test_a_nested_unknown_set_key_names_the_override_not_the_file(self, write_spec):
        message = error_of(write_spec, GOOD, ["foo.bar=1"])
        assert message.startswith("--set foo.bar=1: foo: unknown key.")

    @pytest.mark.parametrize("override", ["sweep=x", "sweep.params.lr=1"])
    def test_set_sweep_points_at_the_sweep_option_not_at_sweep_itself(self, write_spec, override):
        message = error_of(write_spec, GOOD, [override])
        assert message.startswith(f"--set {override}: sweep: a sweep cannot be set with --set.")
        assert "--sweep KEY=V1,V2" in message and "did you mean" not in message

    def test_set_without_equals(self, write_spec):
        assert "--set nodes: expected KEY=VALUE" in error_of(write_spec, GOOD, ["nodes"])

    def test_set_into_a_scalar(self, write_spec):
        assert "'nodes' is not a section" in error_of(write_spec, GOOD, ["nodes.x=1"])


@pytest.mark.parametrize("bad", ["a\nb", "a\rb", "a\0b"])
def test_newline_cr_and_nul_are_refused_everywhere_but_params(write_spec, bad):
    for key in ("name", "slurm.partition", "env.X", "setup.0"):
        text = "name: x\nentrypoint: m:f\nsetup: ['true']\n"
        override = f"{key}={bad!r}" if key != "setup.0" else None
        if override is None:
            message = error_of(write_spec, text.replace("'true'", repr(bad).replace("'", '"')))
        else:
            message = error_of(write_spec, text, [f"{key}={bad}"])
        assert "which could end a line of the batch script" in message
    spec = load_spec(write_spec("name: x\nentrypoint: m:f\n"), [f"params.text=\"{bad!r}\""])
    assert spec.params["text"]


@pytest.mark.parametrize("text, seconds", [(90, 90), ("90s", 90), ("30m", 1800), ("1h30m", 5400), ("2d", 172800),
                                           ("01:02:03", 3723), ("05:00", 300), ("1-00:00:00", 86400), ("45", 2700)])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


def test_slurm_time_rounds_up_to_minutes():
    assert format_slurm_time(61) == "0-00:02:00"
    assert format_slurm_time(90000) == "1-01:00:00"


@pytest.mark.parametrize("zero", [0, "0", "0s", "0m0s", "00:00", "00:00:00", "0-00:00:00"])
def test_zero_duration_is_refused(write_spec, zero):
    """A zero timeout would kill the job at once (and Slurm reads --time=0 as no limit)."""
    with pytest.raises(ValueError, match="a duration must be positive"):
        parse_duration(zero)
    message = error_of(write_spec, f"name: x\nentrypoint: m:f\ntimeout: {zero!r}\n")
    assert ":3: timeout: a duration must be positive." in message


def test_every_problem_is_reported_at_once_in_file_order(write_spec):
    path = write_spec("name: x\nentrypoint: m:f\nplatform: tpu\nnodez: 2\nslurm:\n  max_requeues: -1\nnodes: two\n")
    lines = [line for line in error_of(write_spec, path.read_text()).splitlines() if line.startswith(str(path))]
    assert [line.split(": ")[0].rsplit(":", 1)[1] for line in lines] == ["3", "4", "6", "7"]
    assert "slurm.max_requeues: must be at least 0 (got -1)" in lines[2]


@pytest.mark.parametrize("value", ["'2'", "2.0", "true", "null", "[2]"])
def test_counts_are_strict_integers(write_spec, value):
    assert ":3: nodes: expected an integer" in error_of(write_spec, f"name: x\nentrypoint: m:f\nnodes: {value}\n")


@pytest.mark.parametrize("key, value", [("name", "5"), ("setup", "[1]"), ("env", "{A: [1]}"), ("params", "[1]"),
                                        ("jax_distributed", "'yes'"), ("slurm", "gpu")])
def test_other_types_are_strict_too(write_spec, key, value):
    text = f"name: x\nentrypoint: m:f\n{key}: {value}\n" if key != "name" else f"name: {value}\nentrypoint: m:f\n"
    message = error_of(write_spec, text)
    assert "expected " in message and "(got " in message, message


def test_a_jobspec_made_in_python_is_checked_like_a_file(write_spec):
    from launcher.spec import InvalidRecord, JobSpec

    spec = JobSpec(name="x", entrypoint="m:f", timeout="30m", slurm={"time": "1h"}, env={"N": 4})
    assert (spec.timeout, spec.slurm.time, spec.env) == (1800, 3600, {"N": "4"})
    with pytest.raises(InvalidRecord) as info:
        JobSpec(name="bad name", entrypoint="m:f", nodes="2")
    assert [p.loc for p in info.value.problems] == [("name",), ("nodes",)]
    with pytest.raises(InvalidRecord, match="nodes: must be at least 1"):
        spec.replace(nodes=0)
    assert spec.replace(nodes=3).nodes == 3 and spec.nodes == 1  # frozen: replace makes a copy


def test_spec_json_round_trip(write_spec):
    from launcher.spec import JobSpec

    spec = load_spec(write_spec(GOOD))
    assert JobSpec.from_json(spec.to_json(indent=2)) == spec
    data = spec.to_dict()
    data["params"]["layers"].append(3)  # a copy: the spec is unchanged
    assert spec.params["layers"] == [1, 2]


# --- durations: every form the parser accepts, to exact seconds, and back to Slurm's form ------

@pytest.mark.parametrize("text, seconds", [
    # plain seconds and unit suffixes, alone and combined
    (1, 1), (90, 90), ("90", 5400), ("1s", 1), ("59s", 59), ("2m", 120), ("3h", 10800), ("1d", 86400),
    ("1d2h3m4s", 93784), ("1h30m", 5400), ("2h5s", 7205), (" 30m ", 1800),
    # Slurm's MM, MM:SS, HH:MM:SS (a bare number in a string is minutes, as sbatch --time reads it)
    ("45", 2700), ("05:30", 330), ("90:00", 5400), ("5:3", 303), ("01:02:03", 3723), ("1:2:3", 3723),
    ("100:00:00", 360000),
    # Slurm's D-HH, D-HH:MM, D-HH:MM:SS
    ("1-12", 129600), ("1-12:30", 131400), ("1-12:30:15", 131415), ("0-1", 3600), ("2-0", 172800),
    ("2-00:00:00", 172800), ("0-00:00:01", 1), ("3-4:5:6", 273906), (" 1-12 ", 129600),
])
def test_every_duration_form_in_exact_seconds(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["1-", "-12", "1:2:3:4", "1-1:2:3:4", "12:345", "1.5h", "1h 30m", "", "abc",
                                  "1x", "h", "1--2", 1.5, None, [1], True, False])
def test_what_is_not_a_duration(text):
    with pytest.raises(ValueError, match="not a duration|got a boolean"):
        parse_duration(text)


def test_negative_seconds_are_not_a_duration():
    with pytest.raises(ValueError, match="a duration must be positive"):
        parse_duration(-5)


@pytest.mark.parametrize("seconds, slurm", [
    (1, "0-00:01:00"), (59, "0-00:01:00"), (60, "0-00:01:00"), (61, "0-00:02:00"), (3599, "0-01:00:00"),
    (3600, "0-01:00:00"), (3660, "0-01:01:00"), (86399, "1-00:00:00"), (86400, "1-00:00:00"),
    (86460, "1-00:01:00"), (129600, "1-12:00:00"), (131400, "1-12:30:00"), (131415, "1-12:31:00"),
    (10 * 86400 + 23 * 3600 + 59 * 60, "10-23:59:00"),
])
def test_slurm_time_is_d_hh_mm_ss_rounded_up_to_whole_minutes(seconds, slurm):
    assert format_slurm_time(seconds) == slurm
    assert parse_duration(slurm) == -(-seconds // 60) * 60  # Slurm reads back what we meant, rounded up


def test_durations_in_the_spec_and_on_the_sbatch_line(write_spec, tmp_path):
    from launcher.backends.slurm.render import sbatch_directives

    spec = load_spec(write_spec("name: x\nentrypoint: m:f\ntimeout: 1-12\ncollective_timeout: '05:30'\n"
                                "slurm: {time: '1-12:30', checkpoint_notice: 2m}\n"))
    assert (spec.timeout, spec.collective_timeout, spec.slurm.time, spec.slurm.checkpoint_notice) == \
        (129600, 330, 131400, 120)
    lines = sbatch_directives(spec, tmp_path, tmp_path)
    assert "--time=1-12:30:00" in lines and "--signal=B:USR2@120" in lines
    spec = load_spec(write_spec("name: x\nentrypoint: m:f\ntimeout: 1-12\n"))
    assert "--time=1-12:01:00" in sbatch_directives(spec, tmp_path, tmp_path)  # timeout + the supervisor's minute


# --- defaults, ranges and per-key checks of the typed spec -------------------------------------

def test_every_default():
    from launcher.spec import JobSpec

    assert JobSpec(name="x", entrypoint="m:f").to_dict() == {
        "name": "x", "entrypoint": "m:f", "args": [], "params": {}, "nodes": 1, "processes_per_node": 1,
        "devices_per_process": 1, "platform": "cpu", "jax_distributed": False, "jax_distributed_timeout": 900, "transport": "auto",
        "env": {}, "setup": [],
        "run_dir": None, "timeout": None, "collective_timeout": 1800, "hang_timeout": "auto",
        "compile_cache": "run_dir",
        "preemption_signal": None, "output": "tagged", "max_restarts": 0, "stop_repeated_failures": True,
        "keep_checkpoints": 2,
        "async_checkpoints": True, "snapshot": False,
        "max_parallel": None, "sweep_limit": 1000,
        "slurm": {"partition": None, "time": None, "account": None, "qos": None, "gpus_per_node": None,
                  "gres": None, "cpus_per_task": None, "launch": "mpirun", "srun_mpi": "pmix", "max_requeues": 3,
                  "checkpoint_notice": 90, "extra": [], "health_check": None, "spare_nodes": 0},
        "container": None,
    }


@pytest.mark.parametrize("key, minimum", [
    ("nodes", 1), ("processes_per_node", 1), ("devices_per_process", 1), ("max_restarts", 0),
    ("keep_checkpoints", 1), ("max_parallel", 1), ("sweep_limit", 1), ("slurm.max_requeues", 0),
    ("slurm.gpus_per_node", 1), ("slurm.cpus_per_task", 1),
])
def test_integer_ranges_start_exactly_at_their_minimum(key, minimum):
    from launcher.spec import InvalidRecord, JobSpec

    def make(value):
        data = {"name": "x", "entrypoint": "m:f"}
        section, _, name = key.rpartition(".")
        (data.setdefault(section, {}) if section else data)[name] = value
        return JobSpec.from_dict(data)

    spec = make(minimum)
    assert (getattr(spec.slurm, key[6:]) if key.startswith("slurm.") else getattr(spec, key)) == minimum
    with pytest.raises(InvalidRecord) as info:
        make(minimum - 1)
    assert str(info.value) == f"{key}: must be at least {minimum} (got {minimum - 1})"


@pytest.mark.parametrize("name, ok", [
    ("a", True), ("A9", True), ("9a", True), ("a.b_c-d", True), ("x" * 64, True), ("x" * 65, False),
    ("-a", False), ("_a", False), (".a", False), ("a b", False), ("a/b", False), ("", False), ("a$", False),
])
def test_job_name_rule(name, ok):
    from launcher.spec import InvalidRecord, JobSpec

    if ok:
        assert JobSpec(name=name, entrypoint="m:f").name == name
    else:
        with pytest.raises(InvalidRecord, match="is not a valid job name"):
            JobSpec(name=name, entrypoint="m:f")


@pytest.mark.parametrize("entrypoint, ok", [
    ("m:f", True), ("pkg.mod:main", True), ("_p.m2:_f", True), ("dir/file.py:main", True), ("a-b.py:main", True),
    ("m:", False), (":f", False), ("m:f-g", False), ("m:1f", False), ("a-b:main", False),
    ("1m:f", False), ("m-1", False), ("a/b", False), ("pkg..m", False),
    # programs, run as __main__ with args: a script, a module (python -m)
    ("m", True), ("pytest", True), ("pkg.train", True), ("train.py", True), ("dir/a-b.py", True),
])
def test_entrypoint_forms(entrypoint, ok):
    from launcher.spec import InvalidRecord, JobSpec

    if ok:
        spec = JobSpec(name="x", entrypoint=entrypoint)
        file = entrypoint if entrypoint.endswith(".py") else entrypoint.rpartition(":")[0] if ".py:" in entrypoint else None
        assert spec.entrypoint_file == (Path(file) if file else None)
        assert spec.runs_program == (":" not in entrypoint)
    else:
        with pytest.raises(InvalidRecord, match="entrypoint: "):
            JobSpec(name="x", entrypoint=entrypoint)


@pytest.mark.parametrize("run_dir, message", [
    ("runs/{name}-{time}", None), ("out", None), ("{name}", None), ("/abs/{time}/x", None),
    ("runs/{nam}", "{nam} is not a placeholder; valid: {name}, {time}"), ("runs/{}", "{} is not a placeholder"),
    ("runs/{name", "has an unmatched brace"), ("runs/name}", "has an unmatched brace"),
    ("", "the run directory is empty"), ("  ", "the run directory is empty"),
])
def test_run_dir_placeholders(run_dir, message):
    from launcher.spec import InvalidRecord, JobSpec

    if message is None:
        assert JobSpec(name="x", entrypoint="m:f", run_dir=run_dir).run_dir == run_dir
    else:
        with pytest.raises(InvalidRecord) as info:
            JobSpec(name="x", entrypoint="m:f", run_dir=run_dir)
        assert message in str(info.value)


def test_env_values_become_the_strings_an_environment_holds():
    from launcher.spec import InvalidRecord, JobSpec

    spec = JobSpec(name="x", entrypoint="m:f", env={"A": True, "B": False, "C": 1.5, "D": 4, "E": "s", "_F1": ""})
    assert spec.env == {"A": "true", "B": "false", "C": "1.5", "D": "4", "E": "s", "_F1": ""}
    for bad in ("1A", "A-B", "A B", ""):
        with pytest.raises(InvalidRecord, match="is not a valid environment variable name"):
            JobSpec(name="x", entrypoint="m:f", env={bad: "1"})
    with pytest.raises(InvalidRecord, match=r"env.A: expected a string \(got \[1\]\)"):
        JobSpec(name="x", entrypoint="m:f", env={"A": [1]})


def test_choices_and_optional_null():
    from launcher.spec import InvalidRecord, JobSpec

    spec = JobSpec.from_dict({"name": "x", "entrypoint": "m:f", "platform": "gpu", "timeout": None,
                              "slurm": {"launch": "srun", "partition": None, "time": None}})
    assert (spec.platform, spec.timeout, spec.slurm.launch, spec.slurm.partition) == ("gpu", None, "srun", None)
    with pytest.raises(InvalidRecord, match=r"^slurm.launch: expected 'mpirun' or 'srun' \(got 'ssh'\)$"):
        JobSpec.from_dict({"name": "x", "entrypoint": "m:f", "slurm": {"launch": "ssh"}})
    with pytest.raises(InvalidRecord, match=r"^nodes: expected an integer \(got None\)$"):
        JobSpec.from_dict({"name": "x", "entrypoint": "m:f", "nodes": None})  # not Optional: null is refused


def test_slurm_extra_directives_and_requeue_line(tmp_path):
    from launcher.spec import InvalidRecord, JobSpec
    from launcher.backends.slurm.render import sbatch_directives

    spec = JobSpec.from_dict({"name": "x", "entrypoint": "m:f", "slurm": {"extra": ["--mem=8G", "-C gpu"]}})
    assert spec.slurm.extra == ["--mem=8G", "-C gpu"]
    # --no-kill: a node failure ends the step, not the job, so the supervisor can leave the node behind
    assert sbatch_directives(spec, tmp_path, tmp_path)[-4:] == ["--requeue", "--no-kill", "--mem=8G", "-C gpu"]
    spec = JobSpec.from_dict({"name": "x", "entrypoint": "m:f", "slurm": {"max_requeues": 0}})
    assert sbatch_directives(spec, tmp_path, tmp_path)[-1] == "--no-requeue"
    assert "--no-kill" not in sbatch_directives(spec, tmp_path, tmp_path)
    with pytest.raises(InvalidRecord, match=r"^slurm.extra: 'mem=8G' is not an sbatch option"):
        JobSpec.from_dict({"name": "x", "entrypoint": "m:f", "slurm": {"extra": ["--x=1", "mem=8G"]}})


def test_unknown_missing_and_wrong_keys_are_all_reported_with_their_paths():
    from launcher.spec import InvalidRecord, JobSpec

    with pytest.raises(InvalidRecord) as info:
        JobSpec.from_dict({"nodes": 0, "bogus": 1, "slurm": {"time": "soon", "nope": 1}})
    assert [(p.loc, p.kind) for p in info.value.problems] == [
        (("nodes",), "invalid"), (("bogus",), "unknown_key"), (("slurm", "time"), "invalid"),
        (("slurm", "nope"), "unknown_key"), (("name",), "missing"), (("entrypoint",), "missing")]


def test_list_items_and_mapping_keys_are_located_exactly(write_spec):
    from launcher.spec import InvalidRecord, JobSpec

    with pytest.raises(InvalidRecord) as info:
        JobSpec.from_dict({"name": "x", "entrypoint": "m:f", "setup": ["ok", 1, "ok", None],
                           "slurm": {"extra": ["--a=1", 2]}, "params": {1: "a", "b": 2}})
    assert [(p.loc, p.message) for p in info.value.problems] == [
        (("setup", 1), "expected a string (got 1)"), (("setup", 3), "expected a string (got None)"),
        (("slurm", "extra", 1), "expected a string (got 2)"), (("params", 1), "keys must be strings (got 1)")]
    message = error_of(write_spec, "name: x\nentrypoint: m:f\nsetup:\n  - echo\n  - 5\n")
    assert ":5: setup.1: expected a string (got 5)." in message


def test_a_section_takes_its_own_record_or_a_mapping_only():
    from launcher.spec import InvalidRecord, JobSpec, SlurmSpec

    slurm = SlurmSpec(partition="p", time="1-12")
    assert JobSpec(name="x", entrypoint="m:f", slurm=slurm).slurm is slurm and slurm.time == 129600
    with pytest.raises(InvalidRecord, match=r"^slurm: expected a mapping of keys to values"):
        JobSpec(name="x", entrypoint="m:f", slurm=JobSpec(name="y", entrypoint="m:f"))


def test_jax_distributed_timeout_is_a_duration_passed_to_jax(write_spec, monkeypatch):
    spec = load_spec(write_spec("name: x\nentrypoint: m:f\njax_distributed: true\njax_distributed_timeout: 20m\n"))
    assert spec.jax_distributed_timeout == 1200
    from launcher.rank.jax_runtime import coordinator_address, start_jax_distributed

    calls = []

    class FakeJax:
        class config:
            update = staticmethod(lambda *args: None)

        class distributed:
            initialize = staticmethod(lambda **kwargs: calls.append(kwargs))

    class OneProcess:
        def Get_rank(self):
            return 0

        def Get_size(self):
            return 1

        def bcast(self, value, root=0):
            return value

        def allgather(self, value):
            return [value]

    comm = OneProcess()
    start_jax_distributed(FakeJax, coordinator_address(comm), comm.Get_size(), comm.Get_rank(), "cpu",
                          spec.jax_distributed_timeout)
    assert calls[0]["initialization_timeout"] == 1200 and calls[0]["num_processes"] == 1


def test_a_spec_is_checked_once_while_it_loads_and_a_replaced_key_is_checked_again(monkeypatch):
    """One typed spec, validated once: building it from the file checks each key once (plus the
    spec.json round trip, which is what a rank will do); replace() checks only what it changes,
    and a record made directly checks everything."""
    import collections

    from launcher.spec import fields
    from launcher.spec.model import JobSpec

    checks = collections.Counter()
    original = fields.FieldInfo.check

    def counted(self, value, loc, problems):
        checks[loc] += 1
        return original(self, value, loc, problems)

    monkeypatch.setattr(fields.FieldInfo, "check", counted)
    from conftest import EXAMPLES

    spec = load_spec(str(EXAMPLES / "normalize.yaml"), ["timeout=1h"])
    assert checks[("timeout",)] == 2, checks  # validate_spec, and the spec.json round trip
    assert spec.timeout == 3600
    checks.clear()
    assert spec.replace(name="renamed").name == "renamed"
    assert checks == {("name",): 1}
    with pytest.raises(fields.InvalidRecord):
        spec.replace(timeout="soon")
    with pytest.raises(fields.InvalidRecord):
        JobSpec(name="direct", entrypoint="x.py", nodes=0)


def test_a_section_made_by_its_default_while_its_parent_is_built_is_still_checked():
    """from_dict trusts the parent's checked keys only: a section the parent's default makes on the
    way (a key of the same name in it) is checked, so its duration is normalised to seconds."""
    import dataclasses

    from launcher.spec.fields import Parsed, Record, Section, field
    from launcher.spec.model import parse_duration

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Inner(Record):
        limit: int = field(Parsed(parse_duration, "a duration"), "inner limit", "1m")

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Outer(Record):
        limit: int = field(Parsed(parse_duration, "a duration"), "outer limit", "1m")
        inner: Inner = field(Section(Inner), "a section", factory=Inner)

    outer = Outer.from_dict({"limit": "2m"})
    assert outer.limit == 120 and outer.inner.limit == 60
