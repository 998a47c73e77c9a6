"""The job spec: one typed object (model.py), loaded from YAML and validated once (load.py).

Everything after `load_spec` trusts the JobSpec it gets. Errors name the file, the line, the key
path and the fix, so a user never has to read a traceback to find a typo.

  fields.py      typed records: kinds, ranges, every problem at once with its key path
  model.py       JobSpec, SlurmSpec and ContainerSpec: each key's type, default and description; durations
  load.py        YAML file + --set overrides -> JobSpec, with file:line messages
  entrypoint.py  the entrypoint's file or module exists and defines the function (never run)

Names load lazily: a rank reading spec.json needs the model, not the YAML loader.
"""

_WHERE = {
    "InvalidRecord": "fields",
    "ContainerSpec": "model", "JOB_NAME": "model", "SPEC_KEYS": "model", "JobSpec": "model", "SlurmSpec": "model",
    "format_slurm_time": "model", "parse_duration": "model",
    "SWEEP_SECTION": "load", "build_spec": "load", "describe_spec": "load", "load_spec": "load",
    "parse_overrides": "load", "read_spec_file": "load", "shown": "load", "validate_spec": "load",
}
__all__ = sorted(_WHERE)


def __getattr__(name):
    if name in _WHERE:
        import importlib

        value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'launcher.spec' has no attribute {name!r}")


def __dir__():
    return __all__
