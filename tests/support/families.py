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


def kth_key_at_the_cutoff(rng, rows, n, k, dtype, groups=(300, 1000, 3000, 6000)):
    """Rows whose k-th key is the sample cutoff's own key, so that it sits in the lowest of the
    filtered kernel's relative bins: k - quota values above (in [8, 9)), a tie group of the k-th
    key (1.0; or +0.0 and -0.0 together, a group of two keys the threshold keeps alike) wide
    enough that the sample's cutoff falls inside it, and the rest far below (-1 - |normal|). Row r
    cycles through `groups` (by default 300 to 6000, past the 256 a block ranks member by
    member; 6000 with the values above it goes past the 8192 candidates of shared memory) and
    quotas (1, the middle, the whole group or all k), with and without the signed-zero pair."""
    dtype = np.dtype(dtype)
    out = np.empty((rows, n), np.float32)
    for r in range(rows):
        group = groups[r % len(groups)]
        most = min(group, k)
        quota = (1, most // 2, most)[(r // 4) % 3]
        zeros = (r // 12) % 2 == 1
        row = -1.0 - np.abs(rng.standard_normal(n, dtype=np.float32))
        columns = rng.permutation(n)[: k - quota + group]
        row[columns[: k - quota]] = rng.uniform(8.0, 9.0, size=k - quota)
        tied = columns[k - quota :]
        row[tied] = 1.0
        if zeros:
            row[tied] = np.where(rng.random(group) < 0.5, 0.0, -0.0)
        out[r] = row
    return out.astype(dtype)


def few_keys_over_a_span(rng, rows, n, k, dtype):
    """Rows whose k winners hold few distinct keys spread over a span of keys (counted in the
    row type's own bit patterns, from 1.0 up): the rank-order buckets of sorted results, by key
    - lowest key and by dense key ranks. Row r cycles through (distinct keys, span) pairs,
    both ends of the span always held, and through column layouts: random columns, or the
    winners of one key in adjacent columns (a crowded bucket: the radix sort takes over); the
    rest of the row is below every winner (-1 - |normal|, so that the sample's cutoff keeps a
    band of them and the row takes the usual route)."""
    dtype = np.dtype(dtype)
    width = _bit_width(dtype)
    base = int(np.array(1.0, dtype).view(f"uint{width}"))
    cases = [(2, 3), (2, 2047), (40, 1500), (2048, 2047), (300, 2048), (5, 2049)]
    below = -1.0 - np.abs(rng.standard_normal((rows, n), dtype=np.float32))
    out = np.ascontiguousarray(below.astype(dtype)).view(f"uint{width}")
    for r in range(rows):
        distinct, span = cases[r % len(cases)]
        adjacent = (r // len(cases)) % 2 == 1
        keys = np.concatenate([[0, span], rng.choice(np.arange(1, span), distinct - 2, False)])
        offsets = keys[rng.integers(0, distinct, size=k)]
        offsets[:distinct] = keys  # every key held
        if adjacent:
            offsets = np.sort(offsets)  # each key's winners in a run of columns
            start = int(rng.integers(0, n - k + 1))
            out[r, start : start + k] = base + offsets
        else:
            out[r, rng.choice(n, size=k, replace=False)] = base + offsets
    return from_bits(out, dtype)


def sample_foolers(rng, rows, n):
    """Periodic rows whose residues hold the largest (or the smallest) values, for every
    small period, so that some phase of any regular sample sees only those."""
    out = []
    for period in (2, 3, 4, 8, 16, 32, 64, 128, 256, 1024):
        for residue in (0, period - 1):
            for sign in (10.0, -10.0):
                row = rng.standard_normal(n).astype(np.float32) * 0.01
                row[residue::period] += sign
                out.append(row)
    out = np.stack(out)
    return out[rng.integers(0, len(out), size=rows)]


def one_coarse_bin(rng, rows, n):
    """Every value shares the top 11 bits of its key: the coarse histogram is one bin."""
    bits = 0x3F800000 + rng.integers(0, 1 << 21, size=(rows, n), dtype=np.int64)
    return bits.astype(np.uint32).view(np.float32)


def tied_group_rows(rng, rows, n, k, copies):
    """k - copies // 2 distinct large values, then `copies` equal ones: the k-th value is a group
    of `copies` members of which only the lower half of the columns wins."""
    out = rng.standard_normal((rows, n)).astype(np.float32) * 0.01
    for row in out:
        columns = rng.permutation(n)[: k - copies // 2 + copies]
        row[columns[: k - copies // 2]] = 10.0 + np.arange(k - copies // 2, dtype=np.float32) * 1e-3
        row[columns[k - copies // 2 :]] = 5.0
    return out
