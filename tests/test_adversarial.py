"""Value families built to break a top-k (ties, signed zeros, NaN of both signs, denormals,
infinities, random bit patterns), at every length boundary, both operators, every backend."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from conftest import SCORE_DTYPES, run_op
from jax_topk import _families
from reference import reference_topk
from test_contract import edge_lengths


@pytest.mark.parametrize("family", sorted(_families.FAMILIES))
@pytest.mark.parametrize("n,k", [(37, 8), (515, 64), (4099, 512)])
def test_family(op, backend, family, n, k):
    rng = np.random.default_rng(zlib.crc32(f"{family}/{n}/{k}".encode()))  # same every run
    rows = 12
    scores = _families.make(family, rng, (rows, n), SCORE_DTYPES[op])
    lengths = edge_lengths(k, n, rows, rng)
    for sorted_ in (False, True):
        out = run_op(op, backend, scores, lengths, k=k, sorted=sorted_)
        expected = reference_topk(scores, lengths, k, sorted=sorted_)
        np.testing.assert_array_equal(out, expected, err_msg=f"{family} sorted={sorted_}")


def test_nan_never_selected_and_displaces_nothing(op, backend):
    rng = np.random.default_rng(12)
    n, k = 100, 10
    scores = _families.make("normal", rng, (2, n), SCORE_DTYPES[op])
    with_nan = scores.copy()
    top = np.argsort(-scores[0].astype(np.float32))[:5]
    with_nan[0, top] = np.nan                       # the would-be winners become NaN
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
        scores = _families.make("random_bits", rng, (7, n), SCORE_DTYPES[op])
        lengths = rng.integers(-1, n + 2, size=7).astype(np.int32)
        for k in (1, 3, 16):
            out = run_op(op, backend, scores, lengths, k=k)
            np.testing.assert_array_equal(out, reference_topk(scores, lengths, k), err_msg=str(n))
