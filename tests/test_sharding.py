"""Row and column sharding over 8 host devices (each check a separate process: the device
count is fixed at JAX's start)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).parents[1]


@pytest.mark.parametrize(
    "check,column_merge,summary",
    [
        ("tests.checks.sharding", "all_gather", "no all-gather of scores"),
        ("tests.checks.column_sharding", "all_gather", "only the candidates cross devices"),
        # The tree of pairwise merges (jax_topk/_sharding.py's COLUMN_MERGE).
        ("tests.checks.column_sharding", "tree", "column sharding (tree):"),
        ("tests.checks.indexer_sharding", "all_gather", "no all-gather"),
    ],
)
def test_sharded_calls_equal_unsharded_without_moving_scores(check, column_merge, summary):
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_TOPK_COLUMN_MERGE=column_merge)
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
