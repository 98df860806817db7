"""GPU-only stress: the CUDA kernels against the CPU handler, bit for bit, on many rows of
every value family, on rows built to fool topk_filtered's sample, and across its routes
(KV-split and single-block, repeated calls, CUDA-graph replay). Skipped without a GPU."""

from __future__ import annotations

import functools
import os

import jax
import numpy as np
import pytest

import jax_topk
from jax_topk import _top_k
from tests.support import families
from tests.support.operators import device_for, gpu_devices, run_op
from tests.support.processes import run_python

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not gpu_devices(), reason="no GPU visible to JAX"),
]


SIXTEEN_BIT = ("bfloat16", "float16")


def assert_same_on_both(op, scores, lengths, **kwargs):
    gpu = run_op(op, "gpu", scores, lengths, **kwargs)
    cpu = run_op(op, "cpu", scores, lengths, **kwargs)
    np.testing.assert_array_equal(gpu, cpu)
    return gpu


@pytest.mark.parametrize("k", [1, 512, 2048])
@pytest.mark.parametrize("n", [1, 7, 513, 4097, 8191, 12345, 16384])
def test_bf16_families(n, k):
    rng = np.random.default_rng(n * 13 + k)
    for family in sorted(families.FAMILIES):
        scores = families.make(family, rng, (200, n), "bfloat16")
        lengths = rng.integers(-2, n + 3, size=200).astype(np.int32)
        lengths[:4] = [n, k - 1, k, k + 1]
        for sorted_ in (False, True):
            assert_same_on_both("topk_bf16", scores, lengths, k=k, sorted=sorted_)


