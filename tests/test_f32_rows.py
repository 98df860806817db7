"""GPU-only: the register kernel for float32 rows of at most 32768 columns, and for many rows of
at most 8192 of the three types (cuda/kernels/topk_f32_rows.cu, which topk_filtered, topk_bf16
and top_k take for the shapes where it measured faster) against the CPU handler bit for bit:
every value family at widths around its slice sizes, rows that fool its sample or crowd its
candidate buffer, digit bins taken whole, page tables, num_valid_rows, sorted output (ranked by
count and by the block sort) and values. Each test runs with it forced on (JAX_TOPK_F32_ROWS,
read at each launch) in both block shapes ("always": the 1024-thread block for these few rows;
"many": the 256-thread block where the row fits it), or sets the mode it needs itself; a
subprocess with it off keeps the filtered kernel's own short-row routes covered on float32."""

from __future__ import annotations

import os

import jax
import numpy as np
import pytest

import jax_topk
from tests.support import families
from tests.support.families import one_coarse_bin, sample_foolers
from tests.support.operators import gpu_devices, permuted_page_table, run_op
from tests.support.processes import run_python

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not gpu_devices(), reason="no GPU visible to JAX"),
]


@pytest.fixture(autouse=True, params=["always", "many"])
def register_kernel_always(request, monkeypatch):
    monkeypatch.setenv("JAX_TOPK_F32_ROWS", request.param)


# Slices of 4 (256-thread block only), 8, 16 and 32 columns a thread: the widths at and past each
# boundary of both block shapes.
WIDTHS = [5, 1024, 1025, 2049, 4096, 8192, 8193, 12347, 16384, 16385, 32767, 32768]


def same_on_both(op, scores, lengths, **kwargs):
    gpu = run_op(op, "gpu", scores, lengths, **kwargs)
    cpu = run_op(op, "cpu", scores, lengths, **kwargs)
    np.testing.assert_array_equal(gpu, cpu)
    return gpu


def crowded_rows(rng, rows, n):
    """Rows the sample cannot settle: even rows repeat one value ~6000 times at the k-th place
    (more keys at the cutoff than the candidate buffer holds); odd rows hold their large values
    only at the columns the sample reads (each thread's first and middle column), so the
    sampled cutoff keeps fewer than k."""
    out = rng.standard_normal((rows, n)).astype(np.float32) * 0.01
    out[0::2, : min(n, 6000)] = 0.5
    out[0::2, rng.integers(0, n, size=100)] = 2.0
    out[1::2, 0::16] += 5.0
    return out


def bits(x):
    """Float arrays as their raw bits (so +0 and -0 differ); integer arrays as they are."""
    x = np.asarray(x)
    return x.view(f"u{x.itemsize}") if x.dtype.kind == "f" or x.dtype.itemsize == 2 else x


@pytest.mark.parametrize("n", WIDTHS)
@pytest.mark.parametrize("k", [1, 2047, 2048])
def test_families(n, k):
    rng = np.random.default_rng(n * 7 + k)
    rows = 6
    for family in sorted(families.FAMILIES):
        scores = families.make(family, rng, (rows, n), "float32")
        lengths = rng.integers(-2, n + 3, size=rows).astype(np.int32)
        lengths[:4] = [n, k - 1, k, k + 1]
        for sorted_ in (False, True):
            same_on_both("topk_filtered", scores, lengths, k=k, sorted=sorted_)


@pytest.mark.parametrize("n", [4097, 8192, 20000, 32768])
def test_sample_foolers_and_crowded_cutoffs(n):
    rng = np.random.default_rng(n)
    for make in (sample_foolers, one_coarse_bin, crowded_rows):
        scores = make(rng, 40, n)
        lengths = np.full(40, n, np.int32)
        lengths[1::3] = rng.integers(0, n + 1, size=len(lengths[1::3]))
        for k in (64, 2048):
            for sorted_ in (False, True):
                same_on_both("topk_filtered", scores, lengths, k=k, sorted=sorted_)


