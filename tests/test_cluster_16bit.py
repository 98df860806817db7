"""GPU-only: the cluster kernel (cuda/kernels/topk_f32_cluster.cu) on bfloat16 and float16 rows of
at most 196608 columns, read at two bytes and widened exactly to float32 keys, against the CPU
handler bit for bit: every value family of each dtype (its own subnormals, signed zeros, NaN,
ties) at widths around its slice sizes (8 to 24 keys a thread) and both cluster sizes, unaligned
rows, ties across its blocks, rows that fool a sample, page tables, num_valid_rows, sorted output
and top_k's 16-bit values; and the same bits as the filtered kernel that served these rows before.
Every test here forces it on (JAX_TOPK_F32_CLUSTER=only, read at each launch: a call it cannot
take fails); widths past its 16-bit limit go to the filtered kernel ("always")."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import jax_topk
from tests.support import families
from tests.support.families import one_coarse_bin, sample_foolers
from tests.support.operators import gpu_devices, run_op
from tests.test_f32_cluster import (
    check_families,
    cross_block_ties,
    few_ties_at_the_kth,
    force_parts,
    small_k_rows,
)
from tests.test_f32_rows import check_page_table_and_num_valid_rows, crowded_rows, same_on_both

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not gpu_devices(), reason="no GPU visible to JAX"),
]

DTYPES = ["bfloat16", "float16"]
# With 16 blocks a row: 8, 16 and 24 keys a thread at and past each boundary (16-bit slices are
# whole 8-column chunks), unaligned widths among them, the 16-bit limit (196608) and past it.
WIDTHS = [5, 2049, 16384, 16391, 65536, 65544, 100003, 131072, 152064, 196608, 196616]
# With 8 blocks a row (at most 98304 16-bit columns).
WIDTHS_EIGHT = [3, 16389, 32768, 65536, 98304, 98312]


@pytest.fixture(autouse=True)
def cluster_kernel_only(monkeypatch):
    monkeypatch.setenv("JAX_TOPK_F32_CLUSTER", "only")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", WIDTHS)
@pytest.mark.parametrize("k", [1, 2048])
def test_families(n, k, dtype, monkeypatch):
    force_parts(monkeypatch, 16, n, dtype)
    check_families(n, k, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", WIDTHS_EIGHT)
def test_families_eight_blocks(n, dtype, monkeypatch):
    force_parts(monkeypatch, 8, n, dtype)
    check_families(n, 2047, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [4097, 32768, 152064])
@pytest.mark.parametrize("parts", ["8", "16"])
def test_sample_foolers_and_ties_across_blocks(n, parts, dtype, monkeypatch):
    """float32 adversarial rows rounded to 16 bits: their ties only grow (many values collapse
    onto one 16-bit value), across the blocks' slices."""
    force_parts(monkeypatch, parts, n, dtype)
    rng = np.random.default_rng(n)
    for make in (sample_foolers, one_coarse_bin, crowded_rows, cross_block_ties):
        scores = make(rng, 12, n).astype(dtype)
        lengths = np.full(12, n, np.int32)
        lengths[1::3] = rng.integers(0, n + 1, size=len(lengths[1::3]))
        for k in (50, 2048):
            for sorted_ in (False, True):
                same_on_both("topk_filtered", scores, lengths, k=k, sorted=sorted_)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ties", [8, 32, 33])
def test_ties_gathered_as_candidates(ties, dtype):
    """Few ties at the k-th value (the candidates route at and past 32), spread over the blocks."""
    rng = np.random.default_rng(ties)
    n, k = 131072, 2048
    scores = few_ties_at_the_kth(rng, 4, n, k, ties).astype(dtype)
    lengths = np.full(4, n, np.int32)
    for sorted_ in (False, True):
        same_on_both("topk_filtered", scores, lengths, k=k, sorted=sorted_)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [32776, 152064])
@pytest.mark.parametrize("k", [1, 50, 257])
def test_small_k_on_long_slices(n, k, dtype):
    rng = np.random.default_rng(n + k)
    rows = 6
    scores = small_k_rows(rng, rows, n, k).astype(dtype)
    lengths = np.full(rows, n, np.int32)
    lengths[1::3] = [k + 1, n // 3]
    for sorted_ in (False, True):
        same_on_both("topk_filtered", scores, lengths, k=k, sorted=sorted_)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 4, 9, 17])
def test_same_bits_as_the_filtered_kernel(rows, dtype, monkeypatch):
    """Row counts past one wave of clusters too."""
    rng = np.random.default_rng(rows)
    n = 131072
    scores = rng.standard_normal((rows, n)).astype(dtype)
    lengths = rng.integers(0, n + 1, size=rows).astype(np.int32)
    for k, sorted_ in ((2048, False), (2048, True), (50, True), (257, True)):
        mine = same_on_both("topk_filtered", scores, lengths, k=k, sorted=sorted_)
        monkeypatch.setenv("JAX_TOPK_F32_CLUSTER", "off")
        theirs = run_op("topk_filtered", "gpu", scores, lengths, k=k, sorted=sorted_)
        monkeypatch.setenv("JAX_TOPK_F32_CLUSTER", "only")
        np.testing.assert_array_equal(mine, theirs)


@pytest.mark.parametrize("dtype", DTYPES)
def test_page_table_and_num_valid_rows(dtype):
    check_page_table_and_num_valid_rows(65536, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", ["normal", "heavy_ties", "signed_zeros", "denormals", "nan_mix"])
@pytest.mark.parametrize("shape, k", [((1, 152064), 50), ((4, 30000), 2048)])
def test_top_k_values(family, shape, k, dtype):
    """top_k's 16-bit values beside its indices (the widened winners narrowed back), sorted and
    not, with lengths."""
    rng = np.random.default_rng(5)
    operand = families.make(family, rng, shape, dtype)
    lengths = rng.integers(0, shape[1] + 1, size=shape[0]).astype(np.int32)
    gpu, cpu = jax.devices("gpu")[0], jax.devices("cpu")[0]
    for sorted_ in (True, False):
        call = jax.jit(lambda x, lens, s=sorted_: jax_topk.top_k(x, k, lengths=lens, sorted=s))
        got = call(*jax.device_put((operand, lengths), gpu))
        want = call(*jax.device_put((operand, lengths), cpu))
        for a, b in zip(got, want, strict=True):
            a, b = np.asarray(a), np.asarray(b)
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(a.view(f"u{a.itemsize}"), b.view(f"u{b.itemsize}"))
