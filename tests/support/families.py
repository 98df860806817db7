"""Adversarial value families for checking exactness: rows built to break a top-k kernel
(ties, signed zeros, NaN of both signs, denormals, infinities, raw bit patterns), and lengths
at every boundary. Shared by the tests, the check scripts and the benchmark's correctness
check."""

from __future__ import annotations

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.dtype(np.float32)


F16 = np.dtype(np.float16)


def from_bits(bits, dtype):
    """Raw bit patterns (any integer array) as values of a float dtype of that width."""
    dtype = np.dtype(dtype)
    return bits.astype(f"uint{_bit_width(dtype)}").view(dtype)


def _bit_width(dtype) -> int:
    return np.dtype(dtype).itemsize * 8


def normal(rng, shape, dtype):
    return rng.standard_normal(shape, dtype=np.float32).astype(dtype)


def heavy_ties(rng, shape, dtype):
    return rng.integers(-2, 3, size=shape).astype(np.float32).astype(dtype)


def constant(rng, shape, dtype):
    return np.full(shape, rng.standard_normal(), np.float32).astype(dtype)


def all_neg_inf(rng, shape, dtype):
    return np.full(shape, -np.inf, np.float32).astype(dtype)


def signed_zeros(rng, shape, dtype):
    choices = np.array([0.0, -0.0, 0.0, -0.0, -1.0, 1e-30], np.float32)
    return choices[rng.integers(0, len(choices), size=shape)].astype(dtype)


def nan_mix(rng, shape, dtype):
    """NaN of both signs scattered, also where the largest values would be."""
    x = rng.standard_normal(shape, dtype=np.float32)
    x[rng.random(shape) < 0.2] = np.nan
    x[rng.random(shape) < 0.1] = -np.nan
    x[x > 1.5] = np.copysign(np.nan, rng.standard_normal(x[x > 1.5].shape))
    return x.astype(dtype)


def denormals(rng, shape, dtype):
    width = _bit_width(dtype)
    mantissa_bits = ml_dtypes.finfo(dtype).nmant
    bits = rng.integers(0, 1 << mantissa_bits, size=shape, dtype=np.int64)
    signs = rng.integers(0, 2, size=shape, dtype=np.int64) << (width - 1)
    return from_bits(bits | signs, dtype)


def infinities(rng, shape, dtype):
    largest = ml_dtypes.finfo(dtype).max  # the dtype's own largest finite value
    choices = np.array([np.inf, -np.inf, 0.0, 1.0, -1.0, largest, -largest]).astype(dtype)
    return choices[rng.integers(0, len(choices), size=shape)]


def random_bits(rng, shape, dtype):
    width = _bit_width(dtype)
    return from_bits(rng.integers(0, 1 << width, size=shape, dtype=np.int64), dtype)


def ascending(rng, shape, dtype):
    del rng
    return np.broadcast_to(np.arange(shape[-1], dtype=np.float32), shape).astype(dtype)


def near_ties(rng, shape, dtype):
    """Values one ulp apart: every radix digit but the last is shared."""
    width = _bit_width(dtype)
    base = int(np.array(1.0, dtype).view(f"uint{width}"))
    return from_bits(base + rng.integers(0, 4, size=shape, dtype=np.int64), dtype)


FAMILIES = {
    f.__name__: f
    for f in (
        normal,
        heavy_ties,
        constant,
        all_neg_inf,
        signed_zeros,
        nan_mix,
        denormals,
        infinities,
        random_bits,
        ascending,
        near_ties,
    )
}


def make(family: str, rng, shape, dtype):
    return np.ascontiguousarray(FAMILIES[family](rng, shape, np.dtype(dtype)))


def edge_lengths(k, n, rows, rng):
    """Lengths around every boundary: negative, 0, 1, k-1, k, k+1, n, beyond n."""
    special = [-5, 0, 1, k - 1, k, k + 1, n, n + 7, np.iinfo(np.int32).max, np.iinfo(np.int32).min]
    lengths = rng.integers(0, n + 1, size=rows)
    lengths[: len(special)] = special[:rows]
    return lengths.astype(np.int32)
