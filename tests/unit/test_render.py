"""Batch script rendering: golden files, bash syntax, quoting of hostile values, packaging."""

import json
import os
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import jinja2
import pytest
import yaml

from conftest import GOLDEN, ROOT
from launcher.backends.slurm.render import _template, quote_sbatch, render_batch_script
from launcher.spec import load_spec

pytestmark = pytest.mark.usefixtures("job_modules")  # the cases' entrypoint modules must exist

REGENERATE = "JAXLAUNCH_UPDATE_GOLDEN=1 python -m pytest tests/unit/test_render.py"
HOSTILE = "$(touch PWNED) `touch PWNED` ; touch PWNED 'single' \"double\" \\ back ✓ ü " + "x" * 10_000

CASES = {
    "cpu": {"name": "cpu-job", "entrypoint": "train.py:main", "nodes": 2, "processes_per_node": 1,
            "devices_per_process": 2, "timeout": "30m", "slurm": {"partition": "debug"}},
    "gpu": {"name": "gpu-job", "entrypoint": "pkg.train:main", "nodes": 4, "processes_per_node": 4,
            "devices_per_process": 1, "platform": "gpu", "env": {"NCCL_DEBUG": "WARN"},
            "setup": ["module load cuda/12.4", "source /opt/venv/bin/activate"],
            "slurm": {"partition": "gpu", "time": "12:00:00", "account": "proj42", "qos": "high",
                      "gpus_per_node": 4, "cpus_per_task": 8}},
    "extra": {"name": "extra-job", "entrypoint": "pkg.train:main", "platform": "gpu", "processes_per_node": 2,
              "slurm": {"gres": "gpu:a100:2", "extra": ["--mem=64G", "--exclusive", "--constraint=a100&ib"]}},
    "srun": {"name": "srun-job", "entrypoint": "pkg.train:main", "nodes": 2, "processes_per_node": 2,
             "slurm": {"launch": "srun", "time": 3600}},
    "hostile": {"name": "hostile", "entrypoint": "pkg.train:main", "env": {"EVIL": HOSTILE[:300]},
                "slurm": {"partition": "a b;c", "account": "$(id)", "extra": [f"--comment={HOSTILE[:200]}"]}},
    # Containers (launcher/container.py): apptainer wraps each rank under mpirun (hybrid: the
    # host's mpirun, the image's MPI) or srun; pyxis is srun options, in srun mode only.
    "apptainer": {"name": "apptainer-job", "entrypoint": "train.py:main", "nodes": 2, "processes_per_node": 4,
                  "platform": "gpu", "env": {"NCCL_DEBUG": "WARN"}, "slurm": {"partition": "gpu"},
                  "container": {"image": "/images/jax.sif", "runtime": "apptainer",
                                "mounts": ["/scratch", "/datasets/imagenet:/data"], "options": ["--writable-tmpfs"]}},
    "apptainer-srun": {"name": "apptainer-srun", "entrypoint": "pkg.train:main", "nodes": 2, "processes_per_node": 2,
                       "container": {"image": "docker://ghcr.io/example/jax:0.10", "runtime": "apptainer"},
                       "slurm": {"launch": "srun"}},
    "pyxis": {"name": "pyxis-job", "entrypoint": "train.py:main", "nodes": 2, "processes_per_node": 8,
              "platform": "gpu", "env": {"XLA_FLAGS": "--xla_gpu_enable_latency_hiding_scheduler=true"},
              "container": {"image": "nvcr.io#nvidia/jax:25.04-py3", "runtime": "pyxis", "python": "python3",
                            "mounts": ["/lustre/datasets:/data"]},
              "slurm": {"launch": "srun", "partition": "gpu"}},
    "charliecloud": {"name": "ch-job", "entrypoint": "train.py:main", "nodes": 2,
                     "container": {"image": "/images/jax-bookworm", "runtime": "charliecloud"}},
}


