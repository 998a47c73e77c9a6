"""Every concrete case of issue 9 ("Input and output you can trust") for specs and run
directories, kept as explicit regression tests. Each bad input must be a SpecError naming
file:line (or the --set override) and the fix, and exit 2 through the CLI with no traceback."""

import math
import time

import pytest
from click.testing import CliRunner

from launcher.cli import main
from launcher.errors import SpecError
from launcher.rundir import RunDirectory
from launcher.spec import load_spec

HEAD = "name: x\nentrypoint: m:f\n"


def billion_laughs(levels=7, fan_out=10):
    """7 levels of 10 aliases: 10**7 strings once expanded, from about half a kilobyte."""
    lines = ["  l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for level in range(1, levels + 1):
        lines.append(f"  l{level}: &l{level} [" + ", ".join([f"*l{level - 1}"] * fan_out) + "]")
    return HEAD + "params:\n" + "\n".join(lines) + "\n"


def block_nesting(depth):
    return HEAD + "params:\n" + "".join("  " * (i + 1) + "a:\n" for i in range(depth)) + "  " * (depth + 1) + "b: 1\n"


# (id, file text, overrides, line of the error or None for an override, fragment of the message)
BAD = [
    ("bool-tag", HEAD + "jax_distributed: !!bool maybe\n", [], 3, "jax_distributed: !!bool 'maybe' is not true or false"),
    ("int-tag", HEAD + "nodes: !!int abc\n", [], 3, "nodes: !!int 'abc' is not an integer"),
    ("float-tag", HEAD + "params: {lr: !!float x}\n", [], 3, "params.lr: !!float 'x' is not a number"),
    ("unknown-tag", HEAD + "params: {a: !python/object foo}\n", [], 3, "the tag !python/object is not supported"),
    ("timestamp-tag", HEAD + "params: {a: !!timestamp 2020-01-01}\n", [], 3, "the tag !!timestamp is not supported"),
    ("control-character", HEAD + "params: {a: b\x11c}\n", [], 3, "control character U+0011"),
    ("nul-in-file", HEAD + "setup: [\"a\x00\"]\n", [], 3, "control character U+0000"),
    ("flow-nesting-330", HEAD + "params: {a: " + "[" * 330 + "]" * 330 + "}\n", [], 3, "nested more than 64 levels deep"),
    ("block-nesting-300", block_nesting(300), [], 67, "nested more than 64 levels deep"),
    ("set-flow-nesting-330", HEAD, ["params.a=" + "[" * 330 + "]" * 330], None, "nested more than 64 levels deep"),
    ("set-key-nesting-300", HEAD, [".".join(["params"] + ["a"] * 300) + "=1"], None, "nested more than 64 levels"),
    ("recursive-alias", HEAD + "setup: &a [*a]\n", [], 3, "the alias *a refers to the value that contains it"),
    ("undefined-alias", HEAD + "params: {a: *nope}\n", [], 3, "the alias *nope has no anchor &nope before it"),
    ("billion-laughs", billion_laughs(), [], 8, "expands to more than 100000 values"),
    ("huge-integer", HEAD + "params: {a: " + "9" * 5000 + "}\n", [], 3, "is not a usable number"),
    ("long-entrypoint-file", "name: x\nentrypoint: " + "a" * 300 + ".py:main\n", [], 2,
     "entrypoint: cannot use the file name"),
    ("missing-module", "name: x\nentrypoint: nosuchpkg.mod:f\n", [], 2, "entrypoint: module 'nosuchpkg.mod' not found"),
    ("missing-function", "name: x\nentrypoint: job.py:nofunc\n", [], 2, "job.py defines no top-level 'nofunc'"),
    ("missing-module-function", "name: x\nentrypoint: mypkg.train:nofunc\n", [], 2, "defines no top-level 'nofunc'"),
    ("syntax-error-in-job", "name: x\nentrypoint: broken.py:main\n", [], 2, "the job's code has a syntax error"),
    ("list-document", "- name: x\n- entrypoint: m:f\n", [], 1, "the spec must be a YAML mapping"),
    ("scalar-document", "just text\n", [], 1, "the spec must be a YAML mapping"),
    ("multi-document", HEAD + "---\n" + HEAD, [], 3, "more than one YAML document"),
    ("int-key", HEAD + "params: {1: a}\n", [], 3, "params.1: the key is int 1; keys must be strings"),
    ("bool-key", HEAD + "env: {true: a}\n", [], 3, "env.True: the key is bool True; keys must be strings"),
    ("null-key", HEAD + "params: {~: a}\n", [], 3, "the key is empty (null); keys must be strings"),
    ("list-key", HEAD + "params: {[a, b]: c}\n", [], 3, "a key is a list or mapping; keys must be plain strings"),
    ("lone-surrogate-env", HEAD + 'env: {A: "\\ud800"}\n', [], 3, "env.A: contains a lone surrogate (U+D800"),
    ("lone-surrogate-params", HEAD + 'params: {a: ["\\udfff"]}\n', [], 3, "params.a.0: contains a lone surrogate"),
    ("set-lone-surrogate", HEAD, ["env.A=\udcff"], None, "env.A: contains a lone surrogate (U+DCFF"),
    ("set-control-character", HEAD, ["params.a=x\x11"], None, "control character U+0011"),
    ("set-bool-tag", HEAD, ["jax_distributed=!!bool maybe"], None, "!!bool 'maybe' is not true or false"),
    ("unknown-run-dir-placeholder", HEAD + "run_dir: runs/{user}-{time}\n", [], 3,
     "run_dir: {user} is not a placeholder; valid: {name}, {time}"),
    ("unmatched-brace-run-dir", HEAD + "run_dir: runs/{name\n", [], 3, "has an unmatched brace"),
    ("zero-timeout", HEAD + "timeout: 0s\n", [], 3, "timeout: a duration must be positive"),
]


@pytest.fixture
def spec_folder(tmp_path):
    (tmp_path / "job.py").write_text("import os\n\ndef main(ctx):\n    return 1\n")
    (tmp_path / "broken.py").write_text("def main(ctx)\n    return 1\n")
    return tmp_path


@pytest.mark.parametrize("text, overrides, line, fragment", [case[1:] for case in BAD], ids=[c[0] for c in BAD])
def test_bad_input_is_a_spec_error_with_location_and_fix(write_spec, spec_folder, text, overrides, line, fragment):
    path = write_spec(text)
    started = time.perf_counter()
    with pytest.raises(SpecError) as info:
        load_spec(path, overrides)
    assert time.perf_counter() - started < 5  # the billion laughs took 34 s and 2.2 GB
    message = str(info.value)
    assert fragment in message
    if line is None:
        assert message.startswith(f"--set {overrides[0][:20]}")
    else:
        assert message.startswith(f"{path}:{line}: "), message[:200]
    assert "\n  fix: " in message or "valid keys" in message or "expected:" in message, message


@pytest.mark.parametrize("text, overrides", [case[1:3] for case in BAD], ids=[c[0] for c in BAD])
def test_bad_input_exits_2_through_the_cli_without_a_traceback(write_spec, spec_folder, text, overrides):
    path = write_spec(text)
    args = ["render", str(path), "--target", "mpirun"]
    for override in overrides:
        args += ["--set", override]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert result.output.startswith("Error: ") and "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit)


# --- YAML 1.2 core schema, in the file and through --set ------------------------------------

@pytest.mark.parametrize("yaml_text, value", [
    ("1e-3", 0.001), ("1E+2", 100.0), ("-.5", -0.5), (".inf", math.inf), ("-.Inf", -math.inf),
    ("on", "on"), ("off", "off"), ("yes", "yes"), ("no", "no"), ("y", "y"), ("1:30", "1:30"),
    ("0o17", 15), ("0x1F", 31), ("017", 17), ("1_000", "1_000"), ("True", True), ("~", None),
    ("'1e-3'", "1e-3"), ("!!str 3", "3"), ("!!float 3", 3.0), ("2001-12-14", "2001-12-14"),
])
def test_values_follow_the_yaml_1_2_core_schema(write_spec, yaml_text, value):
    spec = load_spec(write_spec(HEAD + f"params:\n  v: {yaml_text}\n"))
    assert spec.params["v"] == value and type(spec.params["v"]) is type(value)
    spec = load_spec(write_spec(HEAD), [f"params.v={yaml_text}"])
    assert spec.params["v"] == value and type(spec.params["v"]) is type(value)


def test_json_surrogate_pair_escapes_are_one_character(write_spec):
    """A spec written by json.dumps (YAML 1.2 reads JSON) escapes an emoji as a surrogate pair."""
    spec = load_spec(write_spec('{"name": "x", "entrypoint": "m:f", "env": {"E": "\\ud83d\\ude00"}}'))
    assert spec.env == {"E": "\U0001f600"}


def test_nan_reaches_the_ranks_as_nan(write_spec, tmp_path):
    """spec.json used to turn .nan and .inf into null."""
    spec = load_spec(write_spec(HEAD + "params: {a: .nan, b: -.inf, c: [1e308]}\n"))
    back = RunDirectory.create(spec, tmp_path / "run").read_spec().params
    assert math.isnan(back["a"]) and back["b"] == -math.inf and back["c"] == [1e308]


def test_merge_keys_and_aliases_are_copies(write_spec):
    text = ("name: x\nentrypoint: m:f\nparams:\n  base: &base {lr: 0.1, layers: [1, 2]}\n"
            "  run: {<<: *base, lr: 0.5}\n  again: *base\n")
    spec = load_spec(write_spec(text), ["params.again.lr=7"])
    assert spec.params["run"] == {"lr": 0.5, "layers": [1, 2]}
    assert spec.params["again"]["lr"] == 7 and spec.params["base"]["lr"] == 0.1


def test_merge_key_needs_a_mapping(write_spec):
    with pytest.raises(SpecError, match=r"job.yaml:3: params.<<: a merge key \(<<\) needs a mapping"):
        load_spec(write_spec(HEAD + "params: {<<: [1, 2]}\n"))


def test_error_lines_are_kept_for_every_key(write_spec):
    with pytest.raises(SpecError) as info:
        load_spec(write_spec("name: x\nentrypoint: m:f\nslurm:\n  partition: gpu\n  time: soon\n"))
    assert ":5: slurm.time: 'soon' is not a duration" in str(info.value)


def test_module_in_the_spec_folder_only_gets_the_working_directory_fix(write_spec, tmp_path):
    (tmp_path / "localmod.py").write_text("def main(ctx): pass\n")
    with pytest.raises(SpecError, match="is in the spec's folder .* but the ranks import modules from the working"):
        load_spec(write_spec("name: x\nentrypoint: localmod:main\n"))


def test_entrypoint_checks_do_not_run_the_job(write_spec, tmp_path):
    (tmp_path / "loud.py").write_text(f"open({str(tmp_path / 'RAN')!r}, 'w')\n\ndef main(ctx): pass\n")
    assert load_spec(write_spec("name: x\nentrypoint: loud.py:main\n")).entrypoint.endswith("loud.py:main")
    assert not (tmp_path / "RAN").exists()


@pytest.mark.parametrize("source", ["from x import *\n", "def __getattr__(name): pass\n",
                                    "if True:\n    main = print\n", "try:\n    from os import sep as main\nexcept Exception:\n    pass\n"])
def test_entrypoint_names_bound_in_other_ways_are_accepted(write_spec, tmp_path, source):
    (tmp_path / "job.py").write_text(source)
    load_spec(write_spec("name: x\nentrypoint: job.py:main\n"))


# --- run directories -----------------------------------------------------------------------

def test_spec_run_dir_is_relative_to_the_spec_folder_and_previews_expand(write_spec, tmp_path, monkeypatch):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    spec = load_spec(write_spec(HEAD + "run_dir: out/{name}-{time}\n"))
    assert spec.run_dir == f"{tmp_path}/out/{{name}}-{{time}}"
    preview = RunDirectory.preview(spec).path
    assert preview.parent == tmp_path / "out" and preview.name.startswith("x-2") and "{" not in str(preview)
    flag = RunDirectory.preview(spec, "flag/{name}").path
    assert flag == elsewhere / "flag" / "x"  # --run-dir stays relative to the working directory


def test_render_and_dry_run_print_expanded_run_dirs(write_spec, tmp_path):
    path = write_spec(HEAD + "run_dir: out/{name}-{time}\n")
    for args in (["render", path, "--target", "mpirun"], ["run", path, "--dry-run"], ["submit", path, "--dry-run"]):
        result = CliRunner().invoke(main, [str(a) for a in args])
        assert result.exit_code == 0, result.output
        assert "{name}" not in result.output and "{time}" not in result.output
        assert f"{tmp_path}/out/x-2" in result.output


@pytest.mark.parametrize("command", ["run", "submit"])
def test_no_run_directory_is_left_when_a_later_step_fails(write_spec, tmp_path, monkeypatch, command):
    from launcher.errors import UsageError

    def no_mpirun():
        raise UsageError("mpirun not found")
    monkeypatch.setattr("launcher.launchers.mpirun.find_mpirun", no_mpirun)
    monkeypatch.setattr("launcher.backends.slurm.submission.find_mpirun", no_mpirun)
    result = CliRunner().invoke(main, [command, str(write_spec(HEAD)), "--run-dir", str(tmp_path / "run")])
    assert result.exit_code == 2 and result.output == "Error: mpirun not found\n"
    assert not (tmp_path / "run").exists()


def test_run_directory_that_cannot_be_made_is_a_usage_error(tmp_path):
    from launcher.errors import UsageError
    from launcher.spec import JobSpec
    (tmp_path / "file").write_text("")
    with pytest.raises(UsageError, match="cannot create the run directory"):
        RunDirectory.create(JobSpec(name="x", entrypoint="m:f"), tmp_path / "file" / "run")


def test_the_not_printable_class_is_the_complement_of_yaml_c_printable():
    """yaml12 writes the refused characters as a positive class (7 ms less to compile at every
    start); it must refuse exactly what YAML 1.2's c-printable does not allow."""
    from launcher.yaml12 import _NOT_PRINTABLE

    allowed = [(0x09, 0x0A), (0x0D, 0x0D), (0x20, 0x7E), (0x85, 0x85), (0xA0, 0xD7FF), (0xE000, 0xFFFD),
               (0x10000, 0x10FFFF)]
    text = "".join(map(chr, range(0x110000)))
    refused = {match.start() for match in _NOT_PRINTABLE.finditer(text)}
    assert refused == {c for c in range(0x110000) if not any(lo <= c <= hi for lo, hi in allowed)}
