"""benches/indexer.py: the JAX path the bench times against the indexer, chunked over rows
where its products would not fit, computes what it does in one piece (to rounding); the
floors count what the shapes ask."""

from __future__ import annotations

import numpy as np
import pytest

from benches import bench, indexer


@pytest.mark.parametrize("dtype", ["bfloat16", indexer.FP8])
def test_jax_path_chunked_equals_one_piece(dtype, monkeypatch):
    shape = bench.Shape("indexer_topk", dtype, 12, 256, 16, "causal", heads=4, head_dim=32)
    (inputs,) = indexer.make_inputs(shape, 1, seed=0)
    whole = indexer.jax_path_scores(*inputs)
    monkeypatch.setattr(indexer, "MAX_PRODUCTS_BYTES", 4 * 4 * 256 * 4)  # 4 rows a chunk
    assert indexer.rows_per_chunk(12, 4, 256) == 4
    chunked = indexer.jax_path_scores(*inputs)
    # XLA may sum a chunk's products in another order: equal to rounding
    np.testing.assert_allclose(np.asarray(chunked), np.asarray(whole), rtol=1e-6, atol=1e-6)
    assert np.isinf(np.asarray(whole)[0, 256 - 12 + 1 :]).all()  # causal: row 0 sees 245
    for name, call in indexer.calls("indexer_topk", 16).items():
        assert call(*inputs).shape == (12, 16), name


def test_rows_per_chunk_divides_the_rows():
    assert indexer.rows_per_chunk(2048, 64, 32768) == 1024  # 8 GiB a chunk
    assert indexer.rows_per_chunk(512, 64, 65536) == 512  # exactly 8 GiB: one piece
    assert indexer.rows_per_chunk(6, 64, 1 << 30) == 1


def test_floors_count_visible_pairs_and_bytes():
    shape = bench.Shape("indexer_logits", "bfloat16", 4, 100, 8, "causal", heads=2, head_dim=8)
    assert indexer.flops(shape) == 2 * 2 * 8 * (97 + 98 + 99 + 100)
    inputs = 4 * 2 * 8 * 2 + 100 * 8 * 2 + 4 * (2 * 4 + 4)
    assert indexer.bytes_moved(shape) == inputs + 4 * 4 * 100
