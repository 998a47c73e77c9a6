"""Where rank 0 runs: its Python, the jaxlaunch it imported and whether ch-run started it
(tests/e2e/test_containers_charliecloud.py: the rank must run in the image, with the image's jaxlaunch)."""

import os
import sys

import launcher


def main(ctx):
    with open("/etc/os-release") as release:
        os_release = dict(line.rstrip("\n").split("=", 1) for line in release if "=" in line)
    return {"executable": sys.executable, "launcher": launcher.__file__, "ch_running": os.environ.get("CH_RUNNING"),
            "os": os_release.get("PRETTY_NAME", "").strip('"'), "version": sys.version.split()[0]}