def bins_taken_whole(rng, rows, n=8192, k=64):
    """Rows whose k winners fill one digit bin whole: k keys of one 22-bit prefix (their low 10
    bits differ), most of them at columns both block shapes sample (multiples of 16), so the
    sampled cutoff is that prefix and exactly the k winners are gathered; 100 decoys share the
    winners' first 11-bit bin below the cutoff (never gathered) and the rest are small. The
    digits stop at the first bin: the pivot must be the cutoff, not the bin's least key, or the
    decoys would win too."""
    winner_bits = 0x40000000 | (1 << 18) | rng.permutation(1024)[:k].astype(np.uint32)
    decoy_bits = 0x40000000 | rng.integers(0, 1 << 18, size=100).astype(np.uint32)
    out = (rng.standard_normal((rows, n)) * 0.1).astype(np.float32)
    for row in out:
        sampled = rng.permutation(np.arange(0, n, 16))[: k - 16]
        others = rng.permutation(np.arange(1, n, 16))[: 16 + 100]
        row[sampled] = winner_bits[: k - 16].view(np.float32)
        row[others[:16]] = winner_bits[k - 16 :].view(np.float32)
        row[others[16:]] = decoy_bits.view(np.float32)
    return out


def test_digit_bins_taken_whole():
    rng = np.random.default_rng(11)
    scores = bins_taken_whole(rng, 6)
    lengths = np.full(6, scores.shape[1], np.int32)
    for sorted_ in (False, True):
        winners = same_on_both("topk_filtered", scores, lengths, k=64, sorted=sorted_)
        assert (scores[np.arange(6)[:, None], winners] >= 2.0).all()
        assert (np.take_along_axis(scores, winners, 1).view(np.uint32) & (1 << 18)).all()


def check_against_the_kernel_off(switch, rows, n, monkeypatch):
    """The kernel that `switch` (an environment variable, set to "always" or "only") forces on
    gives the CPU handler's bits and the same bits as the kernels serving the call with it
    "off"."""
    forced = os.environ[switch]
    rng = np.random.default_rng(rows)
    scores = rng.standard_normal((rows, n)).astype(np.float32)
    lengths = rng.integers(0, n + 1, size=rows).astype(np.int32)
    for k, sorted_ in ((2048, False), (2048, True), (50, True), (256, True), (257, True)):
        mine = same_on_both("topk_filtered", scores, lengths, k=k, sorted=sorted_)
        monkeypatch.setenv(switch, "off")
        theirs = run_op("topk_filtered", "gpu", scores, lengths, k=k, sorted=sorted_)
        monkeypatch.setenv(switch, forced)
        np.testing.assert_array_equal(mine, theirs)


