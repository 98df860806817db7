"""A representative call of each CUDA kernel (top_k's routes with values included, the
indexer's), small enough to run under compute-sanitizer
(`compute-sanitizer python -m tests.checks.sanitizer`, see .ci/gpu; `... sanitizer merge` runs
merge_topk's alone, `... sanitizer filtered16` the filtered kernel's 16-bit rows alone, `...
sanitizer few` its k <= 64 by sorted lists alone, `... sanitizer f32rows` the register kernel for
few float32 rows alone, `... sanitizer f32cluster` the cluster kernel for few float32 rows alone):
checks the result against the CPU handler too, bit for bit (the indexer's logits within the SPEC's
bound of it)."""

import sys

import jax
import numpy as np

import jax_topk
from tests.support import families
from tests.support.indexer import (
    BF16,
    FP8,
    TOLERANCE,
    logits_then_topk,
    make_inputs,
    reference_logits,
)
from tests.support.operators import kernel_switches


def _nan_and_zero_rows(rng, rows, n):
    scores = rng.standard_normal((rows, n), np.float32)
    scores[::2][rng.random((rows + 1) // 2 * n).reshape(-1, n) < 0.1] = np.nan
    scores[1::2] = np.where(rng.random(((rows) // 2, n)) < 0.5, 0.0, -0.0)
    scores[1::2, ::97] = 1e-40  # a few subnormals above the zeros
    return scores.astype(jax.numpy.bfloat16)


def _periodic_rows(rng, rows, n):
    """Rows whose every period-th value is 10 higher (or lower): some sample phases see only
    those."""
    scores = rng.standard_normal((rows, n), np.float32) * 0.01
    for r in range(rows):
        period = (2, 4, 16, 64, 256)[r % 5]
        scores[r, r % period :: period] += 10.0 if r % 2 else -10.0
    return scores


def _merge_cases(gpu, cpu, rng):
    """merge_topk: the row-in-registers kernel (8 lists of 2048; a width not a multiple of 4;
    tied rows; the fine-bucket rank's row kinds; 8 lists in rank order in about half of more
    rows than SMs), its narrow instances (m <= 8192, more rows than their two blocks an SM) and
    the kernel past 16384 candidates, with -1 entries and NaN."""
    from tests.test_merge_topk import fine_bucket_rows, in_rank_order

    cases = [
        (32, 16384, 2048),
        (16, 5997, 1500),
        (4, 40000, 2048),
        (12, 16384, 2048),
        (140, 16384, 2048),
        (300, 4096, 2048),
        (290, 4093, 1000),
        (280, 8192, 2048),
    ]
    for rows, m, k in cases:
        values = rng.standard_normal((rows, m), np.float32)
        values[::3] = np.round(values[::3])
        values[1::4, ::5] = np.nan
        indices = rng.permutation(rows * m).reshape(rows, m).astype(np.int32)
        indices[:, ::7] = -1
        for dtype in (np.float32, jax.numpy.bfloat16):
            if rows == 12:
                values, indices = fine_bucket_rows(rng, rows, dtype, k)
            inputs = (values.astype(dtype), indices.copy())
            if rows == 140:  # about half the rows, at random, in rank order
                for r in np.flatnonzero(rng.random(rows) < 0.5):
                    inputs[0][r], inputs[1][r] = in_rank_order(inputs[0][r], inputs[1][r], 8)
            for sorted_ in (True, False):
                call = jax.jit(lambda v, i, k=k, o=sorted_: jax_topk.merge_topk(v, i, k, sorted=o))
                got = call(*jax.device_put(inputs, gpu))
                want = call(*jax.device_put(inputs, cpu))
                for a, b in zip(got, want):
                    a, b = np.asarray(a), np.asarray(b)
                    np.testing.assert_array_equal(
                        a.view(f"u{a.itemsize}"), b.view(f"u{b.itemsize}")
                    )


def _filtered_16bit_cases(gpu, cpu, rng):
    """topk_filtered and top_k on 16-bit rows alone (the packed filtering tile, crowded k-th
    bins and tie groups ranked by the block, the k-th key in the lowest relative bin, dense key
    ranks in rank order, few winners by sorted lists): queue rows, split rows, ties, specials."""
    bf16, f16 = jax.numpy.bfloat16, np.float16
    cases = [
        (rng.standard_normal((300, 20_000), np.float32).astype(bf16), 2048),
        (rng.standard_normal((300, 20_000), np.float32).astype(f16), 512),
        (np.round(rng.standard_normal((8, 70_000), np.float32) * 16).astype(bf16) / 16, 2048),
        # Tie groups of the k-th key over 256 (the bitmap quota; a crowded bin of one key).
        (np.round(rng.standard_normal((8, 70_000), np.float32) * 8).astype(bf16) / 8, 2048),
        (np.round(rng.standard_normal((300, 20_000), np.float32) * 4).astype(f16) / 4, 512),
        (_nan_and_zero_rows(rng, 12, 40_001), 2048),
        (_nan_and_zero_rows(rng, 12, 40_001).astype(f16), 64),
        # k <= 64 of a few kept candidates: the warps' sorted lists (few_winners.cuh).
        (rng.standard_normal((300, 20_000), np.float32).astype(bf16), 50),
        (_periodic_rows(rng, 40, 40_003).astype(bf16), 2048),
        # The k-th key in the lowest relative bin (one key, or +-0), and few keys over a span
        # (rank-order buckets by dense key ranks, crowded ones to the radix sort).
        (families.kth_key_at_the_cutoff(rng, 24, 20_000, 2048, bf16), 2048),
        (families.kth_key_at_the_cutoff(rng, 300, 20_000, 2048, f16), 2048),
        (families.few_keys_over_a_span(rng, 12, 20_000, 2048, f16), 2048),
        (families.few_keys_over_a_span(rng, 300, 20_000, 2048, bf16), 2048),
    ]
    for scores, k in cases:
        rows, n = scores.shape
        lengths = rng.integers(-1, n + 2, size=rows).astype(np.int32)
        for sorted_ in (True, False):
            calls = (
                lambda s, lens, k=k, o=sorted_: jax_topk.top_k(s, k, lengths=lens, sorted=o),
                lambda s, lens, k=k, o=sorted_: jax_topk.topk_filtered(s, lens, k=k, sorted=o),
            )
            for fn in calls:
                call = jax.jit(fn)
                got = jax.tree.leaves(call(*jax.device_put((scores, lengths), gpu)))
                want = jax.tree.leaves(call(*jax.device_put((scores, lengths), cpu)))
                for a, b in zip(got, want):
                    a, b = np.asarray(a), np.asarray(b)
                    np.testing.assert_array_equal(
                        a.view(f"u{a.itemsize}"), b.view(f"u{b.itemsize}")
                    )


def _top_k_matches(gpu, cpu, rng, cases):
    """top_k of each (scores, k) case with random lengths, sorted and not, and sorted
    without lengths (the kernels then get no lengths array): values and indices from the GPU
    equal the CPU handler's bit for bit."""
    for scores, k in cases:
        rows, n = scores.shape
        lengths = rng.integers(-1, n + 2, size=rows).astype(np.int32)
        for sorted_, given in ((True, True), (False, True), (True, False)):
            call = jax.jit(
                lambda s, lens, k=k, o=sorted_, g=given: jax_topk.top_k(
                    s, k, lengths=lens if g else None, sorted=o
                )
            )
            got = jax.tree.leaves(call(*jax.device_put((scores, lengths), gpu)))
            want = jax.tree.leaves(call(*jax.device_put((scores, lengths), cpu)))
            for a, b in zip(got, want, strict=True):
                a, b = np.asarray(a), np.asarray(b)
                np.testing.assert_array_equal(a.view(f"u{a.itemsize}"), b.view(f"u{b.itemsize}"))


def _few_winners_cases(gpu, cpu, rng):
    """k <= 64 of a few kept candidates by the warps' sorted lists (few_winners.cuh), for racecheck
    of their merge through shared memory: rows a block each and split rows merged into part 0 (few
    float32 rows kept off their own kernels), ascending rows whose every batch rises."""
    scores = rng.standard_normal((24, 20_000), np.float32)
    cases = [
        (scores.astype(jax.numpy.bfloat16), 50),
        (scores, 8),
        (rng.standard_normal((2, 40_003), np.float32), 64),
        (families.ascending(rng, (2, 40_003), np.float32), 64),
    ]
    with kernel_switches(JAX_TOPK_F32_CLUSTER="off", JAX_TOPK_F32_ROWS="off"):
        _top_k_matches(gpu, cpu, rng, cases)


def _f32_rows_cases(gpu, cpu, rng):
    """The register kernel for few float32 rows of <= 32768 columns: its sampled cutoff, its
    fallback over the registers (constant and crowded rows, sample foolers), NaN and signed
    zeros, unaligned rows, sorted output and values."""
    crowded = rng.standard_normal((6, 32768), np.float32) * 0.01
    crowded[::2, :6000] = 0.5
    nan_zero = _nan_and_zero_rows(rng, 8, 20_000).astype(np.float32)
    cases = [
        (rng.standard_normal((4, 32768), np.float32), 2048),
        (crowded, 2048),
        (np.full((2, 32768), -3.0, np.float32), 2048),
        (_periodic_rows(rng, 10, 32767), 2048),
        (nan_zero, 512),
        (rng.standard_normal((5, 8191), np.float32), 2048),
    ]
    # Forced on (read at each launch): its default takes only some of these shapes.
    with kernel_switches(JAX_TOPK_F32_ROWS="always"):
        _top_k_matches(gpu, cpu, rng, cases)
    # The 256-thread block for many rows of <= 8192 columns: every slice width, unaligned rows,
    # 16-bit rows widened.
    many = [
        (rng.standard_normal((300, 1000), np.float32), 64),
        (_nan_and_zero_rows(rng, 8, 8191).astype(np.float32), 2048),
        (_periodic_rows(rng, 10, 4097), 512),
        (np.full((3, 2048), -3.0, np.float32), 300),
    ]
    many += [(scores.astype(dtype), k) for scores, k in many for dtype in ("bfloat16", "float16")]
    with kernel_switches(JAX_TOPK_F32_ROWS="many"):
        _top_k_matches(gpu, cpu, rng, many)


def _f32_cluster_cases(gpu, cpu, rng):
    """The cluster kernel for few float32 rows of <= 262144 columns (16-bit rows of <= 196608),
    at both cluster sizes: slices past the row's end, unaligned rows, ties across its blocks, NaN
    and signed zeros, sorted output (by count and by the block sort) and values, more rows than
    one wave."""
    crowded = rng.standard_normal((3, 152064), np.float32) * 0.01
    crowded[:, ::7] = 0.5
    nan_zero = _nan_and_zero_rows(rng, 4, 100_003).astype(np.float32)
    cases = [
        (rng.standard_normal((2, 262144), np.float32), 2048),
        (rng.standard_normal((1, 152064), np.float32), 50),
        (crowded, 2048),
        (np.full((2, 32768), -3.0, np.float32), 2048),
        (_periodic_rows(rng, 3, 32767), 300),
        (nan_zero, 512),
        (rng.standard_normal((20, 5001), np.float32), 2048),
    ]
    # 16-bit rows (read at two bytes, at most 196608 columns): the same rows rounded.
    cases_16 = [
        (rng.standard_normal((2, 196608)).astype(dtype), 2048) for dtype in ("bfloat16", "float16")
    ] + [(scores.astype(dtype), k) for scores, k in cases[1:] for dtype in ("bfloat16", "float16")]
    for parts in (16, 8, 13):
        # "only": each case must take the cluster kernel (a call it cannot take fails), so each
        # size runs the cases it holds (32 float32 or 24 16-bit keys a thread).
        held = [
            (scores, k)
            for scores, k in cases + cases_16
            if scores.shape[1] <= parts * 512 * (32 if scores.dtype == np.float32 else 24)
        ]
        with kernel_switches(JAX_TOPK_F32_CLUSTER="only", JAX_TOPK_F32_CLUSTER_PARTS=str(parts)):
            _top_k_matches(gpu, cpu, rng, held)


def main():
    gpu, cpu = jax.devices("gpu")[0], jax.devices("cpu")[0]
    rng = np.random.default_rng(60)
    if sys.argv[1:] == ["filtered16"]:  # the filtered kernel's 16-bit rows alone
        _filtered_16bit_cases(gpu, cpu, rng)
        print("sanitizer cases (16-bit filtered): ok")
        return
    if sys.argv[1:] == ["few"]:  # k <= 64 by the filtered kernel's sorted lists alone
        _few_winners_cases(gpu, cpu, rng)
        print("sanitizer cases (few winners): ok")
        return
    if sys.argv[1:] == ["f32rows"]:  # the register kernel for few float32 rows alone
        _f32_rows_cases(gpu, cpu, rng)
        print("sanitizer cases (float32 register rows): ok")
        return
    if sys.argv[1:] == ["f32cluster"]:  # the cluster kernel for few float32 rows alone
        _f32_cluster_cases(gpu, cpu, rng)
        print("sanitizer cases (float32 cluster rows): ok")
        return
    _f32_rows_cases(gpu, cpu, rng)
    _f32_cluster_cases(gpu, cpu, rng)
    _merge_cases(gpu, cpu, rng)
    if sys.argv[1:] == ["merge"]:  # merge_topk's kernels alone
        print("sanitizer cases (merge_topk): ok")
        return
    cases = [
        (
            jax_topk.topk_bf16,
            rng.standard_normal((24, 16383), np.float32).astype(jax.numpy.bfloat16),
            dict(k=512, page_size=64),
        ),
        (
            jax_topk.topk_bf16,
            rng.standard_normal((8, 4096), np.float32).astype(jax.numpy.bfloat16),
            dict(k=2048, sorted=True),
        ),
        # Sorted rows of k <= 512: ordered by key counts (short spans) or the radix sort.
        (
            jax_topk.topk_bf16,
            (
                rng.standard_normal((24, 16383), np.float32)
                * np.where(
                    np.arange(24)[:, None] < 12, 1.0, 10.0 ** rng.uniform(-30, 30, (24, 16383))
                )
            ).astype(jax.numpy.bfloat16),
            dict(k=512, sorted=True, page_size=64),
        ),
        # NaN rows (the kernel's rewrite path) and rows of signed zeros (its zero-pivot path).
        (jax_topk.topk_bf16, _nan_and_zero_rows(rng, 12, 9001), dict(k=512)),
        (jax_topk.topk_filtered, rng.standard_normal((3, 100_003), np.float32), dict(k=2048)),
        # 16-bit rows of <= 16384 columns: topk_filtered hands them to topk_bf16's kernel.
        (
            jax_topk.topk_filtered,
            _nan_and_zero_rows(rng, 12, 12_345).astype(np.float16),
            dict(k=2048),
        ),
        # k = 1 by topk_argmax: short rows (unaligned: element loads), many long rows (vectors).
        (jax_topk.topk_filtered, _nan_and_zero_rows(rng, 300, 4097), dict(k=1)),
        (jax_topk.topk_filtered, rng.standard_normal((270, 40_000), np.float32), dict(k=1)),
        (
            jax_topk.topk_filtered,
            rng.standard_normal((300, 12_000), np.float32),
            dict(k=512, sorted=True),
        ),
        (jax_topk.topk_filtered, np.full((2, 30_000), 3.0, np.float32), dict(k=2048)),
        # Whole rows that fool the sample (secondary and exact routes), and split rows whose
        # random lengths fall on both sides of the column-bitmap limit (131072 / 262144).
        (jax_topk.topk_filtered, _periodic_rows(rng, 300, 20_000), dict(k=2048)),
        (jax_topk.topk_filtered, rng.standard_normal((4, 262_144), np.float32), dict(k=2048)),
        # Split rows (a block cluster a row): sample foolers (the parts' secondary re-read) and
        # coarse ties (a crowded k-th bin: merged into the cluster's first block).
        (jax_topk.topk_filtered, _periodic_rows(rng, 4, 65_536), dict(k=2048)),
        (
            jax_topk.topk_filtered,
            np.round(rng.standard_normal((4, 70_000), np.float32) * 16) / 16,
            dict(k=2048),
        ),
        # Split rows of two blocks an SM (over 192 KB of scores an SM on an H200).
        (jax_topk.topk_filtered, rng.standard_normal((40, 200_003), np.float32), dict(k=2048)),
    ]
    for fn, scores, kwargs in cases:
        rows, n = scores.shape
        lengths = rng.integers(-1, n + 2, size=rows).astype(np.int32)
        extra = {}
        if kwargs.get("page_size"):
            pages = -(-n // kwargs["page_size"])
            extra["page_table"] = np.stack([rng.permutation(pages) for _ in range(rows)]).astype(
                np.int32
            )
        call = jax.jit(lambda s, lens, t: fn(s, lens, **t, **kwargs))
        got = call(*jax.device_put((scores, lengths, extra), gpu))
        want = call(*jax.device_put((scores, lengths, extra), cpu))
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    # top_k: values and indices from every route, the 16-bit types on each kernel.
    f16 = np.float16
    top_k_cases = [
        (rng.standard_normal((300, 256), np.float32), 8),  # a warp a row
        (rng.standard_normal((37, 1000), np.float32).astype(f16), 32),
        (_nan_and_zero_rows(rng, 40, 1000), 64),  # a warp a row, k past 32: by digits
        (rng.standard_normal((300, 257), np.float32), 50),
        (_nan_and_zero_rows(rng, 12, 9001).astype(f16), 512),  # the register kernel
        (_nan_and_zero_rows(rng, 6, 16384), 2048),
        (_periodic_rows(rng, 40, 40_003).astype(f16), 2048),  # the filtered kernel, 16-bit
        (_periodic_rows(rng, 4, 65_541).astype(jax.numpy.bfloat16), 50),  # split rows
        (rng.standard_normal((3, 100_003), np.float32), 2048),
    ]
    _top_k_matches(gpu, cpu, rng, top_k_cases)


def _indexer_cases(rng, gpu, cpu):
    """The indexer's kernels (logits, then the selection from its workspace): on the GPU,
    indexer_topk equals topk_filtered of the GPU's indexer_logits bit for bit, and the GPU's
    logits are within twice the SPEC bound of the CPU's (the backends may round apart)."""
    cases = [  # (queries, heads, head_dim, keys, input type, key_scales, k, family)
        (8, 64, 128, 2100, BF16, False, 2048, "normal"),
        (4, 16, 128, 3001, FP8, True, 2048, "normal"),
        (33, 4, 32, 1000, BF16, False, 512, "zero_heads"),
        (5, 3, 20, 130, FP8, True, 1, "repeated_keys"),
    ]
    for queries, heads, head_dim, n, dtype, scaled, k, family in cases:
        q, keys, weights = make_inputs(rng, queries, heads, head_dim, n, family=family, dtype=dtype)
        key_scales = rng.uniform(0.01, 2.0, size=n).astype(np.float32) if scaled else None
        lengths = rng.integers(-1, n + 2, size=queries).astype(np.int32)
        args = (q, keys, weights, lengths, key_scales)
        topk = jax.jit(lambda a, b, c, d, e: jax_topk.indexer_topk(a, b, c, d, k=k, key_scales=e))
        two_steps = jax.jit(lambda a, b, c, d, e: logits_then_topk(a, b, c, d, k=k, key_scales=e))
        np.testing.assert_array_equal(
            np.asarray(topk(*jax.device_put(args, gpu))),
            np.asarray(two_steps(*jax.device_put(args, gpu))),
        )
        logits = jax.jit(lambda a, b, c, d, e: jax_topk.indexer_logits(a, b, c, d, key_scales=e))
        got = np.asarray(logits(*jax.device_put(args, gpu)))
        want = np.asarray(logits(*jax.device_put(args, cpu)))
        _, scale = reference_logits(q, keys, weights, lengths, key_scales)
        finite = np.isfinite(want)
        np.testing.assert_array_equal(np.isfinite(got), finite)
        assert (np.abs(got[finite] - want[finite]) <= 2 * TOLERANCE[dtype] * scale[finite]).all()


if __name__ == "__main__":
    main()
