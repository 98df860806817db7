"""Row sharding over 8 host devices (a separate process: the device count is fixed at
JAX's start)."""

import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).parents[1]


def test_row_sharding_runs_locally_without_all_gather():
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    result = subprocess.run(
        [sys.executable, "-m", "tests.checks.sharding"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no all-gather of scores" in result.stdout
