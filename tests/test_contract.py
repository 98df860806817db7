"""docs/contract.md sections 3-4 for both operators on every backend, against the NumPy
reference and against jax.lax.top_k on NaN-free rows."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_topk
from tests.support.families import edge_lengths
from tests.support.operators import OPS, SCORE_DTYPES, make_scores, permuted_page_table, run_op
from tests.support.reference import reference_topk


@pytest.mark.parametrize("k", [1, 7, 64])
@pytest.mark.parametrize("n", [1, 63, 200, 1001])
def test_matches_reference(op, backend, k, n):
    rng = np.random.default_rng(n * 31 + k)
    scores = make_scores(op, rng, (12, n))
    lengths = edge_lengths(k, n, 12, rng)
    for sorted_ in (False, True):
        out = run_op(op, backend, scores, lengths, k=k, sorted=sorted_)
        np.testing.assert_array_equal(out, reference_topk(scores, lengths, k, sorted=sorted_))


def test_matches_lax_top_k(op, backend):
    """On NaN-free full rows: sorted=True is exactly lax.top_k's index order, and
    sorted=False is the same set in ascending columns."""
    rng = np.random.default_rng(1)
    for family in ("normal", "heavy_ties", "signed_zeros", "infinities"):
        scores = make_scores(op, rng, (6, 700), family)
        lengths = np.full(6, 700, np.int32)
        _, expected = jax.lax.top_k(jax.device_put(scores, jax.devices("cpu")[0]), 50)
        expected = np.asarray(expected)
        ranked = run_op(op, backend, scores, lengths, k=50, sorted=True)
        np.testing.assert_array_equal(ranked, expected, err_msg=family)
        unordered = run_op(op, backend, scores, lengths, k=50)
        np.testing.assert_array_equal(unordered, np.sort(expected, axis=1), err_msg=family)


def test_rows_shorter_than_k_fill_minus_one(op, backend):
    rng = np.random.default_rng(2)
    scores = make_scores(op, rng, (3, 40))
    out = run_op(op, backend, scores, np.array([0, 5, 40], np.int32), k=50)
    assert (out[0] == -1).all()
    np.testing.assert_array_equal(out[1, :5], np.arange(5))
    assert (out[1, 5:] == -1).all()
    np.testing.assert_array_equal(out[2, :40], np.arange(40))
    assert (out[2, 40:] == -1).all()


@pytest.mark.parametrize("page_size", [1, 8, 64])
def test_page_transform(op, backend, page_size):
    rng = np.random.default_rng(page_size)
    rows, n, k = 9, 1000, 32
    pages = -(-n // page_size) + 1
    scores = make_scores(op, rng, (rows, n))
    lengths = edge_lengths(k, n, rows, rng)
    table = permuted_page_table(rng, rows, pages)
    for sorted_ in (False, True):
        out = run_op(
            op, backend, scores, lengths, k=k, page_table=table, page_size=page_size, sorted=sorted_
        )
        expected = reference_topk(
            scores, lengths, k, page_table=table, page_size=page_size, sorted=sorted_
        )
        np.testing.assert_array_equal(out, expected)


def test_table_rows_clamped(op, backend):
    rng = np.random.default_rng(3)
    rows, n, k, page_size = 8, 300, 16, 8
    table = permuted_page_table(rng, 3, n // page_size + 2)
    table_rows = np.array([0, 1, 2, -1, 3, 100, np.iinfo(np.int32).min, 1], np.int32)
    scores = make_scores(op, rng, (rows, n))
    lengths = np.full(rows, n, np.int32)
    out = run_op(
        op,
        backend,
        scores,
        lengths,
        k=k,
        page_table=table,
        page_size=page_size,
        table_rows=table_rows,
    )
    expected = reference_topk(
        scores, lengths, k, page_table=table, page_size=page_size, table_rows=table_rows
    )
    np.testing.assert_array_equal(out, expected)


def test_page_table_entries_of_minus_one_and_large(op, backend):
    """Unmapped (-1) and huge page numbers go through the same 32-bit formula on both
    backends; -1 output slots are never transformed."""
    rng = np.random.default_rng(4)
    rows, n, k, page_size = 4, 64, 80, 16
    table = np.array([[-1, 2, 0x7FFFFFF, 3]] * rows, np.int32)
    scores = make_scores(op, rng, (rows, n))
    lengths = np.array([64, 10, 0, 33], np.int32)
    out = run_op(op, backend, scores, lengths, k=k, page_table=table, page_size=page_size)
    expected = reference_topk(scores, lengths, k, page_table=table, page_size=page_size)
    np.testing.assert_array_equal(out, expected)
    assert (out[2] == -1).all()


@pytest.mark.parametrize("num_valid_rows", [0, 3, 10, 11, 1000, -4])
def test_num_valid_rows_traced(op, backend, num_valid_rows):
    rng = np.random.default_rng(5)
    rows, n, k = 10, 257, 20
    scores = make_scores(op, rng, (rows, n))
    lengths = edge_lengths(k, n, rows, rng)
    out = run_op(op, backend, scores, lengths, k=k, num_valid_rows=np.int32(num_valid_rows))
    expected = reference_topk(scores, lengths, k, num_valid_rows=num_valid_rows)
    np.testing.assert_array_equal(out, expected)
    valid = int(np.clip(num_valid_rows, 0, rows))
    assert (out[valid:] == -1).all()


def test_num_valid_rows_rows_are_not_read(op, backend):
    """Rows past num_valid_rows give -1 whatever their scores and lengths hold."""
    rng = np.random.default_rng(6)
    scores = make_scores(op, rng, (6, 100))
    poisoned = scores.copy()
    poisoned[3:] = make_scores(op, rng, (3, 100), "random_bits")
    lengths = np.array([100, 100, 100, -7, 10**9, 5], np.int32)
    a = run_op(op, backend, scores, lengths, k=8, num_valid_rows=np.int32(3))
    b = run_op(op, backend, poisoned, lengths, k=8, num_valid_rows=np.int32(3))
    np.testing.assert_array_equal(a, b)
    assert (a[3:] == -1).all()


@pytest.mark.parametrize("shape", [(300,), (2, 3, 300), (1, 1, 1, 17)])
def test_leading_shapes(op, backend, shape):
    rng = np.random.default_rng(7)
    scores = make_scores(op, rng, shape)
    lengths = rng.integers(-2, shape[-1] + 3, size=shape[:-1]).astype(np.int32)
    out = run_op(op, backend, scores, lengths, k=9)
    assert out.shape == shape[:-1] + (9,)
    np.testing.assert_array_equal(out, reference_topk(scores, lengths, 9))


def test_wide_integer_lengths_saturate(op, backend):
    """uint32 lengths past int32's range mean 'beyond n', not a wrapped negative."""
    rng = np.random.default_rng(8)
    scores = make_scores(op, rng, (3, 50))
    lengths = np.array([2**32 - 1, 2**31, 7], np.uint32)
    out = run_op(op, backend, scores, lengths, k=4)
    np.testing.assert_array_equal(out, reference_topk(scores, np.array([50, 50, 7]), 4))