@pytest.mark.parametrize(
    "n, page_size",
    # Page-table entries a row: none, 193, 512, 513 and 1024 (the experiment of benches/NOTES.md
    # "topk_bf16: loads before the length, page tables in shared memory" staged <= 512).
    [(16384, None), (12345, 64), (16384, 32), (4097, 8), (16384, 16), (513, 1)],
)
def test_bf16_few_rows_with_page_tables(n, page_size):
    """topk_bf16 on launches of 110 and 133 rows (one block a row; 110 holds every value family
    and fewer rows than an H100/H200 has SMs, 133 more) against the CPU: lengths at 0, 1,
    k - 1, k, k + 1 (k = 64, 512, 2048), n and past it, and ones that keep the slice size the
    width gives a thread or change it (n = 16384, 12345; n = 4097 changes only, 513 keeps only),
    page tables of 193 to 1024 entries a row with unmapped pages, table rows clamped, both
    orders; on unpaged rows top_k's values bit for bit."""
    rng = np.random.default_rng(n + (page_size or 0))
    for rows in (110, 133):
        scores = short_rows_of_every_family(rng, rows, n, "bfloat16")
        lengths = families.edge_lengths(512, n, rows, rng)
        lengths[12:22] = [n - 1, n - 300, n // 2 + 1, 7, 63, 64, 65, 2047, 2048, 2049]
        paging = {}
        if page_size is not None:
            pages = -(-n // page_size)
            table = np.stack([rng.permutation(4 * pages)[:pages] for _ in range(7)])
            table[:, 3] = -1  # unmapped
            table_rows = rng.integers(-3, 10, size=rows).astype(np.int32)  # clamped into 0..6
            paging = dict(
                page_table=table.astype(np.int32), page_size=page_size, table_rows=table_rows
            )
        for k, sorted_ in ((512, False), (512, True), (2048, True), (64, False)):
            assert_same_on_both("topk_bf16", scores, lengths, k=k, sorted=sorted_, **paging)
        if page_size is None:
            assert_top_k_same_bits(scores, 512, lengths, True)


def winners_spanning(rng, rows, n, k, spans, dtype):
    """16-bit rows whose k winners' ordered keys span exactly `span` + 1 consecutive keys (its
    row's), with ties across the span, at its ends and at the k-th key (more copies of the
    lowest winner key than the quota takes), over positive values below them: the sorted
    short-row kernel's counting rank (span < 1024) and its radix sort (span >= 1024)."""
    base = 0x3F80 if dtype == "bfloat16" else 0x3C00  # 1.0
    out = rng.integers(base - 0x0800, base, size=(rows, n)).astype(np.uint16)
    for r in range(rows):
        span = spans[r % len(spans)]
        columns = rng.permutation(n)[: k + 8]
        bits = base + rng.integers(0, span + 1, size=k + 8)
        bits[:2] = [base, base + span]
        bits[-8:] = base  # ties at the k-th key: its quota cut by column
        out[r, columns] = bits.astype(np.uint16)
    return out.view(np.dtype(dtype))


@pytest.mark.parametrize("sort_mode", ["default", "radix"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_sorted_short_rows_by_key_span(dtype, sort_mode, monkeypatch):
    """Sorted topk_bf16 (page-transformed) and top_k (values) on rows whose winners span 1-1101
    keys, against the CPU, bit for bit; also with every row radix-sorted
    (JAX_TOPK_BF16_SORT=radix, read at each launch)."""
    if sort_mode == "radix":
        monkeypatch.setenv("JAX_TOPK_BF16_SORT", "radix")
    rng = np.random.default_rng(5 if dtype == "bfloat16" else 6)
    spans = [0, 1, 2, 511, 1022, 1023, 1024, 1025, 1100]
    n, k = 9000, 512
    scores = winners_spanning(rng, 4 * len(spans), n, k, spans, dtype)
    lengths = np.full(len(scores), n, np.int32)
    lengths[1::5] = rng.integers(k - 3, n, size=len(lengths[1::5]))
    if dtype == "bfloat16":
        pages = -(-n // 64)
        table = np.stack([rng.permutation(pages) for _ in scores]).astype(np.int32)
        for k_ in (k, 300):
            assert_same_on_both(
                "topk_bf16", scores, lengths, k=k_, sorted=True, page_table=table, page_size=64
            )
    assert_top_k_same_bits(scores, k, None, True)


@pytest.mark.parametrize("argmax_mode", ["default", "always", "off"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize(
    "rows, n",
    [(300, 4097), (300, 4096), (40, 16384), (270, 40000), (4, 70001), (2, 1)],
)
def test_k1_rows(rows, n, dtype, argmax_mode, monkeypatch):
    """k = 1 (topk_argmax where TopkArgmaxServes: rows of <= 16384 columns, or at least 128
    float32 rows; on every k = 1 call with JAX_TOPK_ARGMAX=always, none with =off) against the
    CPU, bit for bit: every value family, lengths below 0, 0, 1 and past n, rows past
    num_valid_rows, page tables, rows that start off a 16-byte boundary (odd n), topk_filtered,
    topk_bf16 and top_k's values."""
    if argmax_mode != "default":
        monkeypatch.setenv("JAX_TOPK_ARGMAX", argmax_mode)
    rng = np.random.default_rng(rows * 7 + n + len(dtype))
    names = sorted(families.FAMILIES)
    scores = np.concatenate(
        [families.make(name, rng, (rows // len(names) + 1, n), dtype) for name in names]
    )[rng.permutation(rows)]
    lengths = families.edge_lengths(1, n, rows, rng)
    lengths[-1] = n
    ops = ["topk_filtered"] + (["topk_bf16"] if dtype == "bfloat16" and n <= 16384 else [])
    for op in ops:
        assert_same_on_both(op, scores, lengths, k=1)
        assert_same_on_both(op, scores, lengths, k=1, num_valid_rows=np.int32(rows // 2))
        if n >= 64:
            pages = -(-n // 64)
            table = np.stack([rng.permutation(pages) for _ in range(rows)]).astype(np.int32)
            assert_same_on_both(op, scores, lengths, k=1, page_table=table, page_size=64)
    assert_top_k_same_bits(scores, 1, lengths, True)


@pytest.mark.parametrize("route", ["default", "own"])
@pytest.mark.parametrize("dtype", SIXTEEN_BIT)
@pytest.mark.parametrize("rows, n", [(40, 7), (40, 4097), (300, 8192), (6, 12345), (132, 16384)])
def test_filtered_short_16bit_rows(rows, n, dtype, route, monkeypatch):
    """topk_filtered's 16-bit rows of at most 16384 columns, which it hands to topk_bf16's kernel
    (route "default") or keeps on its own (JAX_TOPK_SHORT_16BIT=own, read at each launch: the
    cluster for few rows, the register block for many short ones, else the queue), against the
    CPU bit for bit: every value family, lengths around k, k past n, both orders, page tables
    and num_valid_rows."""
    if route == "own":
        monkeypatch.setenv("JAX_TOPK_SHORT_16BIT", "own")
    rng = np.random.default_rng(rows + n + len(dtype))
    names = sorted(families.FAMILIES)
    scores = np.concatenate(
        [families.make(name, rng, (rows // len(names) + 1, n), dtype) for name in names]
    )[rng.permutation(rows)]
    lengths = families.edge_lengths(512, n, rows, rng)
    for k, sorted_ in ((512, False), (512, True), (2048, True), (64, True)):
        assert_same_on_both("topk_filtered", scores, lengths, k=k, sorted=sorted_)
    out = assert_same_on_both(
        "topk_filtered", scores, lengths, k=2048, num_valid_rows=np.int32(rows // 2)
    )
    assert (out[rows // 2 :] == -1).all()
    if n >= 64:
        table = np.stack([rng.permutation(-(-n // 64)) for _ in range(rows)]).astype(np.int32)
        assert_same_on_both("topk_filtered", scores, lengths, k=300, page_table=table, page_size=64)


def short_rows_of_every_family(rng, rows, n, dtype):
    """`rows` rows of n of every value family, shuffled; row 1 one repeated key (the whole row
    ties) and row 2 +0 and -0 only."""
    names = sorted(families.FAMILIES)
    scores = np.concatenate(
        [families.make(name, rng, (rows // len(names) + 1, n), dtype) for name in names]
    )[rng.permutation(rows)]
    scores[1] = np.array(0.25, dtype)
    scores[2] = np.where(rng.random(n) < 0.5, 0.0, -0.0).astype(dtype)
    return scores


@pytest.mark.parametrize("mode", ["default", "digits"])
@pytest.mark.parametrize("dtype", ("float32",) + SIXTEEN_BIT)
@pytest.mark.parametrize("n", [1, 7, 33, 256, 257, 513, 1000, 1024])
def test_small_rows_by_digits(n, dtype, mode, monkeypatch):
    """top_k's warp-a-row kernel (rows of <= 1024 columns, k <= 64; 1024 rows, which top_k's
    route gives it past 32 winners): k past 32 (16-bit: 24) takes the k-th key by 8-bit
    digits, and JAX_TOPK_SMALL_ROWS=digits (read at each launch) sends every k there; values
    and indices against the CPU bit for bit, every value family, lengths around k and the
    row's end, both orders. Rows of one repeated key, keys that share all but their last
    digit, and k-th keys tied across lanes reach each digit's early stop and the quota."""
    if mode == "digits":
        monkeypatch.setenv("JAX_TOPK_SMALL_ROWS", "digits")
    rng = np.random.default_rng(n * 3 + len(dtype) + len(mode))
    rows = 1024
    assert _top_k.route(np.dtype(dtype), n, min(64, n), rows) is _top_k.Route.SMALL_ROWS
    scores = short_rows_of_every_family(rng, rows, n, dtype)
    bits = np.dtype(f"u{np.dtype(dtype).itemsize}")
    # Keys one digit apart from the top: a block of values differing only in the lowest bits.
    base = np.array(1.5, dtype).view(bits)
    scores[0] = (base + rng.integers(0, 4, size=n).astype(bits)).view(dtype)
    ks = (1, 8, 32, 33, 50, 64) if mode == "digits" else (28, 33, 50, 63, 64)
    for k in sorted({min(k, n) for k in ks}):  # k = n where the row is shorter
        lengths = families.edge_lengths(k, n, rows, rng)
        for sorted_ in (True, False):
            assert_top_k_same_bits(scores, k, lengths, sorted_, err_msg=f"k={k}")
        assert_top_k_same_bits(scores, k, None, True, err_msg=f"k={k} no lengths")


@pytest.mark.parametrize("mode", ["default", "warp"])
@pytest.mark.parametrize("dtype", ("float32",) + SIXTEEN_BIT)
@pytest.mark.parametrize("n", [1, 7, 100, 128, 129, 255, 256])
def test_small_rows_two_a_warp(n, dtype, mode, monkeypatch):
    """top_k without lengths on 16-bit rows of <= 256 columns at k <= 16 runs two rows a warp
    (half a warp each; JAX_TOPK_SMALL_ROWS=warp keeps a warp a row): values and indices against
    the CPU bit for bit over every value family, both orders, an odd row count (the last warp
    holds one row, the last block fewer than eight) and rows of one repeated key or of +-0."""
    if mode == "warp":
        monkeypatch.setenv("JAX_TOPK_SMALL_ROWS", "warp")
    rng = np.random.default_rng(n * 5 + len(dtype) + len(mode))
    rows = 1021
    assert _top_k.route(np.dtype(dtype), n, min(16, n), rows) is _top_k.Route.SMALL_ROWS
    scores = short_rows_of_every_family(rng, rows, n, dtype)
    for k in sorted({min(k, n) for k in (1, 2, 8, 9, 16)}):
        for sorted_ in (True, False):
            assert_top_k_same_bits(scores, k, None, sorted_, err_msg=f"k={k}")


@pytest.mark.parametrize("k", [1, 512, 2048])
@pytest.mark.parametrize("n", [1, 3, 2047, 4097, 65537, 131072, 262147])
def test_filtered_families_and_foolers(n, k):
    rng = np.random.default_rng(n * 17 + k)
    rows = 24 if n > 100_000 else 64
    for family in sorted(families.FAMILIES):
        scores = families.make(family, rng, (rows, n), "float32")
        lengths = rng.integers(-2, n + 3, size=rows).astype(np.int32)
        lengths[:3] = [n, k, k + 1]
        assert_same_on_both("topk_filtered", scores, lengths, k=k)
    for make in (families.sample_foolers, families.one_coarse_bin):
        scores = make(rng, rows, n)
        lengths = np.full(rows, n, np.int32)
        lengths[1::3] = rng.integers(0, n + 1, size=len(lengths[1::3]))
        for sorted_ in (False, True):
            assert_same_on_both("topk_filtered", scores, lengths, k=k, sorted=sorted_)


@pytest.mark.parametrize("n", [300_001, 1_048_576])
def test_filtered_long_constant_rows(n):
    """All-equal rows longer than any candidate buffer: the lowest k columns."""
    scores = np.full((3, n), 1.5, np.float32)
    lengths = np.array([n, n - 1, 5000], np.int32)
    out = assert_same_on_both("topk_filtered", scores, lengths, k=2048)
    np.testing.assert_array_equal(out[0], np.arange(2048))


def test_filtered_split_and_single_block_agree():
    """A row alone (few rows: several blocks share it) and the same row among many
    (one block per row) give the same bits."""
    rng = np.random.default_rng(40)
    n = 200_000
    foolers = families.sample_foolers(rng, 2, n)
    few = np.concatenate([foolers, rng.standard_normal((2, n), np.float32)])
    many = np.concatenate([few, rng.standard_normal((600, n), np.float32)])
    lengths_many = np.full(len(many), n, np.int32)
    alone = assert_same_on_both("topk_filtered", few, lengths_many[:4], k=2048)
    together = run_op("topk_filtered", "gpu", many, lengths_many, k=2048)
    np.testing.assert_array_equal(together[:4], alone)


def test_filtered_repeated_calls_and_changing_num_valid_rows():
    rng = np.random.default_rng(41)
    scores = rng.standard_normal((40, 70_000)).astype(np.float32)
    lengths = rng.integers(0, 70_001, size=40).astype(np.int32)
    for valid in (40, 3, 0, 17, 40, -1, 100):
        assert_same_on_both("topk_filtered", scores, lengths, k=512, num_valid_rows=np.int32(valid))


def test_cuda_graph_replay():
    """Under XLA command buffers (CUDA graphs), replays with a changing num_valid_rows."""
    flags = os.environ.get("XLA_FLAGS", "")
    flags += " --xla_gpu_enable_command_buffer=+CUSTOM_CALL --xla_gpu_graph_min_graph_size=1"
    assert "graph replay: ok" in run_python("-m", "tests.checks.graph_replay", XLA_FLAGS=flags)


@pytest.mark.parametrize("copies", [2, 32, 33])
@pytest.mark.parametrize("rows", [4, 300])
def test_filtered_tied_boundary_groups(rows, copies):
    """The boundary bin of topk_filtered's relative histogram holds a group of equal keys: one
    warp ranks up to 32 members (with a tie quota), more take the digit selection; whole rows
    (300 rows) and split rows (4 rows)."""
    rng = np.random.default_rng(rows * 100 + copies)
    scores = families.tied_group_rows(rng, rows, 131072, 2048, copies)
    lengths = np.full(rows, 131072, np.int32)
    for sorted_ in (False, True):
        assert_same_on_both("topk_filtered", scores, lengths, k=2048, sorted=sorted_)


@pytest.mark.parametrize("rows", [4, 300])
def test_filtered_candidates_past_shared_memory(rows):
    """More candidates than the 8192 kept in shared memory (8000 equal values near the cutoff):
    the selection reads the rest from the worker's slice."""
    rng = np.random.default_rng(50 + rows)
    n = 65536
    scores = rng.standard_normal((rows, n)).astype(np.float32) * 0.01
    for row in scores:
        columns = rng.permutation(n)
        row[columns[:600]] = 10.0 + np.arange(600, dtype=np.float32) * 1e-3
        row[columns[600:8600]] = 1.0
    lengths = np.full(rows, n, np.int32)
    for sorted_ in (False, True):
        assert_same_on_both("topk_filtered", scores, lengths, k=512, sorted=sorted_)
    constant = np.full((rows, 12000), 1.0, np.float32)
    assert_same_on_both(
        "topk_filtered", constant, np.full(rows, 12000, np.int32), k=2048, sorted=True
    )


def test_filtered_whole_rows_of_every_family():
    """Enough rows that every block takes whole rows (the persistent queue, more rows than its
    workers: passes read staged, PassReads::kStaged), for the value families and the sample
    foolers, random lengths, both orders."""
    rng = np.random.default_rng(52)
    for family in ("heavy_ties", "all_neg_inf", "signed_zeros", "nan_mix", "near_ties"):
        scores = families.make(family, rng, (300, 40_000), "float32")
        lengths = rng.integers(-2, 40_003, size=300).astype(np.int32)
        for sorted_ in (False, True):
            assert_same_on_both("topk_filtered", scores, lengths, k=2048, sorted=sorted_)
    scores = families.sample_foolers(rng, 300, 65536)
    lengths = rng.integers(0, 65537, size=300).astype(np.int32)
    for sorted_ in (False, True):
        assert_same_on_both("topk_filtered", scores, lengths, k=2048, sorted=sorted_)


def test_filtered_whole_rows_with_masked_rows():
    rng = np.random.default_rng(53)
    scores = rng.standard_normal((300, 20_000)).astype(np.float32)
    lengths = rng.integers(0, 20_001, size=300).astype(np.int32)
    for valid in (137, 0, 300):
        out = assert_same_on_both(
            "topk_filtered", scores, lengths, k=512, num_valid_rows=np.int32(valid)
        )
        assert (out[max(valid, 0) :] == -1).all()


# A queue launch with a block for every row (rows <= the pool of 2 x SMs: 200 on an H200, and
# few rows kept off the cluster split by JAX_TOPK_FILTERED_SPLIT=off, read at each launch) takes
# row b in block b with no counter: every family, masked rows, each dtype, top_k's values (200
# rows: more than the SMs, so the passes read without L2 prefetches, PassReads::kPlain). Few
# float32 rows are kept off their own kernels (topk_f32_cluster, topk_f32_rows) too.
@pytest.mark.parametrize("rows, split", [(200, "on"), (5, "off"), (1, "off")])
def test_filtered_a_block_a_row(rows, split, monkeypatch):
    monkeypatch.setenv("JAX_TOPK_FILTERED_SPLIT", split)
    monkeypatch.setenv("JAX_TOPK_F32_CLUSTER", "off")
    monkeypatch.setenv("JAX_TOPK_F32_ROWS", "off")
    rng = np.random.default_rng(56 + rows)
    n = 20_011
    for dtype in ("float32", "bfloat16", "float16"):
        for family in sorted(families.FAMILIES):
            scores = families.make(family, rng, (rows, n), dtype)
            lengths = rng.integers(-2, n + 3, size=rows).astype(np.int32)
            for sorted_ in (False, True):
                assert_same_on_both("topk_filtered", scores, lengths, k=2048, sorted=sorted_)
        operand = families.make("normal", rng, (rows, n), dtype)
        lengths = rng.integers(0, n + 1, size=rows).astype(np.int32)
        assert_top_k_same_bits(operand, 50, lengths, True)
    scores = rng.standard_normal((rows, n)).astype(np.float32)
    lengths = rng.integers(0, n + 1, size=rows).astype(np.int32)
    out = assert_same_on_both(
        "topk_filtered", scores, lengths, k=512, num_valid_rows=np.int32(rows // 2)
    )
    assert (out[rows // 2 :] == -1).all()


# On an H200 (132 SMs) 6 x 100003 runs one block an SM (up to 192 KB of scores an SM), and
# 40 x 200003 two blocks an SM.
@pytest.mark.parametrize("rows, n", [(6, 100_003), (40, 200_003)])
def test_filtered_split_rows_of_every_family(rows, n):
    """Few rows (a block cluster a row) of every value family and random lengths, both orders:
    rows the cluster settles, rows merged into its first block, rows done whole there; split
    launches of one block an SM and of two."""
    rng = np.random.default_rng(54 + rows)
    for family in ("heavy_ties", "all_neg_inf", "signed_zeros", "nan_mix", "near_ties"):
        scores = families.make(family, rng, (rows, n), "float32")
        lengths = rng.integers(-2, n + 3, size=rows).astype(np.int32)
        lengths[:2] = n
        for sorted_ in (False, True):
            assert_same_on_both("topk_filtered", scores, lengths, k=2048, sorted=sorted_)


def test_filtered_split_parts_past_the_bitmap():
    """Split rows whose parts are wider than the bitmap's 262144 columns: the parts gather and
    sort their winners instead (a normal row, and one of coarse ties)."""
    rng = np.random.default_rng(55)
    n = 16 * 262144 + 1000
    scores = rng.standard_normal((2, n)).astype(np.float32)
    scores[1] = np.round(scores[1] * 64) / 64
    assert_same_on_both("topk_filtered", scores, np.full(2, n, np.int32), k=2048)


# 16-bit rows in topk_filtered: read at two bytes an element, so a row of width n starts at a
# 16-byte boundary only when n % 8 == 0; the widths below cover every n % 8, with rows of the
# single-block, split and exact routes, sample foolers and long runs of ties.


def as_dtype(scores, dtype):
    return np.ascontiguousarray(scores.astype(dtype))


@pytest.mark.parametrize("dtype", SIXTEEN_BIT)
@pytest.mark.parametrize("k", [1, 2048])
@pytest.mark.parametrize("n", [40000 + r for r in range(8)] + [131072, 262147])
def test_filtered_16bit_families_foolers_and_alignments(dtype, n, k):
    rng = np.random.default_rng(n * 19 + k + len(dtype))
    rows = 12 if n > 100_000 else 20
    for family in sorted(families.FAMILIES):
        scores = families.make(family, rng, (rows, n), dtype)
        lengths = rng.integers(-2, n + 3, size=rows).astype(np.int32)
        lengths[:3] = [n, k, k + 1]
        for sorted_ in (False, True):
            assert_same_on_both("topk_filtered", scores, lengths, k=k, sorted=sorted_)
    # Narrowed, the foolers are full of ties.
    for make in (families.sample_foolers, families.one_coarse_bin):
        scores = as_dtype(make(rng, rows, n), dtype)
        lengths = np.full(rows, n, np.int32)
        lengths[1::3] = rng.integers(0, n + 1, size=len(lengths[1::3]))
        for sorted_ in (False, True):
            assert_same_on_both("topk_filtered", scores, lengths, k=k, sorted=sorted_)


@pytest.mark.parametrize("dtype", SIXTEEN_BIT)
@pytest.mark.parametrize("n", [300_001, 1_048_573])
def test_filtered_16bit_long_constant_rows(dtype, n):
    scores = np.full((3, n), 1.5, dtype)
    lengths = np.array([n, n - 1, 5000], np.int32)
    out = assert_same_on_both("topk_filtered", scores, lengths, k=2048)
    np.testing.assert_array_equal(out[0], np.arange(2048))


@functools.cache
def _jitted_top_k(k, sorted_):
    return jax.jit(lambda x, lens: jax_topk.top_k(x, k, lengths=lens, sorted=sorted_))


def top_k_on(backend, operand, k, lengths, sorted_):
    device = device_for(backend)
    operand, lengths = jax.device_put(operand, device), jax.device_put(lengths, device)
    out = _jitted_top_k(k, sorted_)(operand, lengths)
    return tuple(np.asarray(o) for o in out)


def assert_top_k_same_bits(operand, k, lengths, sorted_, err_msg=""):
    """top_k on the GPU equals the CPU handler: indices, and values bit for bit (-0, -inf)."""
    gpu = top_k_on("gpu", operand, k, lengths, sorted_)
    cpu = top_k_on("cpu", operand, k, lengths, sorted_)
    for got, want in zip(gpu, cpu, strict=True):
        bits = f"u{got.itemsize}"
        np.testing.assert_array_equal(got.view(bits), want.view(bits), err_msg=err_msg)


# k <= 64 of at most 4096 kept candidates takes warps' sorted lists (few_winners.cuh), not the
# radix route: every family (ascending rows make each batch rise above its warp's list; ties and
# near-ties keep too many and take the radix route), each 16-bit type, lengths at k's edges and at
# the route's 4096 (rows of at most 8192 columns are kept whole: 4096 of a NaN-free row take the
# lists, 4097 the radix route), both orders and top_k's values. 300 rows are a queue of more rows
# than workers; 3 rows of 40003 a cluster each for their full rows, merged into part 0 (few float32
# rows kept off topk_f32_cluster), beside one short row.
@pytest.mark.parametrize("rows, n", [(300, 20_011), (3, 40_003)])
@pytest.mark.parametrize("k", [2, 50, 64, 65])
def test_filtered_few_winners(rows, n, k, monkeypatch):
    monkeypatch.setenv("JAX_TOPK_F32_CLUSTER", "off")
    rng = np.random.default_rng(58 + rows + k)
    edges = [k - 1, k, k + 1, 4096, 4097, 8192, 0, -5]
    for dtype in ("float32",) + SIXTEEN_BIT:
        for number, family in enumerate(sorted(families.FAMILIES)):
            scores = families.make(family, rng, (rows, n), dtype)
            if rows > len(edges):
                lengths = families.edge_lengths(k, n, rows, rng)
                lengths[-len(edges) :] = edges
            else:  # full rows but one, whose length goes round the edges
                lengths = np.full(rows, n, np.int32)
                lengths[-1] = edges[number % len(edges)]
            for sorted_ in (False, True):
                assert_same_on_both("topk_filtered", scores, lengths, k=k, sorted=sorted_)
            assert_top_k_same_bits(scores, k, lengths, True, err_msg=f"{dtype} {family}")


@pytest.mark.parametrize("dtype", ("float32",) + SIXTEEN_BIT)
@pytest.mark.parametrize("rows", [2, 100])  # split rows, then a queue of whole rows
def test_filtered_values_match_cpu_bits(dtype, rows):
    """top_k's long rows run the filtered kernel: values (raw bits: -0, -inf in empty slots)
    and indices equal the CPU handler's, for every alignment, masked lengths and ties."""
    rng = np.random.default_rng(rows + len(dtype))
    for n in (50_001, 50_003, 65_536) + ((200_006,) if rows == 2 else ()):
        for family in sorted(families.FAMILIES):
            operand = families.make(family, rng, (rows, n), dtype)
            lengths = rng.integers(-2, n + 3, size=rows).astype(np.int32)
            lengths[:2] = [n, 1000]
            for sorted_ in (False, True):
                assert_top_k_same_bits(operand, 2048, lengths, sorted_, err_msg=family)


@pytest.mark.parametrize("dtype", SIXTEEN_BIT)
def test_filtered_16bit_rank_order_at_the_composite_key_limit(dtype):
    """Rank order of 16-bit rows sorts one 32-bit composite of (key - lowest key, column) when
    the winners' key span and the column fit 32 bits together, else sorts by column then key: a
    131072-column row (18 column bits) whose 2048 winners span 2^14 - 1 keys (fits) or 2^14 (does
    not), ties and both ends included, indices and values."""
    rng = np.random.default_rng(14)
    n, k = 131072, 2048
    rows = []
    for span in (2**14 - 1, 2**14, 2**14 - 1, 2**14):
        bits = np.full(n, 0xBF80, np.uint16)  # -1.0 in bfloat16: below every winner
        winners = rng.integers(0x0100, 0x0100 + span + 1, size=k).astype(np.uint16)
        winners[:2] = [0x0100, 0x0100 + span]
        bits[rng.choice(n, size=k, replace=False)] = winners
        rows.append(bits)
    scores = families.from_bits(np.stack(rows), np.dtype("bfloat16"))
    if dtype == "float16":  # the same row's values as float16 (a different span of keys)
        scores = np.clip(scores.astype(np.float32), -60000, 60000).astype(np.float16)
    lengths = np.array([n, n, n - 5, n - 5], np.int32)
    assert_same_on_both("topk_filtered", scores, lengths, k=k, sorted=True)
    assert_top_k_same_bits(scores, k, lengths, True)


@pytest.mark.parametrize("dtype", ("float32",) + SIXTEEN_BIT)
@pytest.mark.parametrize("rows", [4, 300])  # split rows (merged into the first block), a queue
def test_filtered_kth_key_at_the_cutoff(dtype, rows):
    """The k-th key is the sample cutoff's own (the lowest relative bin): a crowded group of one
    key (read off the bin, then the tie quota), or of +0.0 and -0.0 (two keys: the digits), at
    several quotas; indices and values, both orders."""
    rng = np.random.default_rng(rows + len(dtype) + 70)
    n, k = 65536, 2048
    scores = families.kth_key_at_the_cutoff(rng, 24 if rows == 300 else rows, n, k, dtype)
    if rows == 300:
        scores = scores[rng.integers(0, len(scores), size=rows)]
    lengths = np.full(rows, n, np.int32)
    lengths[1::5] = n - 3
    for sorted_ in (False, True):
        assert_same_on_both("topk_filtered", scores, lengths, k=k, sorted=sorted_)
        assert_top_k_same_bits(scores, k, lengths, sorted_)


@pytest.mark.parametrize("dtype", ("float32",) + SIXTEEN_BIT)
@pytest.mark.parametrize("rows", [4, 300])  # split rows (merged into the first block), a queue
def test_filtered_crowded_bins_of_one_key(dtype, rows):
    """A k-th key with 33 to 256 ties (a 16-bit row's relative bins hold one key each, so such a
    bin is gathered, or for unsorted results marked, as it settles; float32's are ranked by the
    block): the group at the cutoff,
    +0.0 with -0.0 (two keys in one bin: the gather fails and the block ranks them), and normal
    rows rounded to the row's type (~40-80 ties at the k-th of 131072 bfloat16 values); indices
    and values, both orders, k and k - 5."""
    rng = np.random.default_rng(rows + len(dtype) + 90)
    n, k = 131072, 2048
    cut = families.kth_key_at_the_cutoff(rng, 24, n, k, dtype, groups=(33, 40, 100, 256))
    normal = rng.standard_normal((8, n), dtype=np.float32).astype(dtype)
    scores = np.concatenate([cut, normal])
    scores = (
        scores[rng.integers(0, len(scores), size=rows)] if rows == 300 else scores[[1, 7, 14, 26]]
    )
    lengths = np.full(len(scores), n, np.int32)
    lengths[1::5] = n - 3
    for k_ in (k, k - 5):
        for sorted_ in (False, True):
            assert_same_on_both("topk_filtered", scores, lengths, k=k_, sorted=sorted_)
        assert_top_k_same_bits(scores, k_, lengths, True)


@pytest.mark.parametrize("dtype", ("float32",) + SIXTEEN_BIT)
@pytest.mark.parametrize("rows", [6, 300])  # split rows (merged into the first block), a queue
def test_filtered_rank_order_of_few_keys_over_a_span(dtype, rows):
    """Sorted results whose winners hold few distinct keys over a span of up to 2049 keys:
    the rank-order buckets by key - lowest key and by dense key ranks, and crowded buckets
    (a key's winners in adjacent columns) that fall back to the radix sort."""
    rng = np.random.default_rng(rows + len(dtype) + 80)
    n, k = 131072, 2048
    scores = families.few_keys_over_a_span(rng, rows, n, k, dtype)
    lengths = np.full(len(scores), n, np.int32)
    assert_same_on_both("topk_filtered", scores, lengths, k=k, sorted=True)
    assert_top_k_same_bits(scores, k, lengths, True)
