"""Deprecated alias of launcher.rank.checkpoints (see launcher/runtime/__init__.py)."""

from ..rank.checkpoints import Checkpoints, load_checkpoint  # noqa: F401

__all__ = ["Checkpoints", "load_checkpoint"]
