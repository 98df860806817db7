"""Row and column sharding over 8 host devices (each check a separate process: the device
count is fixed at JAX's start)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).parents[1]


@pytest.mark.parametrize(
    "check,summary",
    [
        ("tests.checks.sharding", "no all-gather of scores"),
        ("tests.checks.column_sharding", "only the candidates cross devices"),
        ("tests.checks.indexer_sharding", "no all-gather"),
    ],
)
def test_sharded_calls_equal_unsharded_without_moving_scores(check, summary):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    result = subprocess.run(
        [sys.executable, "-m", check],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert summary in result.stdout
