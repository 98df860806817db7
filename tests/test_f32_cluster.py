"""GPU-only: the cluster kernel for few float32 rows of at most 262144 columns
(cuda/kernels/topk_f32_cluster.cu, a thread block cluster a row, which topk_filtered and top_k
take for few rows) against the CPU handler bit for bit: every value family at widths around its
slice sizes and both cluster sizes, ties that cross its blocks, rows that fool a sample, page
tables, num_valid_rows, sorted output (ranked by count and by the block sort) and values. Every
test here forces it on (JAX_TOPK_F32_CLUSTER=only, read at each launch: a call it cannot take
fails)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support import families
from tests.support.families import one_coarse_bin, sample_foolers
from tests.support.operators import gpu_devices, run_op
from tests.test_f32_rows import (
    check_against_the_kernel_off,
    check_page_table_and_num_valid_rows,
    check_top_k_values,
    crowded_rows,
    same_on_both,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not gpu_devices(), reason="no GPU visible to JAX"),
]


@pytest.fixture(autouse=True)
def cluster_kernel_only(monkeypatch):
    """Every call here must take the cluster kernel ("only": one it cannot take fails, so no
    test passes on another kernel's bits); force_parts relaxes that for rows too wide."""
    monkeypatch.setenv("JAX_TOPK_F32_CLUSTER", "only")


def widest_row(parts, dtype="float32"):
    """The widest row `parts` blocks hold: 32 float32 or 24 16-bit keys a thread of 512."""
    return int(parts) * 512 * (32 if dtype == "float32" else 24)


def force_parts(monkeypatch, parts, n, dtype="float32"):
    """Forces the cluster size: a row that size holds must take the cluster kernel, a wider
    one goes to the filtered kernel ("always")."""
    monkeypatch.setenv("JAX_TOPK_F32_CLUSTER_PARTS", str(parts))
    monkeypatch.setenv(
        "JAX_TOPK_F32_CLUSTER", "only" if n <= widest_row(parts, dtype) else "always"
    )


# With 16 blocks a row: slices of 4, 8, 16, 24 and 32 columns a thread, at and past each
# boundary; unaligned widths (not a multiple of 4) among them.
WIDTHS = [5, 2049, 32768, 32771, 65540, 100003, 131072, 152064, 196612, 262144]
# With 8 blocks a row (at most 131072 columns).
WIDTHS_EIGHT = [3, 16384, 16389, 65536, 98311, 131072]


def cross_block_ties(rng, rows, n):
    """The k-th value repeated across every block's slice (a tie quota split between blocks),
    a few larger values scattered, and rows whose ties start only in the last blocks."""
    out = rng.standard_normal((rows, n)).astype(np.float32) * 0.01 - 1.0
    out[0::2, rng.integers(0, n, size=min(n, 1000))] = 0.25
    out[0::2, rng.integers(0, n, size=50)] = 3.0
    out[1::2, n // 2 :] = 0.25
    return out


def check_families(n, k, dtype="float32", rows=6):
    rng = np.random.default_rng(n * 7 + k)
    for family in sorted(families.FAMILIES):
        scores = families.make(family, rng, (rows, n), dtype)
        lengths = rng.integers(-2, n + 3, size=rows).astype(np.int32)
        lengths[:4] = [n, k - 1, k, k + 1]
        for sorted_ in (False, True):
            same_on_both("topk_filtered", scores, lengths, k=k, sorted=sorted_)


@pytest.mark.parametrize("n", WIDTHS)
@pytest.mark.parametrize("k", [1, 2047, 2048])
def test_families(n, k):
    check_families(n, k)


@pytest.mark.parametrize("n", WIDTHS_EIGHT)
@pytest.mark.parametrize("k", [1, 2048])
def test_families_eight_blocks(n, k, monkeypatch):
    force_parts(monkeypatch, 8, n)
    check_families(n, k)


# Cluster sizes between and below 8 and 16 (the host takes 9 to 15 where 16 would leave a second
# wave): every dtype, the widest row each size holds (32 float32 or 24 16-bit keys a thread).
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("parts", [3, 5, 12, 13])
def test_families_any_cluster_size(parts, dtype, monkeypatch):
    widest = widest_row(parts, dtype)
    force_parts(monkeypatch, parts, widest, dtype)
    for n in (4099, widest):
        check_families(n, 2048 if parts > 3 else 777, dtype, rows=4)


@pytest.mark.parametrize("n", [4097, 32768, 152064])
@pytest.mark.parametrize("parts", ["8", "16"])
def test_sample_foolers_and_ties_across_blocks(n, parts, monkeypatch):
    force_parts(monkeypatch, parts, n)
    rng = np.random.default_rng(n)
    for make in (sample_foolers, one_coarse_bin, crowded_rows, cross_block_ties):
        scores = make(rng, 12, n)
        lengths = np.full(12, n, np.int32)
        lengths[1::3] = rng.integers(0, n + 1, size=len(lengths[1::3]))
        for k in (50, 2048):
            for sorted_ in (False, True):
                same_on_both("topk_filtered", scores, lengths, k=k, sorted=sorted_)


def same_at_k_and_below(scores, k, below):
    """Full-length rows equal on both backends at k, both orders, and unsorted at k - below
    (the rank moves inside the k-th key's group)."""
    lengths = np.full(len(scores), scores.shape[1], np.int32)
    for sorted_ in (False, True):
        same_on_both("topk_filtered", scores, lengths, k=k, sorted=sorted_)
    same_on_both("topk_filtered", scores, lengths, k=k - below, sorted=False)


def few_ties_at_the_kth(rng, rows, n, k, ties):
    """k - 8 large distinct values, then `ties` copies of the k-th value spread over the row
    (across every block's slice), everything else far below: the bin of the k-th key holds only
    the ties after the first digit, so the kernel gathers them as candidates (<= 32) or, past 32,
    takes the radix digits; row r also moves the ties by r columns and drops a few large values
    so the quota changes."""
    out = rng.standard_normal((rows, n)).astype(np.float32) * 0.01 - 5.0
    for r in range(rows):
        large = rng.choice(n, size=k - 8 - r % 4, replace=False)
        out[r, large] = 10.0 + np.arange(len(large), dtype=np.float32) * 1e-3
        tie_columns = (np.linspace(0, n - 1, ties).astype(np.int64) + r) % n
        out[r, tie_columns] = 5.0
    return out


@pytest.mark.parametrize("n", [32768, 131072])
@pytest.mark.parametrize("ties", [1, 8, 20, 32, 33, 40])
def test_ties_gathered_as_candidates(n, ties):
    """The candidates route (a bin of at most 32 keys after a digit) and its edge: ties at the
    k-th value split between blocks, taken by column, at 32 candidates and at 33."""
    rng = np.random.default_rng(n + ties)
    k = 2048
    same_at_k_and_below(few_ties_at_the_kth(rng, 4, n, k, ties), k, 4)


def one_super_bin_at_the_kth(rng, rows, n, k, held):
    """The k-th key inside one super-bin of the second digit (keys sharing their top 17 bits)
    that holds `held` keys: 60 keys of the same first-digit bin lie above it (so the first digit
    gathers nothing), k - 60 - rank keys far above, everything else far below. Row r puts the
    k-th at rank 1, the middle, the last of the super-bin, and (row 3) repeats the k-th key three
    times across the row; the super-bin's keys are spread over every block's slice in a random
    order. At most 32 keys there are gathered without the bin exchange, 33 or more take it."""
    base = np.uint32(0x3FC00000)  # 1.5: its first-digit bin is [1.5, 1.75)
    out = np.full((rows, n), -5.0, np.float32)
    for r in range(rows):
        rank = [1, held // 2 + 1, held, max(1, held - 2)][r % 4]
        above_in_bin = (base + (np.arange(1, 61, dtype=np.uint32) << 15)).view(np.float32)
        far_above = 10.0 + np.arange(k - 60 - rank, dtype=np.float32) * 1e-3
        held_keys = (base + np.arange(held, dtype=np.uint32)[::-1] * 256).view(np.float32)
        if r % 4 == 3:  # the k-th key (rank held - 2 from the top) three times
            held_keys = np.concatenate([held_keys, np.repeat(held_keys[rank - 1], 2)])
        held_columns = np.linspace(0, n - 1, len(held_keys)).astype(np.int64)
        rest = np.setdiff1d(np.arange(n), held_columns)
        others = rng.choice(rest, size=len(above_in_bin) + len(far_above), replace=False)
        out[r, rng.permutation(held_columns)] = held_keys
        out[r, others] = np.concatenate([above_in_bin, far_above])
    return out


@pytest.mark.parametrize("n", [32768, 131072])
@pytest.mark.parametrize("held", [1, 2, 30, 31, 32, 33, 40])
def test_kth_in_a_narrow_super_bin(n, held):
    """The second digit's super-bin gathered without its bin exchange (<= 32 keys) and its edge:
    every place of the k-th key in it, a tie of it across blocks, sorted and unsorted, k and
    k - 3 (the rank moves inside the super-bin)."""
    rng = np.random.default_rng(n + held)
    k = 2048
    same_at_k_and_below(one_super_bin_at_the_kth(rng, 4, n, k, held), k, 3)


@pytest.mark.parametrize("k", [10, 24, 25, 26])
def test_first_super_bin_gathered_beside_nan(k):
    """The first digit's super-bin 0 (keys below 2^26: -inf and the most negative floats) holding
    at most 32 keys is gathered at once, and its prefix (0) matches key 0 too: NaN and columns
    past the length must stay out. Rows of NaN but 20 -inf and 5 values of -1e38 spread over
    the blocks, full length and cut past some of them."""
    n = 32768
    rng = np.random.default_rng(k)
    scores = np.full((4, n), np.nan, np.float32)
    for r in range(4):
        columns = rng.choice(n, size=25, replace=False)
        scores[r, columns[:20]] = -np.inf
        scores[r, columns[20:]] = -1e38 * (1 + r)
    lengths = np.array([n, n, n // 2, n - 7], np.int32)
    for sorted_ in (False, True):
        same_on_both("topk_filtered", scores, lengths, k=k, sorted=sorted_)


def small_k_rows(rng, rows, n, k):
    """Rows for small k on long slices (a few keys matching each digit, gathered as candidates;
    most threads with no winner): row 0 puts k + 3 large values in the middle block alone; row 1
    holds k keys of 2.0 (the lowest key of its first-digit bin) in block 0 and everything else one
    ulp below 2.0 (the bin under it); row 2 is constant; row 3 is -inf but for k - 1 values (the
    k-th key -inf); row 4 holds k copies of 1.0 at the start of every block's slice and ones just
    below in between (ties across blocks); row 5 is random bits."""
    out = rng.standard_normal((rows, n)).astype(np.float32) * 0.01 - 1.0
    slice_ = (n + 63) // 64 * 4  # a block's slice with 16 blocks a row
    middle = 7 * slice_
    out[0, middle : middle + k + 3] = 5.0 + np.arange(k + 3, dtype=np.float32)
    out[1] = np.nextafter(np.float32(2.0), np.float32(0.0))
    out[1, rng.choice(min(n, slice_), size=min(k, n, slice_), replace=False)] = 2.0
    out[2] = 0.75
    out[3] = -np.inf
    out[3, rng.choice(n, size=k - 1, replace=False)] = rng.standard_normal(k - 1)
    out[4] = np.nextafter(np.float32(1.0), np.float32(0.0))
    for block in range(16):
        start = block * slice_
        out[4, start : start + min(k, max(0, n - start))] = 1.0
    out[5] = rng.integers(0, 2**32, size=n, dtype=np.uint64).astype(np.uint32).view(np.float32)
    return out


@pytest.mark.parametrize("n", [32771, 65540, 152064, 262144])
@pytest.mark.parametrize("k", [1, 50, 256, 257])
def test_small_k_on_long_slices(n, k):
    """Every value family and the rows above at 8 to 32 keys a thread, with lengths that leave
    some blocks fewer than k real keys (or none)."""
    rng = np.random.default_rng(n + k)
    rows = 6
    for scores in (
        small_k_rows(rng, rows, n, k),
        *(families.make(family, rng, (rows, n), "float32") for family in sorted(families.FAMILIES)),
    ):
        lengths = np.full(rows, n, np.int32)
        lengths[1::3] = [k + 1, n // 3][: len(lengths[1::3])]
        for sorted_ in (False, True):
            same_on_both("topk_filtered", scores, lengths, k=k, sorted=sorted_)
        same_on_both("topk_filtered", scores, np.full(rows, n, np.int32), k=k, sorted=False)


@pytest.mark.parametrize("dtype, n", [("float32", 262148), ("bfloat16", 196616)])
def test_only_fails_a_call_it_cannot_take(dtype, n):
    """The switch the tests rely on: a row wider than the kernel holds is refused, not served
    by another kernel."""
    scores = np.zeros((2, n), dtype)
    with pytest.raises(Exception, match="launch failed"):
        run_op("topk_filtered", "gpu", scores, np.full(2, n, np.int32), k=8)


@pytest.mark.parametrize("rows", [1, 4, 8, 9, 17, 133])
def test_same_bits_as_the_kernels_it_replaces(rows, monkeypatch):
    """Row counts past one wave of clusters too."""
    check_against_the_kernel_off("JAX_TOPK_F32_CLUSTER", rows, 131072, monkeypatch)


def test_page_table_and_num_valid_rows():
    check_page_table_and_num_valid_rows(65536)


@pytest.mark.parametrize("family", ["normal", "heavy_ties", "signed_zeros", "denormals", "nan_mix"])
@pytest.mark.parametrize("shape, k", [((1, 152064), 50), ((4, 30000), 2048)])
def test_top_k_values(family, shape, k):
    check_top_k_values(family, shape, k)
