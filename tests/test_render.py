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

from launcher.slurm.render import _template, quote_sbatch, render_batch_script
from launcher.spec import load_spec

pytestmark = pytest.mark.usefixtures("job_modules")  # the cases' entrypoint modules must exist

GOLDEN = Path(__file__).parent / "golden"
REGENERATE = "JAXLAUNCH_UPDATE_GOLDEN=1 python -m pytest tests/test_render.py"
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
    assert argv[1:5] == ["-m", "launcher.supervisor", str(run_dir), "--"]  # the supervisor, then mpirun
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
    root = Path(__file__).resolve().parent.parent
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(tmp_path / "dist"),
                    str(root)], check=True, timeout=300, cwd=tmp_path)
    wheel = next((tmp_path / "dist").glob("jaxlaunch-*.whl"))
    assert "launcher/templates/batch.sh.j2" in zipfile.ZipFile(wheel).namelist()
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
                    str(wheel)], check=True, timeout=300)
    probe = ("import launcher, sys; from launcher.slurm.render import _template; "
             "assert launcher.__file__.startswith(sys.argv[1]), launcher.__file__; "
             "print(_template().render(version='v', job_name='j', directives=[], setup=[], exports=[], launch_line='L'))")
    out = subprocess.run([sys.executable, "-c", probe, str(target)], capture_output=True, text=True, check=True,
                         cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(target)}).stdout
    assert out.startswith("#!/bin/bash\n# Generated by jaxlaunch v for job j.")
