"""Equality of arrays as raw bits: -0.0 and +0.0 differ, every NaN pattern must match."""

from __future__ import annotations

import numpy as np


def assert_same_bits(actual, expected, msg=""):
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.dtype == expected.dtype, msg
    width = actual.dtype.itemsize * 8
    np.testing.assert_array_equal(
        actual.view(f"uint{width}"), expected.view(f"uint{width}"), err_msg=msg
    )
