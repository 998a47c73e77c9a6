"""Count the scheduler commands jaxlaunch runs: a folder of wrappers (squeue, scontrol, sacct,
sbatch, scancel) put first on PATH, each appending its name to a log and then running the real
command. Used by the Slurm tier to check that status and wait() stay polite at scale."""

from __future__ import annotations

import os
import shutil
from collections import Counter
from pathlib import Path

COMMANDS = ("squeue", "scontrol", "sacct", "sbatch", "scancel")


class SlurmCallCounter:
    def __init__(self, folder: Path):
        self.bin = Path(folder) / "bin"
        self.log = Path(folder) / "calls.log"
        self.bin.mkdir(parents=True, exist_ok=True)
        for name in COMMANDS:
            real = shutil.which(name)
            if real is None:
                continue
            wrapper = self.bin / name
            wrapper.write_text(f'#!/bin/sh\necho {name} >> "{self.log}"\nexec "{real}" "$@"\n')
            wrapper.chmod(0o755)

    def env(self, base: dict[str, str]) -> dict[str, str]:
        return {**base, "PATH": f"{self.bin}{os.pathsep}{base.get('PATH', '')}"}

    def reset(self) -> None:
        self.log.unlink(missing_ok=True)

    def calls(self) -> Counter:
        if not self.log.exists():
            return Counter()
        return Counter(self.log.read_text().split())