def render_case(tmp_path, name, spec_dict=None, **kwargs):
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec_dict or CASES[name], allow_unicode=True))
    (tmp_path / "train.py").write_text("def main(ctx): pass\n")
    spec = load_spec(path)
    if spec.entrypoint_file:  # keep golden files free of the temp path
        spec = spec.replace(entrypoint="/home/user/project/train.py:main")
    args = dict(run_dir=Path(f"/scratch/runs/{name}"), workdir=Path("/home/user/project"),
                python="/opt/venv/bin/python", mpirun="/opt/venv/bin/mpirun", is_root=False)
    return render_batch_script(spec, **{**args, **kwargs})


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(tmp_path, name):
    text = render_case(tmp_path, name)
    golden = GOLDEN / f"{name}.sbatch"
    if os.environ.get("JAXLAUNCH_UPDATE_GOLDEN") == "1":
        golden.write_text(text)
    assert golden.exists(), f"missing golden file {golden}; create it with: {REGENERATE}"
    assert text == golden.read_text(), f"rendered script differs from {golden}; if intended, regenerate: {REGENERATE}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_script_passes_bash_syntax_check(tmp_path, name):
    script = tmp_path / "job.sbatch"
    script.write_text(render_case(tmp_path, name))
    subprocess.run(["bash", "-n", str(script)], check=True)


def test_rendering_is_pure(tmp_path):
    assert render_case(tmp_path, "gpu") == render_case(tmp_path, "gpu")


def test_hostile_values_arrive_verbatim_and_run_nothing(tmp_path):
    """Run the rendered script with bash, its supervisor (python) and launcher swapped for a program
    that records its environment and arguments: every value must arrive byte for byte, and no PWNED
    file may appear."""
    recorder = tmp_path / "record-env"
    recorder.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                        f"json.dump(dict(os.environ), open({str(tmp_path / 'env.json')!r}, 'w'))\n"
                        f"json.dump(sys.argv, open({str(tmp_path / 'argv.json')!r}, 'w'))\n")
    recorder.chmod(recorder.stat().st_mode | stat.S_IEXEC)
    spec = {"name": "h", "entrypoint": "m:f", "env": {"EVIL": HOSTILE, "NEWLINE_FREE": "a\tb"},
            "slurm": {"extra": [f"--comment={HOSTILE}"]}}
    run_dir = tmp_path / "run dir $(touch PWNED) ;"
    text = render_case(tmp_path, "h", spec, python=str(recorder), mpirun=str(recorder), run_dir=run_dir)
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    subprocess.run(["bash", str(script)], cwd=tmp_path, check=True, timeout=30)
    env = json.loads((tmp_path / "env.json").read_text())
    assert env["EVIL"] == HOSTILE and env["NEWLINE_FREE"] == "a\tb"
    assert env["JAXLAUNCH_RUN_DIR"] == str(run_dir)
    argv = json.loads((tmp_path / "argv.json").read_text())
    assert argv[1:5] == ["-m", "launcher.backends.slurm.batch", str(run_dir), "--"]  # the supervisor, then mpirun
    assert argv[5] == str(recorder)
    assert not list(tmp_path.rglob("PWNED"))


@pytest.mark.parametrize("value, quoted", [
    ("debug", "debug"), ("/a/b-%j.out", "/a/b-%j.out"), ("a b", '"a b"'),
    ('say "hi"', '"say \\"hi\\""'), ("back\\slash", '"back\\\\slash"'), ("$(id)", '"$(id)"'), ("", '""'),
])
def test_quote_sbatch(value, quoted):
    assert quote_sbatch(value) == quoted


def test_template_is_strict():
    with pytest.raises(jinja2.UndefinedError):
        _template().render(version="1", job_name="x", directives=[], setup=[], exports=[])


def test_templates_ship_in_a_non_editable_install(tmp_path):
    """Build the wheel as `pip install .` would, install it into a fresh folder, render from there."""
    root = ROOT
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(tmp_path / "dist"),
                    str(root)], check=True, timeout=300, cwd=tmp_path)
    wheel = next((tmp_path / "dist").glob("jaxlaunch-*.whl"))
    assert "launcher/templates/batch.sh.j2" in zipfile.ZipFile(wheel).namelist()
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
                    str(wheel)], check=True, timeout=300)
    probe = ("import launcher, sys; from launcher.backends.slurm.render import _template; "
             "assert launcher.__file__.startswith(sys.argv[1]), launcher.__file__; "
             "print(_template().render(version='v', job_name='j', directives=[], setup=[], exports=[], launch_line='L'))")
    out = subprocess.run([sys.executable, "-c", probe, str(target)], capture_output=True, text=True, check=True,
                         cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(target)}).stdout
    assert out.startswith("#!/bin/bash\n# Generated by jaxlaunch v for job j.")


# --- what reaches a generated script from outside the spec, and spec values that could still bend it
# (issue 30, item 6)