def check_page_table_and_num_valid_rows(n, dtype="float32"):
    rng = np.random.default_rng(4)
    rows, page = 8, 64
    scores = rng.standard_normal((rows, n)).astype(dtype)
    lengths = rng.integers(0, n + 1, size=rows).astype(np.int32)
    table = permuted_page_table(rng, rows, n // page)
    for valid in (8, 3, 0):
        for sorted_ in (False, True):
            same_on_both(
                "topk_filtered",
                scores,
                lengths,
                k=512,
                page_table=table,
                page_size=page,
                num_valid_rows=np.int32(valid),
                sorted=sorted_,
            )


@pytest.mark.parametrize("rows", [1, 4, 64, 132, 133])
def test_same_bits_as_the_filtered_kernel(rows, monkeypatch):
    check_against_the_kernel_off("JAX_TOPK_F32_ROWS", rows, 32768, monkeypatch)


def test_page_table_and_num_valid_rows():
    check_page_table_and_num_valid_rows(16384)


def check_top_k_values(family, shape, k, dtype="float32"):
    """top_k's values beside its indices, sorted and not, from the same kernel."""
    rng = np.random.default_rng(5)
    operand = families.make(family, rng, shape, dtype)
    gpu, cpu = jax.devices("gpu")[0], jax.devices("cpu")[0]
    for sorted_ in (True, False):
        got = jax.jit(lambda x, s=sorted_: jax_topk.top_k(x, k, sorted=s))(
            jax.device_put(operand, gpu)
        )
        want = jax.jit(lambda x, s=sorted_: jax_topk.top_k(x, k, sorted=s))(
            jax.device_put(operand, cpu)
        )
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(bits(a), bits(b))


@pytest.mark.parametrize("family", ["normal", "heavy_ties", "signed_zeros", "denormals", "nan_mix"])
def test_top_k_values(family):
    check_top_k_values(family, (4, 30000), 2048)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("n", [1000, 2049, 8192])
def test_many_rows_by_the_rule(n, dtype, monkeypatch):
    """More rows than kF32RowsManyMinRows take the 256-thread block by the default rule through
    topk_filtered, sorted (by count up to 256 winners, by the block radix sort above) or not:
    the CPU's bits (topk_bf16's and top_k's 16-bit rows reach it from 512 rows: the test
    below). topk_filtered hands 16-bit rows this short to topk_bf16's kernel unless
    JAX_TOPK_SHORT_16BIT=own, set here so that its own rule is what runs."""
    monkeypatch.delenv("JAX_TOPK_F32_ROWS")
    monkeypatch.setenv("JAX_TOPK_SHORT_16BIT", "own")
    rng = np.random.default_rng(n)
    scores = np.concatenate(
        [families.make(family, rng, (28, n), dtype) for family in sorted(families.FAMILIES)]
    )
    rows = len(scores)  # 308, every value family
    lengths = rng.integers(-2, n + 3, size=rows).astype(np.int32)
    for k, sorted_ in (
        (64, True),
        (256, True),
        (257, True),
        (1024, True),
        (512, False),
    ):
        same_on_both("topk_filtered", scores, lengths, k=k, sorted=sorted_)
    if dtype == "float32":  # top_k's 16-bit rows of 308 go to topk_bf16's own kernel
        check_top_k_values("nan_mix", (rows, n), 64)
        check_top_k_values("heavy_ties", (rows, n), 200)


def top_k_same_on_both(scores, lengths, k, sorted_):
    """top_k's values and indices with lengths, GPU against CPU, bit for bit."""
    call = jax.jit(lambda x, lens: jax_topk.top_k(x, k, lengths=lens, sorted=sorted_))
    got, want = (
        call(*jax.device_put((scores, lengths), jax.devices(backend)[0]))
        for backend in ("gpu", "cpu")
    )
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(bits(a), bits(b))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("n", [5, 1024, 2049, 8192])
def test_16bit_families_in_the_many_rows_block(n, dtype, monkeypatch):
    """16-bit rows widened to float32 keys in the 256-thread block (forced on few rows): every
    value family (their own subnormals and exponent steps), lengths around k, every operator
    that reaches it (topk_bf16 takes bfloat16 only; top_k's 16-bit rows go where it goes)."""
    monkeypatch.setenv("JAX_TOPK_F32_ROWS", "many")
    rng = np.random.default_rng(n + len(dtype))
    rows = 6
    ops = ("topk_filtered", "topk_bf16") if dtype == "bfloat16" else ("topk_filtered",)
    for family in sorted(families.FAMILIES):
        scores = families.make(family, rng, (rows, n), dtype)
        for k in (64, 2047):
            lengths = rng.integers(-2, n + 3, size=rows).astype(np.int32)
            lengths[:4] = [n, k - 1, k, k + 1]
            for sorted_ in (False, True):
                for op in ops:
                    same_on_both(op, scores, lengths, k=k, sorted=sorted_)
                if k <= n:  # top_k's k is at most the row's width
                    top_k_same_on_both(scores, lengths, k, sorted_)


@pytest.mark.parametrize("rows", [512, 2048])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_16bit_hundreds_of_rows_by_the_rule(dtype, rows, monkeypatch):
    """top_k (and topk_bf16) of 512 or 2048 16-bit rows of 1000 columns take the 256-thread block
    over topk_bf16's kernel by the default rule: every value family, random lengths."""
    monkeypatch.delenv("JAX_TOPK_F32_ROWS")
    rng = np.random.default_rng(rows + len(dtype))
    families_ = sorted(families.FAMILIES)
    scores = np.concatenate(
        [families.make(f, rng, (rows // len(families_) + 1, 1000), dtype) for f in families_]
    )[:rows]
    lengths = rng.integers(-2, 1003, size=rows).astype(np.int32)
    for k, sorted_ in ((64, True), (300, True), (100, False)):
        top_k_same_on_both(scores, lengths, k, sorted_)
        if dtype == "bfloat16":
            same_on_both("topk_bf16", scores, lengths, k=k, sorted=sorted_)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_page_table_and_num_valid_rows_in_the_many_rows_block(dtype, monkeypatch):
    monkeypatch.setenv("JAX_TOPK_F32_ROWS", "many")
    check_page_table_and_num_valid_rows(4096, dtype)


def test_filtered_kernel_short_float32_rows_when_switched_off():
    out = run_python("-m", "tests.checks.f32_rows_off", JAX_TOPK_F32_ROWS="off")
    assert "filtered kernel, short float32 rows: ok" in out
