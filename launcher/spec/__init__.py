"""The job spec: one typed object (model.py), loaded from YAML and validated once (load.py).

Everything after `load_spec` trusts the JobSpec it gets. Errors name the file, the line, the key
path and the fix, so a user never has to read a traceback to find a typo.

  fields.py      typed records: kinds, ranges, every problem at once with its key path
  model.py       JobSpec and SlurmSpec: each key's type, default and description; durations
  load.py        YAML file + --set overrides -> JobSpec, with file:line messages
  entrypoint.py  the entrypoint's file or module exists and defines the function (never run)
"""

from .fields import InvalidRecord
from .load import (SWEEP_SECTION, build_spec, describe_spec, load_spec, parse_overrides, read_spec_file, shown,
                   validate_spec)
from .model import JOB_NAME, SPEC_KEYS, JobSpec, SlurmSpec, format_slurm_time, parse_duration

__all__ = ["InvalidRecord", "JOB_NAME", "JobSpec", "SPEC_KEYS", "SWEEP_SECTION", "SlurmSpec", "build_spec",
           "describe_spec", "format_slurm_time", "load_spec", "parse_duration", "parse_overrides", "read_spec_file",
           "shown", "validate_spec"]
