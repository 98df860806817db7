"""Value families built to break a top-k (ties, signed zeros, NaN of both signs, denormals,
infinities, random bit patterns), at every length boundary, both operators, every backend."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from tests.support import families
from tests.support.families import edge_lengths
from tests.support.operators import SCORE_DTYPES, make_scores, run_op
from tests.support.reference import reference_topk


@pytest.mark.parametrize("family", sorted(families.FAMILIES))
@pytest.mark.parametrize("n,k", [(37, 8), (515, 64), (4099, 512)])
def test_family(op, backend, family, n, k):
    rng = np.random.default_rng(zlib.crc32(f"{family}/{n}/{k}".encode()))  # same every run
    rows = 12
    scores = make_scores(op, rng, (rows, n), family)
    lengths = edge_lengths(k, n, rows, rng)
    for sorted_ in (False, True):
        out = run_op(op, backend, scores, lengths, k=k, sorted=sorted_)
        expected = reference_topk(scores, lengths, k, sorted=sorted_)
        np.testing.assert_array_equal(out, expected, err_msg=f"{family} sorted={sorted_}")


def test_nan_never_selected_and_displaces_nothing(op, backend):
    rng = np.random.default_rng(12)
    n, k = 100, 10
    scores = make_scores(op, rng, (2, n))
    with_nan = scores.copy()
    top = np.argsort(-scores[0].astype(np.float32))[:5]
    with_nan[0, top] = np.nan  # the would-be winners become NaN
    with_nan[1, ::2] = -np.nan
    lengths = np.full(2, n, np.int32)
    out = run_op(op, backend, with_nan, lengths, k=k)
    for r in range(2):
        assert not np.isnan(with_nan[r, out[r]].astype(np.float32)).any()
    np.testing.assert_array_equal(out, reference_topk(with_nan, lengths, k))
    all_nan = np.full((1, n), np.nan, np.float32).astype(scores.dtype)
    assert (run_op(op, backend, all_nan, np.array([n], np.int32), k=k) == -1).all()


def test_positive_zero_ranks_above_negative_zero(op, backend):
    scores = np.array([[-0.0, 0.0, -0.0, 0.0, -1.0]], np.float32).astype(SCORE_DTYPES[op])
    out = run_op(op, backend, scores, np.array([5], np.int32), k=3, sorted=True)
    np.testing.assert_array_equal(out, [[1, 3, 0]])


def test_odd_widths_unaligned_rows(op, backend):
    """Widths that are not a multiple of the vector width start rows at unaligned addresses."""
    rng = np.random.default_rng(13)
    for n in (1, 2, 3, 5, 7, 9, 15, 17, 33, 127, 1023, 4097):
        scores = make_scores(op, rng, (7, n), "random_bits")
        lengths = rng.integers(-1, n + 2, size=7).astype(np.int32)
        for k in (1, 3, 16):
            out = run_op(op, backend, scores, lengths, k=k)
            np.testing.assert_array_equal(out, reference_topk(scores, lengths, k), err_msg=str(n))


def test_pivot_at_minus_infinity_among_nans(op, backend):
    """The k-th value is -inf in rows that also hold NaN: NaN (which the bf16 kernel rewrites to
    -inf in registers) must neither be counted nor taken, and -inf ties go to the lowest columns."""
    n = 600
    row = np.full(n, -np.inf, np.float32)
    row[::3] = np.nan  # 400 non-NaN values, all -inf
    other = row.copy()
    other[[5, 50, 500]] = [1.0, -2.0, 3.0]  # three finite values above the -inf ties
    scores = np.stack([row, other, row[::-1].copy()]).astype(SCORE_DTYPES[op])
    lengths = np.array([n, n - 1, 451], np.int32)
    for k in (1, 3, 300, 399, 400, 401, 512):
        for sorted_ in (False, True):
            out = run_op(op, backend, scores, lengths, k=k, sorted=sorted_)
            np.testing.assert_array_equal(
                out,
                reference_topk(scores, lengths, k, sorted=sorted_),
                err_msg=f"k={k} sorted={sorted_}",
            )


def test_pivot_at_smallest_normals_and_subnormals(op, backend):
    """Pivots on each side of the normal/subnormal boundary and on +-0: where a compare that
    flushes subnormals to zero, or treats -0 as +0, would blur the order."""
    if op == "topk_bf16":
        groups = [0x0081, 0x0080, 0x007F, 0x0001, 0x0000, 0x8000, 0x8001, 0x807F, 0x8080, 0x8081]
    else:
        groups = [
            0x00800001,
            0x00800000,
            0x007FFFFF,
            0x00000001,
            0x00000000,
            0x80000000,
            0x80000001,
            0x807FFFFF,
            0x80800000,
            0x80800001,
        ]
    copies = 40  # groups are listed largest first; each k below ends inside one group
    rng = np.random.default_rng(14)
    rows = [rng.permutation(np.repeat(groups, copies)) for _ in range(3)]
    scores = families.from_bits(np.stack(rows), np.dtype(SCORE_DTYPES[op]))
    n = scores.shape[1]
    lengths = np.array([n, n - 7, 333], np.int32)
    for k in range(copies // 2, len(groups) * copies, copies):
        for sorted_ in (False, True):
            out = run_op(op, backend, scores, lengths, k=k, sorted=sorted_)
            np.testing.assert_array_equal(
                out,
                reference_topk(scores, lengths, k, sorted=sorted_),
                err_msg=f"k={k} sorted={sorted_}",
            )


def test_filtered_rows_at_the_column_bitmap_limit(backend):
    """topk_filtered orders unsorted winners through a bitmap of the row for rows up to 262144
    columns (runs of 1 to 16 words a thread) and by a sort beyond: rows on both sides of that
    limit and of the run-length steps, ties included."""
    rng = np.random.default_rng(262144)
    n = 262150
    scores = np.round(rng.standard_normal((8, n)).astype(np.float32) * 64) / 64  # many ties
    lengths = np.array([262144, 262145, 262143, 131072, 131073, 65536, 16385, 16384], np.int32)
    for sorted_ in (False, True):
        out = run_op("topk_filtered", backend, scores, lengths, k=2048, sorted=sorted_)
        np.testing.assert_array_equal(
            out, reference_topk(scores, lengths, 2048, sorted=sorted_), err_msg=f"sorted={sorted_}"
        )
