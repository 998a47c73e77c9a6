"""Deprecated: the rank side moved to launcher/rank/ (2026-11). Job code written against the old API
reference (`from launcher.runtime.checkpoints import load_checkpoint`) still imports, with a
DeprecationWarning, for one release; import `launcher.load_checkpoint` instead."""

import warnings

warnings.warn("launcher.runtime is deprecated and goes in the next release: import launcher.load_checkpoint "
              "(what the API reference documents is exported from launcher itself)", DeprecationWarning, stacklevel=2)