@pytest.mark.parametrize(
    "wide",
    [
        np.array([2**32 + 2, 2**31, -(2**40)], np.int64),
        np.array([2**63, 2**32 + 2, 0], np.uint64),
    ],
)
def test_host_64_bit_lengths_saturate(op, wide):
    """Host arrays of 64-bit lengths (and table_rows, num_valid_rows) passed straight to the
    function saturate, where jnp.asarray alone (x64 off) would wrap 2**32 + 2 to 2 and 2**31
    to an empty row."""
    rng = np.random.default_rng(18)
    scores = make_scores(op, rng, (3, 50))
    want = reference_topk(scores, np.clip(wide.astype(np.float64), 0, 50).astype(np.int32), 4)
    np.testing.assert_array_equal(np.asarray(OPS[op](scores, wide, k=4)), want)
    table = permuted_page_table(rng, 2, 50)
    table_rows = np.array([2**40, -(2**40), 1], np.int64)  # clamped: table rows 1, 0, 1
    lengths = np.full(3, 50, np.int32)
    got = OPS[op](
        scores,
        lengths,
        k=4,
        page_table=table,
        table_rows=table_rows,
        num_valid_rows=np.array(2**40),
    )
    want = reference_topk(scores, lengths, 4, page_table=table, table_rows=np.array([1, 0, 1]))
    np.testing.assert_array_equal(np.asarray(got), want)


def test_host_64_bit_lengths_saturate_in_top_k_and_the_indexer():
    x = np.arange(50, dtype=np.float32)[None].repeat(3, 0)
    wide = np.array([2**32 + 2, 2**31, -(2**40)], np.int64)
    _, indices = jax_topk.top_k(x, 4, lengths=wide)
    np.testing.assert_array_equal(np.asarray(indices), [[49, 48, 47, 46]] * 2 + [[-1] * 4])
    q = jnp.ones((3, 2, 8), jnp.bfloat16)
    keys = jnp.ones((50, 8), jnp.bfloat16)
    weights = jnp.ones((3, 2), jnp.float32)
    logits = np.asarray(jax_topk.indexer_logits(q, keys, weights, wide))
    assert np.isfinite(logits[:2]).all() and np.isneginf(logits[2]).all()
    idx = np.asarray(jax_topk.indexer_topk(q, keys, weights, wide, k=4, sorted=True))
    np.testing.assert_array_equal(idx, [[0, 1, 2, 3]] * 2 + [[-1] * 4])


def test_python_int_lengths_past_int32_saturate():
    """A Python int (or a list of them) too wide for int32 saturates like a NumPy int64
    does, where jnp.asarray alone raises OverflowError."""
    x = jnp.arange(5.0)
    for wide in (2**40, 2**70):
        _, indices = jax_topk.top_k(x, 2, lengths=wide)
        np.testing.assert_array_equal(np.asarray(indices), [4, 3])
        np.testing.assert_array_equal(np.asarray(jax_topk.topk_filtered(x, wide, k=2)), [3, 4])
        _, indices = jax_topk.top_k(x, 2, lengths=-wide)
        np.testing.assert_array_equal(np.asarray(indices), [-1, -1])
    rows = jnp.arange(10.0).reshape(2, 5)
    # NumPy alone would make [2**63, 1] float64; JAX alone would wrap a uint64 to 0.
    for wide in ([2**40, 1], [2**63, 1], (np.uint64(2**63), np.int8(1)), [2**70, 1]):
        got = jax_topk.topk_filtered(rows, wide, k=2, sorted=True)
        np.testing.assert_array_equal(np.asarray(got), [[4, 3], [0, -1]], err_msg=str(wide))
    with pytest.raises(TypeError, match="lengths must be an integer array"):
        jax_topk.topk_filtered(rows, [2.0, 1.0], k=2)


def test_device_64_bit_table_rows_saturate_under_x64(op):
    """Under x64 an integer list is an int64 device array: table_rows (a runtime value, as
    lengths) saturates to int32 and is then clamped into the table's rows."""
    rng = np.random.default_rng(19)
    scores = make_scores(op, rng, (3, 50))
    table = permuted_page_table(rng, 2, 50)
    lengths = np.full(3, 50, np.int32)
    with jax.enable_x64(True):
        table_rows = jnp.array([2**40, -(2**40), 1])
        assert table_rows.dtype == jnp.int64
        got = OPS[op](scores, lengths, k=4, page_table=table, table_rows=table_rows)
    want = reference_topk(scores, lengths, 4, page_table=table, table_rows=np.array([1, 0, 1]))
    np.testing.assert_array_equal(np.asarray(got), want)


def test_deterministic(op, backend):
    rng = np.random.default_rng(9)
    scores = make_scores(op, rng, (16, 2000), "heavy_ties")
    lengths = np.full(16, 2000, np.int32)
    first = run_op(op, backend, scores, lengths, k=100)
    for _ in range(3):
        np.testing.assert_array_equal(run_op(op, backend, scores, lengths, k=100), first)


def test_long_filtered_row(backend):
    """topk_filtered on rows long enough to take its multi-pass and sampled routes."""
    rng = np.random.default_rng(10)
    n = 200_003
    scores = make_scores("topk_filtered", rng, (3, n))
    lengths = np.array([n, 150_000, 2049], np.int32)
    for k in (1, 512, 2048):
        out = run_op("topk_filtered", backend, scores, lengths, k=k)
        np.testing.assert_array_equal(out, reference_topk(scores, lengths, k))


def test_max_bf16_width(backend):
    rng = np.random.default_rng(11)
    scores = make_scores("topk_bf16", rng, (4, 16384))
    lengths = np.array([16384, 9000, 4096, 16383], np.int32)
    for k in (512, 2048):
        out = run_op("topk_bf16", backend, scores, lengths, k=k)
        np.testing.assert_array_equal(out, reference_topk(scores, lengths, k))


def test_empty_batch(op, backend):
    scores = jnp.zeros((0, 32), SCORE_DTYPES[op])
    out = run_op(op, backend, np.asarray(scores), np.zeros((0,), np.int32), k=4)
    assert out.shape == (0, 4)
