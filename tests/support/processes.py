"""Running a check or a benchmark in a process of its own from the repository root (JAX fixes
the device count and XLA's flags when it starts), with extra environment variables."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).parents[2]


def run_python(*args: str, **env: str) -> str:
    """`python ARGS` with `env` added to this process's environment; asserts it succeeded
    and returns its stdout."""
    result = subprocess.run(
        [sys.executable, *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env=dict(os.environ, **env),
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout
