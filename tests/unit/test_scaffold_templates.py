"""`jaxlaunch init`'s templates as files (launcher/scaffold/templates/KIND/): each kind has its two
files, the programs parse as Python and the specs as YAML and as job specs, and the rendered jobs
are pinned; the templates agree with their examples in jobs/examples/. No mpirun: every kind runs
under the real `jaxlaunch run` in tests/e2e/test_scaffold_runs.py."""

import ast
import copy
import hashlib
from importlib import resources

import pytest

from conftest import EXAMPLES
from launcher import yaml12
from launcher.cli import init
from launcher.scaffold import JOB_TEMPLATE, SPEC_TEMPLATE, TEMPLATES, render_job, template_text, write_job
from launcher.spec import load_spec

# sha256 over "file name\0text\0" of render_job(NAME, KIND) for each file. When a template changes on
# purpose, put the digest from the failure message here (and say in the commit what init now writes).
# minimal's are those of the jobs launcher/scaffold.py wrote from its strings, before the templates were
# files; data-parallel and sharded have called ctx.report since (and data-parallel's forward() is the example's).
# sharded imports DEVICE_AXIS from launcher (public) since the rank side moved to launcher/rank/.
RENDERED = {
    ("minimal", "my-job"): "a61fac876aa6c2d883191d2615c72ab921d8fae7e3a28af37fbfd272971ee64c",
    ("minimal", "123"): "a4f8872d1cfae5280cec853de3fa679b683d2cec748e5e2379d9630e150518e5",
    ("data-parallel", "my-job"): "e1069694d9960f11c6d543fbf6164cf796798e42cc642fe0779b59d5a6ea3ee9",
    ("data-parallel", "123"): "d892d4965297675033a300d27179b2d27d33a3bcc6aed270b0435275bf93d976",
    ("sharded", "my-job"): "141fe5413358c8729e979160648d2a828f4333f6decb16232d598fa4e7fcf423",
    ("sharded", "123"): "0c5c2ef9d784391f87c576c43232a31a24c4931fb081ebfb12758032d6c2b092",
}


def test_every_kind_is_a_folder_with_a_spec_and_a_program():
    folders = resources.files("launcher.scaffold") / "templates"
    assert sorted(folder.name for folder in folders.iterdir()) == sorted(TEMPLATES)
    for kind in TEMPLATES:
        assert sorted(file.name for file in (folders / kind).iterdir()) == sorted([SPEC_TEMPLATE, JOB_TEMPLATE])


def test_the_cli_offers_every_kind_in_order():
    """cli/cmd_init.py spells the choices out (it does not import the scaffold package to start)."""
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


# --- the templates and their examples in jobs/examples/ ------------------------------------------
# Two templates are first versions of examples in jobs/examples/ (minimal has none: its trivial.py is the
# subject of the launch benchmark). They are not one file: the examples carry what a first job should
# not (fault injection, slow ranks, TreePacker), the templates what the examples do not need (their
# ${name} placeholders, a laptop layout, a simpler dataset). What must agree is checked here: the
# helpers both define, the lines of main() that use the launcher's protocol, and the API each uses.
COUNTERPARTS = {"data-parallel": "train_data_parallel.py", "sharded": "sharded_mlp.py"}
SHARED_HELPERS = {"data-parallel": ("init_params", "forward", "loss_fn"), "sharded": ("init", "batch", "loss_fn")}
# The template's names for what the example calls otherwise (the example keeps unstacked `params` too).
RENAMED = {"data-parallel": {"params": "stacked_params", "devices": "total_devices", "loss": "step_losses"},
           "sharded": {}}
PROTOCOL = ("launcher.", "ctx.checkpoints", "ctx.should_stop", "ctx.report", "ctx.global_device_offset", "ctx.mesh")
# The API one uses and the other does not, on purpose.
API_ONLY_IN_EXAMPLE = {
    "data-parallel": {"ctx.rank",             # fault injection and the slow-rank demo
                      "launcher.TreePacker",  # the gradients as one buffer per exchange
                      "launcher.broadcast"},  # the check that every replica holds the same parameters
    "sharded": set(),
}
API_ONLY_IN_TEMPLATE = {"data-parallel": set(),
                        "sharded": {"ctx.num_local_devices"}}  # the check that params.hidden splits over them


def template_and_example(kind: str) -> tuple[ast.Module, ast.Module]:
    return (ast.parse(render_job("my-job", kind)["my_job.py"]),
            ast.parse((EXAMPLES / COUNTERPARTS[kind]).read_text(), COUNTERPARTS[kind]))


def functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    return {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}


def without_docs_and_annotations(function: ast.FunctionDef) -> str:
    function = copy.deepcopy(function)
    if ast.get_docstring(function) is not None:
        function.body = function.body[1:]
    function.returns = None
    for arg in function.args.args:
        arg.annotation = None
    return ast.dump(function)


class Rename(ast.NodeTransformer):
    def __init__(self, names: dict[str, str]):
        self.names = names

    def visit_Name(self, node):
        return ast.Name(self.names.get(node.id, node.id), node.ctx)


def protocol_lines(tree: ast.Module, renames: dict[str, str]) -> list[str]:
    """The statements of main() (an if/while: its condition) that use the launcher's protocol, as
    ast.unparse writes them (so quotes, spacing and comments do not count)."""
    main = Rename(renames).visit(copy.deepcopy(functions(tree)["main"]))
    found = []
    for node in ast.walk(main):
        if isinstance(node, ast.If | ast.While):
            text = f"if {ast.unparse(node.test)}"
        elif isinstance(node, ast.stmt) and not hasattr(node, "body"):  # for, with, def: their statements
            text = ast.unparse(node)
        else:
            continue
        if any(anchor in text for anchor in PROTOCOL):
            found.append(text)
    return found


def api(tree: ast.Module) -> set[str]:
    """ctx.X, launcher.X (and launcher.a.b.X imported from the package) that the program uses."""
    used = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ("ctx", "launcher"):
            used.add(f"{node.value.id}.{node.attr}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "launcher":
            used.update(f"{node.module}.{alias.name}" for alias in node.names)
    return used


@pytest.mark.parametrize("kind", COUNTERPARTS)
def test_the_helpers_both_define_are_the_same_code(kind):
    template, example = (functions(tree) for tree in template_and_example(kind))
    for name in SHARED_HELPERS[kind]:
        assert without_docs_and_annotations(template[name]) == without_docs_and_annotations(example[name]), \
            f"{name}() differs between the {kind} template and jobs/examples/{COUNTERPARTS[kind]}: change both"


@pytest.mark.parametrize("kind", COUNTERPARTS)
def test_the_template_uses_the_protocol_as_its_example_does(kind):
    """Checkpoints, notices, progress and collectives: each such line of the template's main() is a
    line of the example's (names aside), so a change of the pattern in one fails until the other has it."""
    template, example = template_and_example(kind)
    theirs = protocol_lines(example, {})
    ours = protocol_lines(template, RENAMED[kind])
    assert ours, "no protocol lines found: has the template's main() moved?"
    missing = [line for line in ours if line not in theirs]
    assert not missing, f"lines of the {kind} template that jobs/examples/{COUNTERPARTS[kind]} does not have: {missing}"


@pytest.mark.parametrize("kind", COUNTERPARTS)
def test_the_template_and_its_example_use_the_same_api(kind):
    template, example = (api(tree) for tree in template_and_example(kind))
    assert example - template == API_ONLY_IN_EXAMPLE[kind], \
        f"jobs/examples/{COUNTERPARTS[kind]} uses more: template too?"
    assert template - example == API_ONLY_IN_TEMPLATE[kind]
