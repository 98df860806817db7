"""benches/merge.py: the bench's candidate lists are what column shards' top_k would send
(distinct ascending global columns in each shard's range), and the lax peer it times merges
them to exactly merge_topk's result."""

from __future__ import annotations

import jax
import numpy as np

from benches import bench, merge


def test_candidate_lists_have_distinct_columns_in_their_shards():
    shape = bench.Shape(merge.OP, "float32", 3, 4 * 512, 512, "full")
    ((values, columns),) = merge.make_inputs(shape, sets=1, seed=0)
    assert values.shape == columns.shape == (3, 2048)
    lists = np.asarray(columns).reshape(3, 4, 512)
    assert (np.diff(lists, axis=-1) > 0).all()
    shard = lists // merge.SHARD_COLUMNS
    assert (shard == np.arange(4)[None, :, None]).all()
    assert merge.input_bytes(shape) == 3 * 2048 * 8


def test_lax_peer_equals_merge_topk():
    shape = bench.Shape(merge.OP, "bfloat16", 5, 8 * 64, 64, "full")
    ((values, columns),) = merge.make_inputs(shape, sets=1, seed=3)
    ours_values, ours_columns = jax.jit(merge.ours_call(64))(values, columns)
    lax_values, lax_columns = jax.jit(merge.lax_call(64))(values, columns)
    assert merge.same_values(ours_values, lax_values)
    # bfloat16 normals tie often; lax breaks ties by position, which is column order here.
    np.testing.assert_array_equal(np.asarray(ours_columns), np.asarray(lax_columns))


def test_same_values_sees_one_changed_bit():
    a = np.linspace(3.0, -1.0, 16, dtype=np.float32)
    b = a.copy()
    b[7] = np.nextafter(b[7], np.float32(0))
    assert merge.same_values(a, a) and not merge.same_values(a, b)