def _render_cli(*args):
    from click.testing import CliRunner

    from launcher.cli import main

    return CliRunner().invoke(main, ["render", "--target", "slurm", *map(str, args)])


def test_a_line_break_in_the_run_directory_cannot_reach_an_sbatch_line(write_spec, tmp_path):
    """`--run-dir $'/x\\nrm -rf ~'` put a command into the script that passed bash -n."""
    spec = write_spec("name: x\nentrypoint: m:f\nslurm: {launch: srun}\n")
    for evil in ("run\ntouch PWNED", "run\rtouch PWNED"):
        result = _render_cli(spec, "--run-dir", tmp_path / evil)
        assert result.exit_code == 2, result.output
        assert "cannot go on an #SBATCH line" in result.output and "Traceback" not in result.output
    with pytest.raises(Exception, match="line break"):
        quote_sbatch("a\nb")


def test_a_percent_in_the_run_directory_is_not_a_slurm_pattern(tmp_path, write_spec):
    spec = load_spec(write_spec("name: x\nentrypoint: m:f\nslurm: {launch: srun}\n"))
    script = render_batch_script(spec, run_dir=tmp_path / "50%u_run", workdir=tmp_path, python="python", mpirun=None)
    assert f"#SBATCH --output={tmp_path}/50%%u_run/slurm-%j.out\n" in script
    assert f"#SBATCH --error={tmp_path}/50%%u_run/slurm-%j.out\n" in script


@pytest.mark.parametrize("extra", ["--hold --begin=now+1hour", "--a b=c", "--mem 8G", "-- hold"])
def test_each_extra_sbatch_entry_is_one_option(write_spec, extra):
    """`--hold --begin=now+1hour` in one entry slipped a second option in (sbatch splits on blanks)."""
    from launcher.errors import SpecError

    with pytest.raises(SpecError, match=r"slurm\.extra.*is not one sbatch option"):
        load_spec(write_spec(f"name: x\nentrypoint: m:f\nslurm: {{extra: [{json.dumps(extra)}]}}\n"))


def test_extra_option_values_may_hold_spaces_and_stay_one_argument(write_spec, tmp_path):
    spec = load_spec(write_spec('name: x\nentrypoint: m:f\nslurm: {extra: ["--comment=a b --hold", "-Cgpu", '
                                '"-C gpu --hold", "--exclusive"]}\n'))
    script = render_batch_script(spec, run_dir=tmp_path, workdir=tmp_path, python="python", mpirun="mpirun")
    assert '#SBATCH --comment="a b --hold"\n' in script and "#SBATCH -C gpu\n" in script
    assert '#SBATCH -C "gpu --hold"\n' in script and "#SBATCH --exclusive\n" in script


def test_a_setup_here_document_left_open_is_refused(write_spec, tmp_path):
    """`cat <<EOF` swallowed the launch line: the job started, ran setup, and never launched."""
    from launcher.errors import SpecError
    from launcher.backends.slurm.submission import check_bash_syntax

    open_doc = load_spec(write_spec('name: x\nentrypoint: m:f\nsetup: ["cat <<EOF > notes.txt", "hello"]\n'))
    script = render_batch_script(open_doc, run_dir=tmp_path, workdir=tmp_path, python="python", mpirun="mpirun")
    assert subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True).returncode == 0  # bash: fine
    with pytest.raises(SpecError, match="here-document is not closed"):
        check_bash_syntax(open_doc, script)
    closed = load_spec(write_spec('name: x\nentrypoint: m:f\nsetup: ["cat <<EOF > notes.txt", "hello", "EOF"]\n'))
    check_bash_syntax(closed, render_batch_script(closed, run_dir=tmp_path, workdir=tmp_path, python="python",
                                                  mpirun="mpirun"))


def test_render_prints_byte_for_byte_what_submit_writes(write_spec, tmp_path):
    """click strips escape sequences from output that is not a terminal: render showed a script
    without the ESC characters the submitted one had."""
    from launcher.backends.slurm.submission import render_for_submission

    spec_path = write_spec('name: x\nentrypoint: m:f\nslurm: {launch: srun}\nenv: {COLOUR: "\\e[31mred\\e[0m"}\n')
    shown = _render_cli(spec_path, "--run-dir", tmp_path / "run")
    assert shown.exit_code == 0, shown.output
    written = render_for_submission(load_spec(spec_path), tmp_path / "run")
    assert "\x1b[31m" in written and shown.output == written
