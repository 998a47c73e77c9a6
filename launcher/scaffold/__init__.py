"""`jaxlaunch init NAME [--template minimal|data-parallel|sharded]`: a new job, ready to run.

Writes NAME.yaml (the spec) and NAME.py (the entrypoint; '-' and '.' in NAME become '_' so the
file name is a plain module name) into a folder, never over an existing file. Each template
runs as written with `jaxlaunch run NAME.yaml` on a laptop (1 node, 2 processes, CPU devices)
and is a starting point for the real job: the specs' comments say what to change for Slurm.

What lives here: this module (the names, the rendering, the writing) and the templates, one
folder per kind, shipped as package data:
    templates/KIND/spec.yaml       what NAME.yaml becomes
    templates/KIND/job.py.tmpl     what NAME.py becomes: a Python program (`.tmpl`, so that it is
                                   not a module of this package; its placeholders sit in strings)
Placeholders are string.Template's: ${name}, ${name_value} (the name as a YAML value),
${spec_file} (NAME.yaml) and ${job_file} (NAME.py); a literal `$` is written `$$`. The
data-parallel and sharded programs follow jobs/examples/train_data_parallel.py and jobs/examples/sharded_mlp.py;
tests/unit/test_scaffold_templates.py checks the parts that must agree.

Entry point: `write_job(name, template, folder)`.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from string import Template

from ..errors import UsageError
from ..spec import JOB_NAME

# The kinds, in the order `jaxlaunch init --help` and its errors list them: templates/KIND/.
TEMPLATES = ("minimal", "data-parallel", "sharded")
SPEC_TEMPLATE, JOB_TEMPLATE = "spec.yaml", "job.py.tmpl"

# Plain YAML scalars the core schema would read as something other than a string.
_NOT_STRINGS = {"null", "Null", "NULL", "true", "True", "TRUE", "false", "False", "FALSE"}


def job_file_name(name: str) -> str:
    """NAME.py with '-' and '.' as '_': `my-job` -> `my_job.py`."""
    return re.sub(r"[-.]", "_", name) + ".py"


def _yaml_name(name: str) -> str:
    """The name as a YAML value that reads back as this string (`123`, `true` need quotes)."""
    return name if name[0].isalpha() and name not in _NOT_STRINGS else f'"{name}"'


def template_text(template: str, file: str) -> str:
    """The text of templates/TEMPLATE/FILE, placeholders unfilled."""
    return (resources.files(__name__) / "templates" / template / file).read_text(encoding="utf-8")


def render_job(name: str, template: str = "minimal") -> dict[str, str]:
    """Pure: {file name: text} for the spec and the entrypoint."""
    if template not in TEMPLATES:
        raise UsageError(f"--template {template}: no such template.\n  fix: choose one of {', '.join(TEMPLATES)}")
    if not JOB_NAME.fullmatch(name):  # fullmatch: the pattern's `$` would let a trailing newline through
        raise UsageError(f"{name!r} is not a valid job name.\n  fix: use letters, digits, '.', '_' or '-', starting "
                         f"with a letter or digit, at most 64 characters (e.g. my-job)")
    values = {"name": name, "name_value": _yaml_name(name), "spec_file": f"{name}.yaml",
              "job_file": job_file_name(name)}
    spec, job = (template_text(template, file) for file in (SPEC_TEMPLATE, JOB_TEMPLATE))
    return {f"{name}.yaml": Template(spec).substitute(values), job_file_name(name): Template(job).substitute(values)}


def write_job(name: str, template: str = "minimal", folder: Path | str | None = None) -> list[Path]:
    """Write NAME.yaml and NAME.py (see job_file_name) into `folder` (default: the working
    directory); returns their paths, spec first. Raises UsageError for a bad name or template,
    a missing folder, or a file that exists already (nothing is overwritten, nothing half-written)."""
    files = render_job(name, template)
    folder = Path.cwd() if folder is None else Path(folder)
    if not folder.is_dir():
        raise UsageError(f"{folder}: no such folder.\n  fix: create it first, or run jaxlaunch init in another folder")
    paths = [folder / file for file in files]
    existing = [str(p) for p in paths if p.exists() or p.is_symlink()]
    if existing:
        raise UsageError(f"{' and '.join(existing)} already exist{'s' if len(existing) == 1 else ''}; "
                         f"jaxlaunch init never overwrites a file.\n  fix: choose another NAME, or move "
                         f"{'it' if len(existing) == 1 else 'them'} away first")
    written = []
    try:
        for path, text in zip(paths, files.values()):
            with open(path, "x", encoding="utf-8") as out:  # "x": fails instead of replacing a file made meanwhile
                out.write(text)
            written.append(path)
    except FileExistsError as error:
        for path in written:
            path.unlink()
        raise UsageError(f"{error.filename} appeared while writing; jaxlaunch init never overwrites a file.\n"
                         f"  fix: choose another NAME, or move it away first") from None
    return paths
