"""`jaxlaunch init`'s templates as files (launcher/scaffold/templates/KIND/): each kind has its two
files, the programs parse as Python and the specs as YAML and as job specs, and the rendered jobs
are pinned. No mpirun: test_scaffold.py runs every kind under the real `jaxlaunch run`."""

import ast
import hashlib
from importlib import resources

import pytest

from launcher import yaml12
from launcher.cli import init
from launcher.scaffold import JOB_TEMPLATE, SPEC_TEMPLATE, TEMPLATES, render_job, template_text, write_job
from launcher.spec import load_spec

# sha256 over "file name\0text\0" of render_job(NAME, KIND) for each file. When a template changes on
# purpose, put the digest from the failure message here (and say in the commit what init now writes).
# The first ones are the jobs launcher/scaffold.py wrote from its strings, before the templates were files.
RENDERED = {
    ("minimal", "my-job"): "a61fac876aa6c2d883191d2615c72ab921d8fae7e3a28af37fbfd272971ee64c",
    ("minimal", "123"): "a4f8872d1cfae5280cec853de3fa679b683d2cec748e5e2379d9630e150518e5",
    ("data-parallel", "my-job"): "a1a23ba0096956a64e587845ea6efaf707fa66579bd09571d45b6698d9da4067",
    ("data-parallel", "123"): "5229d672338a1bbf584e9a6adc53ef4a8fccc886e70af54fb27e3161522ca689",
    ("sharded", "my-job"): "6a3f4dc3daafb17e1d268bcbbd368d7bf995a40deb81281380854e8f6abebb03",
    ("sharded", "123"): "7a83b00755f7481019a562588bccf711f09550dcf65a768da6c012074fe8cf2a",
}


def test_every_kind_is_a_folder_with_a_spec_and_a_program():
    folders = resources.files("launcher.scaffold") / "templates"
    assert sorted(folder.name for folder in folders.iterdir()) == sorted(TEMPLATES)
    for kind in TEMPLATES:
        assert sorted(file.name for file in (folders / kind).iterdir()) == sorted([SPEC_TEMPLATE, JOB_TEMPLATE])


def test_the_cli_offers_every_kind_in_order():
    """cli.py spells the choices out (it does not import the scaffold package to start)."""
    (template,) = [param for param in init.params if param.name == "template"]
    assert list(template.type.choices) == list(TEMPLATES)


@pytest.mark.parametrize("kind", TEMPLATES)
def test_the_program_parses_as_python_before_and_after_rendering(kind):
    ast.parse(template_text(kind, JOB_TEMPLATE), f"{kind}/{JOB_TEMPLATE}")
    files = render_job("my-job", kind)
    tree = ast.parse(files["my_job.py"], "my_job.py")
    assert any(isinstance(node, ast.FunctionDef) and node.name == "main" for node in tree.body)


@pytest.mark.parametrize("kind", TEMPLATES)
def test_the_spec_parses_as_yaml_before_and_loads_as_a_spec_after_rendering(kind, tmp_path):
    raw = yaml12.load(template_text(kind, SPEC_TEMPLATE), lambda line, path: f"{kind}/{SPEC_TEMPLATE}:{line}").data
    assert raw["name"] == "${name_value}" and raw["entrypoint"] == "${job_file}:main"
    spec_path, job_path = write_job("my-job", kind, tmp_path)
    spec = load_spec(spec_path)
    assert spec.name == "my-job" and spec.entrypoint == f"{job_path}:main"
    assert {key: value for key, value in raw.items() if key not in ("name", "entrypoint")} == \
        {key: value for key, value in yaml12.load(spec_path.read_text(), lambda *_: "").data.items()
         if key not in ("name", "entrypoint")}


@pytest.mark.parametrize("kind, name", RENDERED)
def test_the_rendered_job_is_pinned(kind, name):
    files = render_job(name, kind)
    digest = hashlib.sha256("".join(f"{file}\0{text}\0" for file, text in files.items()).encode()).hexdigest()
    assert digest == RENDERED[kind, name], f"init writes another {kind} job for {name!r} now: {digest}"
