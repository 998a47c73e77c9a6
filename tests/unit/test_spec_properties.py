"""Property-based tests over whole spec documents and --set overrides (hypothesis).

Only two outcomes are allowed for any input: a valid JobSpec, or a SpecError (exit code 2
through the CLI, with no traceback). Every valid spec must render a batch script that passes
`bash -n` and, run by bash against stub sbatch/mpirun/srun, executes none of the payloads hidden
in its values (each tries to create a marker file) and hands every env value over byte for byte.

The inputs: near-valid specs with hostile strings in every field, wrong types, huge and
non-finite numbers, unicode and lone surrogates, YAML anchors/aliases/merge keys/tags, flow and
block style, deep nesting, non-mapping and multi-document input, raw random text, and --set
overrides of the same kinds. Runs are derandomized (the same examples on every run) so CI is
reproducible: 1010 examples in all (700 + 250 + 60, of which about 50 run bash on a rendered
script, each through the real supervisor), about 40 s on the 2-core CI machine, within the one-minute budget.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from launcher.cli import main
from launcher.errors import SpecError
from launcher.rundir import RunDirectory
from launcher.spec import load_spec

SETTINGS = dict(deadline=None, derandomize=True, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much, HealthCheck.large_base_example])

WORK = Path(tempfile.mkdtemp(prefix="jaxlaunch-props-"))
atexit.register(shutil.rmtree, WORK, ignore_errors=True)
SPEC_DIR = WORK / "spec"
MARKER = WORK / "PWNED"
SPEC_DIR.mkdir()
(SPEC_DIR / "job.py").write_text("def main(ctx):\n    return 1\n")

# Payloads: each would create MARKER (or ./PWNED) if any shell evaluated it.
PAYLOADS = [
    f"$(touch {MARKER})", f"`touch {MARKER}`", f"; touch {MARKER}", f"' ; touch {MARKER} ; '",
    f'" ; touch {MARKER} ; "', f"\\$(touch {MARKER})", f"&& touch {MARKER}", f"| touch {MARKER}",
    f"$'\\x27'; touch {MARKER}", f"%j$(touch {MARKER})", f"${{IFS}}touch${{IFS}}{MARKER}", "$(touch PWNED)",
    f"a\" --wrap='touch {MARKER}' \"", f"--wrap=touch {MARKER}", f"\\\n touch {MARKER}", f"x\ntouch {MARKER}",
    f"x\rtouch {MARKER}", "\x00touch PWNED", f"{{name}}$(touch {MARKER})", f"'\"'\"'$(touch {MARKER})",
]

VALID_KEYS = ["name", "entrypoint", "params", "nodes", "processes_per_node", "devices_per_process", "platform",
              "jax_distributed", "env", "setup", "run_dir", "timeout", "slurm"]
SLURM_KEYS = ["partition", "time", "account", "qos", "gpus_per_node", "gres", "cpus_per_task", "launch",
              "srun_mpi", "extra"]

any_char = st.characters(codec=None, categories=None)  # every code point, lone surrogates included
hostile_text = st.one_of(
    st.sampled_from(PAYLOADS),
    st.text(any_char, max_size=20),
    st.builds(lambda a, p, b: a + p + b, st.text(max_size=5), st.sampled_from(PAYLOADS), st.text(max_size=5)),
    st.sampled_from(["on", "yes", "no", "1e-3", "1:30", "0x1F", "~", "null", "true", ".nan", "-", "--", "{time}",
                     "", " ", "é" * 300, "a" * 5000, "\u202etxt.py", "\ufeffname"]),
)
numbers = st.one_of(
    st.integers(-3, 10), st.integers(min_value=-(10 ** 30), max_value=10 ** 30), st.floats(allow_nan=True),
    st.sampled_from([0, 1, 2, 2 ** 31, 2 ** 63, 10 ** 300, -1, math.inf, -math.inf, math.nan, 1e308, 5e-324]),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, hostile_text)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=6), inner, max_size=4)),
                      max_leaves=12)
env_names = st.one_of(st.sampled_from(["A", "OMP_NUM_THREADS", "PATH_X", "_X1"]),
                      st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True), hostile_text)
names = st.one_of(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,20}", fullmatch=True), hostile_text)
durations = st.one_of(st.sampled_from([60, "30m", "1h30m", "01:00:00", "2d", "1-00:00:00", 0, "0s", -5, "soon"]),
                      st.integers(-10, 10 ** 7), hostile_text)
SAFE_SETUP = ["true", ":", "export X_SETUP=1", "echo setup"]
safe_setup = st.lists(st.sampled_from(SAFE_SETUP), max_size=2)


# Text that a valid spec may hold in any string field: one line, valid Unicode, still hostile.
one_line = st.characters(codec="utf-8", exclude_characters="\n\r\x00")
field_text = st.one_of(
    st.sampled_from([p for p in PAYLOADS if not set(p) & set("\n\r\x00")]),
    st.text(one_line, max_size=20),
    st.builds(lambda a, p, b: a + p + b, st.text(one_line, max_size=5),
              st.sampled_from([p for p in PAYLOADS if not set(p) & set("\n\r\x00")]), st.text(one_line, max_size=5)),
)


tame_values = st.recursive(st.one_of(st.none(), st.booleans(), numbers, field_text),
                           lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                   st.dictionaries(st.text(one_line, max_size=6), inner, max_size=4)),
                           max_leaves=12)


def pick(draw, good, wild, bad=values):
    """A well-typed value; in a wild document, a quarter of the time anything (a wrong type)."""
    return draw(st.one_of(good, good, good, bad) if wild else good)


@st.composite
def slurm_sections(draw, wild):
    text = hostile_text if wild else field_text
    section = {}
    keys = SLURM_KEYS if wild else [k for k in SLURM_KEYS if k not in ("gres", "gpus_per_node")]  # cpu jobs
    for key in draw(st.lists(st.sampled_from(keys), unique=True, max_size=5)):
        section[key] = pick(draw, {
            "partition": text, "account": text, "qos": text, "gres": text,
            "time": durations if wild else st.sampled_from([3600, "2h", "12:00:00", "1-00:00:00"]),
            "gpus_per_node": st.integers(-1, 16) if wild else st.none(),
            "cpus_per_task": st.integers(-1, 64) if wild else st.integers(1, 64),
            "launch": st.sampled_from(["mpirun", "srun"]), "srun_mpi": st.sampled_from(["pmix", "pmi2"]) | text,
            "extra": st.lists(st.one_of(st.builds(lambda t: "--comment=" + t, text),
                                        st.builds(lambda t: "-" + t, text), text if wild else st.just("--exclusive")),
                              max_size=3),
        }[key], wild)
    if wild and draw(st.booleans()):
        section[draw(st.text(max_size=8))] = draw(scalars)  # an unknown key
    return section


@st.composite
def spec_dicts(draw, wild=None, safe_setup_only=False):
    """A spec as a Python dict. Tame: every field well-typed, hostile one-line text in every string
    field (valid unless that text breaks a rule). Wild: wrong types, bad values, any text."""
    wild = draw(st.booleans()) if wild is None else wild
    text = hostile_text if wild else field_text
    entrypoints = ["job.py:main", "job.py:nofunc", "nosuchpkg.mod:f", "os.path:join", "a" * 300 + ".py:main",
                   "m:f", "job.py"]
    spec = {"name": pick(draw, names if wild else st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,20}", fullmatch=True),
                         wild),
            "entrypoint": draw(st.sampled_from(entrypoints) | hostile_text) if wild else "job.py:main"}
    optional = {
        "params": st.dictionaries(st.text(max_size=8), values if wild else tame_values, max_size=5),
        "nodes": st.integers(1, 4), "processes_per_node": st.integers(1, 4), "devices_per_process": st.integers(1, 4),
        "platform": st.sampled_from(["cpu", "gpu"]) if wild else st.just("cpu"), "jax_distributed": st.booleans(),
        "env": st.dictionaries(env_names if wild else st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True),
                               st.one_of(text, numbers, st.booleans()) if wild else text, max_size=4),
        "setup": safe_setup if safe_setup_only or not wild else st.lists(hostile_text, max_size=2) | safe_setup,
        "run_dir": st.sampled_from(["out/{name}-{time}", "r/{user}", "{name", "/tmp/x/{time}"]) | text if wild
        else st.builds(lambda t: "out/{name}-{time}-" + t.replace("{", "(").replace("}", ")").replace("/", "_"),
                       field_text),
        "timeout": durations if wild else st.sampled_from([60, "30m", "1h30m", "01:00:00"]),
        "slurm": slurm_sections(wild),
    }
    for key in draw(st.lists(st.sampled_from(sorted(optional)), unique=True, max_size=len(optional))):
        spec[key] = pick(draw, optional[key], wild)
    if wild and draw(st.integers(0, 9)) == 0:
        spec[draw(st.text(max_size=10))] = draw(scalars)  # an unknown or misspelled key
    return spec


# --- a small YAML emitter with random style: tags, anchors, aliases and merge keys ----------

TAGS = ["!!str", "!!int", "!!float", "!!bool", "!!null", "!!binary", "!!timestamp", "!foo", "!",
        "!!python/object:os.system", "!<tag:yaml.org,2002:int>", "!!seq", "!!map", "!!set"]


def _quoted(text: str) -> str:
    """A YAML double-quoted scalar: JSON's escapes are YAML's too (lone surrogates as \\udxxx)."""
    return json.dumps(text, ensure_ascii=True)


def _scalar_text(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value) if abs(value) < 10 ** 4000 else hex(value)
    if isinstance(value, float):
        return ".nan" if math.isnan(value) else ".inf" if value == math.inf else "-.inf" if value == -math.inf \
            else repr(value)
    return _quoted(value)


def _right_tag(value) -> str:
    return {bool: "!!bool", int: "!!int", float: "!!float", str: "!!str", type(None): "!!null", dict: "!!map",
            list: "!!seq"}[type(value)]


@st.composite
def emitted(draw, value, wild, depth=0):
    """Flow-style YAML for `value`. Wild: sometimes any tag, an anchor reused as an alias inside
    itself, or a merge key. Tame: sometimes the tag that matches the value (still valid)."""
    prefix = ""
    roll = draw(st.integers(0, 29))
    if roll == 0:
        prefix = (draw(st.sampled_from(TAGS)) if wild else _right_tag(value)) + " "
    elif roll == 1 and wild:
        prefix = "&a" + str(depth) + " "
    if isinstance(value, dict):
        items = [f"{_quoted(str(k)) if not isinstance(k, str) or draw(st.booleans()) else _plain_key(k)}: "
                 f"{draw(emitted(v, wild, depth + 1))}" for k, v in value.items()]
        if roll == 2 and depth and wild:
            items.append(f"<<: *a{depth - 1}" if draw(st.booleans()) else "<<: {extra: 1}")
        return prefix + "{" + ", ".join(items) + "}"
    if isinstance(value, list):
        items = [draw(emitted(v, wild, depth + 1)) for v in value]
        if roll == 3 and depth and wild:
            items.append(f"*a{depth - 1}")
        return prefix + "[" + ", ".join(items) + "]"
    return prefix + _scalar_text(value)


def _plain_key(key: str) -> str:
    return key if key.isidentifier() else _quoted(key)


@st.composite
def documents(draw):
    """Spec file text: block-style specs (tame or wild), hostile YAML constructs, or random text."""
    kind = draw(st.integers(0, 9))
    if kind <= 5:  # block style at the top, flow below
        wild = kind >= 4
        spec = draw(spec_dicts(wild=wild))
        lines = []
        for key, value in spec.items():
            text = draw(emitted(value, wild, 1))
            if not wild and key == "params" and draw(st.booleans()):  # anchors and aliases that stay valid
                text = text[:-1] + (", " if value else "") + "_shared: &shared {lr: 1e-3, on: yes}, _again: *shared}"
            if not wild and key == "slurm" and "_shared" in lines[-1 if lines else 0] and "partition" not in value:
                text = text[:-1] + (", " if value else "") + "<<: {partition: merged}}"
            lines.append(f"{_plain_key(key) if isinstance(key, str) else _quoted(str(key))}: {text}")
        if draw(st.integers(0, 9)) == 0:
            lines.insert(0, "%YAML 1.2\n---")
        if wild and draw(st.integers(0, 7)) == 0:
            lines.append("---\nname: second")
        return "\n".join(lines) + "\n"
    if kind == 6:  # alias bombs and deep nesting of random sizes
        levels, fan, depth = draw(st.integers(1, 8)), draw(st.integers(1, 12)), draw(st.integers(1, 400))
        bomb = ["  l0: &l0 [lol, lol]"] + [f"  l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * fan) + "]"
                                           for i in range(1, levels + 1)]
        deep = "[" * depth + "]" * depth
        return ("name: x\nentrypoint: job.py:main\nparams:\n" + "\n".join(bomb) + f"\n  deep: {deep}\n"
                + draw(st.sampled_from(["", "setup: &s [*s]\n", "env: {<<: *l0}\n"])))
    if kind == 7:  # a valid spec with a character spliced in somewhere
        text = "name: x\nentrypoint: job.py:main\nparams: {a: b}\nenv: {A: '1'}\n"
        at = draw(st.integers(0, len(text)))
        return text[:at] + draw(st.text(any_char, min_size=1, max_size=3)) + text[at:]
    if kind == 8:  # not a mapping
        return draw(st.sampled_from(["- a\n- b\n", "42\n", "\"text\"\n", "null\n", "", "---\n---\n", "[]\n",
                                     "!!map {}\n", "? [a, b]\n: c\n", "{1: a}\n", "{true: x, null: y}\n"]))
    return draw(st.text(any_char, max_size=200))  # anything at all


wild_override_keys = st.one_of(
    st.sampled_from(["name", "nodes", "timeout", "slurm.partition", "slurm.extra", "params.lr", "params.a.b",
                     "env.A", "env.1BAD", "setup", "run_dir", "entrypoint", "slurm.launch", "nodes.x", "params",
                     "a..b", "", "params." + ".".join(["a"] * 70)]),
    st.text(max_size=12))
wild_override_values = st.one_of(
    hostile_text, numbers.map(_scalar_text),
    st.sampled_from(["1e-3", "on", "1:30", "!!int x", "!!bool maybe", "[1, 2", "[" * 330 + "]" * 330,
                     "{a: &x [1], b: *x}", "*nope", "- a", "!foo x", "job.py:main", "\x11", "\udcff", "a\nb"]))
tame_overrides = st.one_of(
    st.builds(lambda k, v: f"params.{k}={v}", st.from_regex(r"[a-z_]{1,8}", fullmatch=True),
              st.one_of(scalars.map(_scalar_text), st.sampled_from(["1e-3", "on", "1:30", "[1, {a: 2}]", "0x10"]))),
    st.builds(lambda k, v: f"{k}={_quoted(v)}", st.sampled_from(["env.A", "env.B_2", "slurm.partition",
                                                                 "slurm.account", "slurm.qos"]), field_text),
    st.sampled_from(["nodes=2", "processes_per_node=3", "timeout=1h", "jax_distributed=true", "slurm.launch=srun",
                     "slurm.time=02:00:00", "slurm.cpus_per_task=4"]))
overrides = st.one_of(
    st.lists(tame_overrides, max_size=3),
    st.lists(st.one_of(tame_overrides, st.builds(lambda k, v: f"{k}={v}", wild_override_keys, wild_override_values)),
             max_size=3))


def write_document(text: str, name: str = "job.yaml") -> Path:
    path = SPEC_DIR / name
    path.write_bytes(text.encode("utf-8", "surrogatepass"))  # surrogates make invalid UTF-8: also a case
    return path


def load_or_spec_error(text: str, sets: list[str]):
    """The property itself: a JobSpec or a SpecError naming where; anything else fails the test."""
    try:
        spec = load_spec(write_document(text), sets)
        event("outcome: valid spec")
        return spec
    except SpecError as error:
        event("outcome: SpecError")
        message = str(error)
        assert message and "Traceback" not in message
        assert message.startswith((str(SPEC_DIR / "job.yaml"), "--set ")), message[:300]
        return None


@settings(max_examples=700, **SETTINGS)
@given(text=documents(), sets=overrides)
def test_any_document_and_overrides_give_a_spec_or_a_spec_error(text, sets):
    spec = load_or_spec_error(text, sets)
    if spec is not None:
        from launcher.backends.slurm.render import render_batch_script
        script = render_batch_script(spec, run_dir=WORK / "run", workdir=WORK, python=sys.executable,
                                     mpirun="/opt/mpirun", is_root=False)
        script.encode("utf-8")  # writable
        spec.to_json().encode("utf-8")  # spec.json writable


@settings(max_examples=250, **SETTINGS)
@given(text=documents(), sets=overrides, command=st.sampled_from(["render", "run", "submit"]))
def test_the_cli_exits_0_or_2_without_a_traceback(text, sets, command):
    path = write_document(text)
    args = [command, str(path), *[a for s in sets for a in ("--set", s)]]
    args += ["--target", "mpirun"] if command == "render" else ["--print-spec"] if command == "submit" else ["--dry-run"]
    result = CliRunner().invoke(main, args)
    event(f"exit code {result.exit_code}")
    assert result.exit_code in (0, 2), (result.exit_code, result.output[-2000:], result.exception)
    assert "Traceback" not in result.output
    if result.exit_code == 2:
        assert result.output.startswith(("Error: ", "Usage: ")), result.output[:300]
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)


# --- valid specs: the script they render runs no payload -------------------------------------

@pytest.fixture(scope="module")
def stubs():
    """sbatch, mpirun and srun that only record how they were called (and mpirun/srun the
    environment they got), first on PATH; a private job index."""
    folder = WORK / "stubs"
    folder.mkdir(exist_ok=True)
    record = WORK / "calls.jsonl"
    program = (f"#!{sys.executable}\nimport json, os, sys\n"
               f"with open({str(record)!r}, 'a') as f:\n"
               f"    f.write(json.dumps({{'argv': sys.argv, 'env': dict(os.environ)}}) + '\\n')\n"
               "if os.path.basename(sys.argv[0]) == 'sbatch':\n    print('4242')\n")
    for name in ("sbatch", "mpirun", "srun"):
        (folder / name).write_text(program)
        (folder / name).chmod(0o755)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
        patch.setenv("JAXLAUNCH_HOME", str(WORK / "home"))
        patch.setattr("launcher.backends.slurm.submission.find_mpirun", lambda: str(folder / "mpirun"))
        yield record


@settings(max_examples=60, **SETTINGS)  # each example starts bash and the Python supervisor
@given(spec_text=spec_dicts(wild=False, safe_setup_only=True).map(lambda d: json.dumps(d, ensure_ascii=True, allow_nan=False)
                                                       if _finite(d) else ""),
       sets=st.lists(tame_overrides, max_size=3))
def test_valid_specs_render_scripts_that_run_no_payload(stubs, spec_text, sets):
    from launcher.backends.slurm.submission import submit_job
    spec = load_or_spec_error(spec_text, sets)  # JSON is YAML 1.2
    if spec is None or not set(spec.setup) <= set(SAFE_SETUP):
        return  # setup lines are shell by design; --set may have put anything there
    event("ran the rendered script")
    run = RunDirectory.create(spec, Path(tempfile.mkdtemp(dir=WORK)) / "run")
    stubs.write_text("")
    assert submit_job(spec, run) == "4242"
    script = run.path / "job.sbatch"
    subprocess.run(["bash", "-n", str(script)], check=True, timeout=10)
    sbatch_call = json.loads(stubs.read_text().splitlines()[0])
    assert Path(sbatch_call["argv"][0]).name == "sbatch" and sbatch_call["argv"][-1] == str(script)
    done = subprocess.run(["bash", str(script)], cwd=run.path, capture_output=True, text=True, timeout=20)
    # The script execs the real supervisor, which runs the stub launcher; no rank runs, so the
    # supervisor reports a failed job, without a traceback.
    assert done.returncode == 1 and "the launcher exited without an error" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not MARKER.exists() and not list(WORK.rglob("PWNED")), spec
    launch = json.loads(stubs.read_text().splitlines()[-1])
    assert Path(launch["argv"][0]).name == ("srun" if spec.slurm.launch == "srun" else "mpirun")
    for key, value in spec.env.items():
        assert launch["env"][key] == value  # every value arrives byte for byte


def _finite(value) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return not (isinstance(value, int) and abs(value) >= 10 ** 4000)


def test_the_stubs_would_see_a_payload(stubs):
    """The check above can fail: a script that does evaluate a payload leaves the marker."""
    script = WORK / "evil.sh"
    script.write_text(f"#!/bin/bash\necho $(touch {MARKER})\n")
    subprocess.run(["bash", str(script)], check=True, timeout=10)
    assert MARKER.exists()
    MARKER.unlink()
    assert stat.S_ISREG(os.stat(stubs.parent / "stubs" / "sbatch").st_mode)
