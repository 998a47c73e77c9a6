"""The owner's key: a secret only the user who runs jaxlaunch can read, to sign the files in a run
directory that are later unpickled (a function job's call.pkl, a result.pkl). A run directory on a
shared filesystem may be written by someone else (a folder another user made first, a group with
write access): unpickling a file from there would run their code as the job's owner. A file whose
signature does not match is refused before anything is unpickled.

The key lives in ~/.jaxlaunch/key ($JAXLAUNCH_HOME; mode 0600, its folder 0700), made on first
use. The supervisor passes it to the ranks in JAXLAUNCH_OWNER_KEY (as it passes the control
secret), so ranks on nodes or in container images without the same home folder can check too. It
is in no file of the run directory, no log and no command line.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

from .environment import OWNER_KEY_ENV

KEY_FILE = "key"


def _home() -> Path:
    return Path(os.environ.get("JAXLAUNCH_HOME", "~/.jaxlaunch")).expanduser()


def owner_key() -> str:
    """The key (hex): from the environment a rank was given, else the owner's key file, made now
    if there is none (0600, in a 0700 folder)."""
    if os.environ.get(OWNER_KEY_ENV):
        return os.environ[OWNER_KEY_ENV]
    home = _home()
    path = home / KEY_FILE
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = secrets.token_hex(32)
    try:  # O_EXCL: two first uses at once keep one key
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    with os.fdopen(fd, "w") as handle:
        handle.write(key + "\n")
    return key


def sign(data: bytes, key: str | None = None) -> str:
    """HMAC-SHA256 of `data` with the owner's key, hex."""
    return hmac.new(bytes.fromhex(key or owner_key()), data, hashlib.sha256).hexdigest()


def signed_by_owner(data: bytes, signature, key: str | None = None) -> bool:
    """Whether `signature` is the owner's for `data` (constant time; False for anything malformed)."""
    if not isinstance(signature, str) or not signature.isascii():
        return False
    return hmac.compare_digest(sign(data, key), signature)
