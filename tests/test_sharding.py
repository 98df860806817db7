"""Row and column sharding over 8 host devices (each check a separate process: the device
count is fixed at JAX's start)."""

import pytest

from tests.support.processes import run_python


@pytest.mark.parametrize(
    "check,column_merge,summary",
    [
        ("tests.checks.sharding", "all_gather", "no all-gather of scores"),
        ("tests.checks.column_sharding", "all_gather", "only the candidates cross devices"),
        # The tree of pairwise merges (jax_topk/_sharding.py's COLUMN_MERGE).
        ("tests.checks.column_sharding", "tree", "column sharding (tree):"),
        ("tests.checks.indexer_sharding", "all_gather", "only the candidates cross devices"),
        # Context parallelism by hand: shard_map, all_gather or a ppermute ring, merge_topk.
        ("tests.checks.shard_map_merge", "all_gather", "hand-written context-parallel calls"),
        ("tests.checks.indexer_sharding", "tree", "indexer context parallelism (tree):"),
    ],
)
def test_sharded_calls_equal_unsharded_without_moving_scores(check, column_merge, summary):
    stdout = run_python("-m", check, JAX_PLATFORMS="cpu", JAX_TOPK_COLUMN_MERGE=column_merge)
    assert summary in stdout
