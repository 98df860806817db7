"""jax_topk.merge_topk (docs/contract.md section 8): the exact top-k of the union of
candidate lists equals top_k over that union, on every backend, for every value family,
with -1 entries, lists of unequal fill, ties across lists and NaN; the exact path for other
dtypes; vmap; trace-time errors."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jax_topk
from tests.support import families
from tests.support.operators import device_for, gpu_devices

FAST_DTYPES = ["float32", "bfloat16", "float16"]


@functools.cache
def _jitted_merge(k, sorted):
    return jax.jit(lambda v, i: jax_topk.merge_topk(v, i, k, sorted=sorted))


@functools.cache
def _jitted_top_k(k, sorted):
    return jax.jit(lambda x, lengths: jax_topk.top_k(x, k, lengths=lengths, sorted=sorted))


def run_merge(backend, values, indices, k, sorted=True):
    device = device_for(backend)
    out = _jitted_merge(k, sorted)(jax.device_put(values, device), jax.device_put(indices, device))
    return tuple(np.asarray(o) for o in out)


def cpu_top_k(operand, k, lengths=None, sorted=True):
    """top_k on the CPU handler: the contract merge_topk is checked against."""
    cpu = jax.devices("cpu")[0]
    if lengths is not None:
        lengths = jax.device_put(np.asarray(lengths, np.int32), cpu)
    out = _jitted_top_k(k, sorted)(jax.device_put(operand, cpu), lengths)
    return tuple(np.asarray(o) for o in out)


def assert_same(actual, expected, msg=""):
    """Indices equal and values equal as raw bits (-0.0 and +0.0 differ)."""
    (values, indices), (want_values, want_indices) = actual, expected
    np.testing.assert_array_equal(indices, want_indices, err_msg=msg)
    assert values.dtype == want_values.dtype, msg
    bits = f"uint{values.dtype.itemsize * 8}"
    np.testing.assert_array_equal(values.view(bits), want_values.view(bits), err_msg=msg)


def random_lists(rng, rows, n, lists, per_list, dtype, family):
    """Candidate lists [rows, lists * per_list] of distinct global columns from [0, n), each
    list filled to its own random count (the rest -1 with garbage values, huge ones
    included), the entries shuffled; and the dense union [rows, n] (NaN at every column in
    no list, so top_k skips it)."""
    row_values = families.make(family, rng, (rows, n), dtype)
    garbage = families.make("infinities", rng, (rows, lists * per_list), dtype)
    values = garbage.copy()
    indices = np.full((rows, lists * per_list), -1, np.int32)
    union = np.full((rows, n), np.nan, np.float32).astype(dtype)
    for r in range(rows):
        columns = rng.permutation(n)[: lists * per_list]
        for list_index in range(lists):
            fill = int(rng.integers(0, per_list + 1))
            slots = slice(list_index * per_list, list_index * per_list + fill)
            indices[r, slots] = columns[slots]
        slot_order = rng.permutation(lists * per_list)
        indices[r] = indices[r, slot_order]
        present = indices[r] >= 0
        values[r, present] = row_values[r, indices[r, present]]
        union[r, indices[r, present]] = values[r, present]
    return values, indices, union


@pytest.mark.parametrize("dtype", FAST_DTYPES)
@pytest.mark.parametrize("lists,per_list,k", [(1, 7, 7), (3, 40, 33), (8, 64, 64), (5, 300, 1)])
def test_equals_top_k_over_the_union(backend, dtype, lists, per_list, k):
    """Random lists of unequal fill with -1 entries: every family (NaN, ties, signed zeros,
    infinities, raw bits), both orders."""
    rng = np.random.default_rng(lists * 1000 + per_list + k)
    n = 4 * lists * per_list + 3
    for family in families.FAMILIES:
        values, indices, union = random_lists(rng, 6, n, lists, per_list, dtype, family)
        for sorted_ in (True, False):
            got = run_merge(backend, values, indices, k, sorted_)
            assert_same(got, cpu_top_k(union, k, sorted=sorted_), f"{family} sorted={sorted_}")


@pytest.mark.parametrize("dtype", FAST_DTYPES)
def test_chunked_top_k_merges_into_one_call(backend, dtype):
    """The split-KV use: top_k over column chunks of unequal width (lengths ending inside,
    at and before each chunk), columns made global, merged: one top_k over the whole row.
    Ties across chunks (constant, heavy ties) rank the lower global column first."""
    rng = np.random.default_rng(7)
    rows, k = 10, 24
    bounds = [0, 30, 31, 100, 164, 300]
    n = bounds[-1]
    for family in families.FAMILIES:
        operand = families.make(family, rng, (rows, n), dtype)
        lengths = np.array([-3, 0, 1, 30, 31, 99, 100, 163, 250, 400], np.int32)
        chunk_values, chunk_indices = [], []
        for start, end in zip(bounds[:-1], bounds[1:]):
            local = np.clip(np.clip(lengths, 0, n) - start, 0, end - start)
            values, indices = cpu_top_k(operand[:, start:end], min(k, end - start), local, False)
            chunk_values.append(values)
            chunk_indices.append(np.where(indices >= 0, indices + start, -1).astype(np.int32))
        values, indices = np.concatenate(chunk_values, 1), np.concatenate(chunk_indices, 1)
        for sorted_ in (True, False):
            got = run_merge(backend, values, indices, k, sorted_)
            assert_same(got, cpu_top_k(operand, k, lengths, sorted_), f"{family} {sorted_}")


def test_k_past_the_candidates_and_empty_rows(backend):
    values = np.array([[1.0, np.nan, 2.0, 5.0], [7.0, 7.0, 7.0, 7.0]], np.float32)
    indices = np.array([[3, 0, -1, 9], [-1, -1, -1, -1]], np.int32)
    got_values, got_indices = run_merge(backend, values, indices, 4)
    np.testing.assert_array_equal(got_indices, [[9, 3, -1, -1], [-1, -1, -1, -1]])
    np.testing.assert_array_equal(got_values, [[5.0, 1.0, -np.inf, -np.inf], [-np.inf] * 4])


@pytest.mark.parametrize("dtype", ["int32", "uint32", "int64", "float64"])
def test_other_dtypes_take_the_exact_path(backend, dtype):
    with jax.enable_x64(True):
        rng = np.random.default_rng(8)
        if dtype == "float64":
            bits = rng.integers(0, 2**63, size=(4, 90), dtype=np.uint64) * np.uint64(2)
            row_values = bits.view(np.float64)
        else:
            info = np.iinfo(dtype)
            row_values = rng.integers(info.min, info.max, size=(4, 90), dtype=dtype)
            row_values[1] = row_values[1, 0]  # all ties
        indices = np.stack([rng.permutation(90)[:60] for _ in range(4)]).astype(np.int32)
        indices[:, ::7] = -1
        values = np.take_along_axis(row_values, np.maximum(indices, 0), 1)
        union = row_values.copy()
        lengths = None
        if dtype != "float64":  # integers have no NaN: keep only the union's columns
            order = np.argsort(np.where(indices >= 0, indices, 1 << 20), 1)
            columns = np.take_along_axis(indices, order, 1)
            union = np.take_along_axis(row_values, np.maximum(columns, 0), 1)
            lengths = (columns >= 0).sum(1)
        else:
            mask = np.ones(union.shape, bool)
            for r in range(4):
                mask[r, indices[r][indices[r] >= 0]] = False
            union[mask] = np.nan
        for sorted_ in (True, False):
            got = run_merge(backend, values, indices, 20, sorted_)
            want_values, want_indices = cpu_top_k(union, 20, lengths, sorted_)
            if dtype != "float64":  # positions in the compacted union back to columns
                want_indices = np.where(
                    want_indices >= 0,
                    np.take_along_axis(columns, np.maximum(want_indices, 0), 1),
                    -1,
                )
                if not sorted_:
                    order = np.argsort(np.where(want_indices >= 0, want_indices, 1 << 20), 1)
                    want_indices = np.take_along_axis(want_indices, order, 1)
                    want_values = np.take_along_axis(want_values, order, 1)
            assert_same(got, (want_values, want_indices), f"sorted={sorted_}")


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2", "bool", "uint8", "int16"])
def test_narrow_dtypes_merge_as_top_k(backend, dtype):
    """8-bit floats, bool, 8/16-bit integers (widened onto the kernel): chunks' top_k merged
    equal one top_k, the dtype's own empty value in -1 slots included."""
    rng = np.random.default_rng(26)
    if dtype == "bool":
        operand = rng.integers(0, 2, size=(5, 300)).astype(bool)
    elif dtype in ("uint8", "int16"):
        info = np.iinfo(dtype)
        operand = rng.integers(info.min, info.max, size=(5, 300), endpoint=True, dtype=dtype)
    else:
        operand = rng.integers(0, 256, size=(5, 300), dtype=np.uint8).view(
            getattr(ml_dtypes, dtype)
        )
    lengths = np.array([0, 1, 150, 151, 300], np.int32)
    halves = []
    for start in (0, 150):
        local = np.clip(lengths, start, start + 150) - start
        values, indices = cpu_top_k(operand[:, start : start + 150], 150, local, False)
        halves.append((values, np.where(indices >= 0, indices + start, -1).astype(np.int32)))
    values = np.concatenate([h[0] for h in halves], 1)
    indices = np.concatenate([h[1] for h in halves], 1)
    for sorted_ in (True, False):
        got = run_merge(backend, values, indices, 120, sorted_)
        want = cpu_top_k(operand, 120, lengths, sorted_)
        assert got[0].dtype == operand.dtype
        assert_same((got[0].view(np.uint8), got[1]), (want[0].view(np.uint8), want[1]), dtype)


def test_vmap_and_leading_shapes(backend):
    rng = np.random.default_rng(9)
    values, indices, _ = random_lists(rng, 12, 200, 4, 20, "bfloat16", "heavy_ties")
    device = device_for(backend)
    values, indices = jax.device_put(values, device), jax.device_put(indices, device)
    direct = jax_topk.merge_topk(values.reshape(3, 4, 80), indices.reshape(3, 4, 80), 10)
    mapped = jax.vmap(lambda v, i: jax_topk.merge_topk(v, i, 10))(
        values.reshape(3, 4, 80), indices.reshape(3, 4, 80)
    )
    flat = jax_topk.merge_topk(values, indices, 10)
    for a, b, c in zip(direct, mapped, flat):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        np.testing.assert_array_equal(np.asarray(a).reshape(12, 10), np.asarray(c))
    one = jax_topk.merge_topk(values[0], indices[0], 10)
    assert one[0].shape == (10,)
    np.testing.assert_array_equal(np.asarray(one[1]), np.asarray(flat[1][0]))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
def test_grad_through_chunks_and_merge_equals_top_k(backend, dtype):
    """A running top-k keeps top_k's gradient: on tie-free rows, jax.grad of a loss through
    top_k over column chunks then merge_topk equals it through jax.lax.top_k over the row
    (both orders; an order-free loss for sorted=False), and jax.jacfwd and vmap of the grad
    agree too."""
    rows, n, k, chunk = 3, 96, 10, 32
    rng = np.random.default_rng(19)
    with jax.enable_x64(dtype == "float64"):
        row = jnp.asarray(rng.permutation(rows * n).reshape(rows, n) / 7.0 - 20.0, dtype)
        weights = jnp.asarray(rng.standard_normal((rows, k)), dtype)
        device = device_for(backend)
        row, weights = jax.device_put(row, device), jax.device_put(weights, device)

        def merged(x, sorted_):
            parts = [jax_topk.top_k(x[:, c : c + chunk], k) for c in range(0, n, chunk)]
            values = jnp.concatenate([v for v, _ in parts], 1)
            columns = jnp.concatenate([i + c for (_, i), c in zip(parts, range(0, n, chunk))], 1)
            return jax_topk.merge_topk(values, columns, k, sorted=sorted_)[0]

        def losses(select):
            return (
                lambda x: (weights * select(x, True)).sum(),
                lambda x: (select(x, False).astype(jnp.float32) ** 2).sum(),
            )

        reference = lambda x, _sorted: jax.lax.top_k(x, k)[0]  # noqa: E731
        for ours, theirs in zip(losses(merged), losses(reference)):
            want = np.asarray(jax.grad(theirs)(row))
            np.testing.assert_array_equal(np.asarray(jax.jit(jax.grad(ours))(row)), want)
            np.testing.assert_array_equal(np.asarray(jax.vmap(jax.grad(ours))(row[None])[0]), want)
        jac = jax.jacfwd(lambda x: merged(x, True))(row[:1])
        want = jax.jacfwd(lambda x: reference(x, True))(row[:1])
        np.testing.assert_array_equal(np.asarray(jac), np.asarray(want))


def test_tangents_of_empty_slots_and_repeated_candidates(backend):
    """A -1 or NaN entry passes no tangent; a (value, column) pair given twice, both taken,
    passes each copy's tangent, the earlier place's first (sorted output)."""
    values = jnp.asarray([[3.0, np.nan, 5.0, 3.0, 1.0, 9.0]], jnp.float32)
    indices = jnp.asarray([[4, 2, 7, 4, 0, -1]], jnp.int32)
    tangent = jnp.asarray([[10.0, 20.0, 30.0, 40.0, 50.0, 60.0]], jnp.float32)
    device = device_for(backend)
    values, indices, tangent = (jax.device_put(a, device) for a in (values, indices, tangent))
    (got_values, got_indices), (dot, _) = jax.jvp(
        lambda v: jax_topk.merge_topk(v, indices, 6), (values,), (tangent,)
    )
    np.testing.assert_array_equal(np.asarray(got_indices), [[7, 4, 4, 0, -1, -1]])
    np.testing.assert_array_equal(np.asarray(dot), [[30.0, 10.0, 40.0, 50.0, 0.0, 0.0]])
    integers = jax.device_put(jnp.asarray([[3, 1, 5, 3, 1, 9]], jnp.int32), device)
    zero = np.zeros(integers.shape, jax.dtypes.float0)
    _, (int_dot, _) = jax.jvp(lambda v: jax_topk.merge_topk(v, indices, 3), (integers,), (zero,))
    assert int_dot.dtype == jax.dtypes.float0 and int_dot.shape == (1, 3)


@pytest.mark.parametrize("dtype", [*FAST_DTYPES, "float64"])
def test_winner_places_equal_the_sorted_merge_places(backend, dtype):
    """The JVP's places (found from the merge's own winners: one pass over the candidates,
    a sort of the k winners only) equal those of the sort of every candidate that picks
    the winners, both output orders, with the winners from this backend's merge_topk and
    from the pure-JAX merge: ties across lists, repeated columns with other values,
    repeated (value, column) pairs taken more than once, -1 and NaN entries, +-0, rows
    without a candidate or with fewer than k, the largest column."""
    with jax.enable_x64(dtype == "float64"):  # float64: the exact path, int64 keys
        _check_winner_places(backend, dtype)


def _check_winner_places(backend, dtype):
    from jax_topk import _fallback

    rng = np.random.default_rng(27)
    rows, m = 14, 600
    values = families.make("heavy_ties", rng, (rows, m), dtype)
    values[1] = families.make("signed_zeros", rng, (m,), dtype)
    values[2] = families.make("nan_mix", rng, (m,), dtype)
    if dtype != "float64":  # the family draws at most 32 bits
        values[3] = families.make("random_bits", rng, (m,), dtype)
    values[10] = 1.0  # one value: the column and the place decide
    indices = rng.integers(0, 400, size=(rows, m)).astype(np.int32)  # many repeated columns
    indices[4] = np.arange(m)  # distinct
    indices[5, 300:] = indices[5, :300]  # every pair given twice
    values[5, 300:] = values[5, :300]
    indices[6, ::3] = -1
    indices[7] = -1  # no candidate
    values[8] = np.nan
    indices[9, :5] = 2**31 - 1  # the largest column
    indices[10, 100:] = 7  # 500 equal (value, column) pairs
    indices[11, 20:] = -1  # 20 candidates
    device = device_for(backend)
    values, indices = jax.device_put(values, device), jax.device_put(indices, device)
    for k in (1, 37, 450, m):
        for sorted_ in (True, False):
            want = _fallback.merge_places(values, indices, k=k, sorted=sorted_, earlier_first=True)
            for source, winners in (
                ("merge_topk", jax_topk.merge_topk(values, indices, k, sorted=sorted_)),
                ("pure JAX", _fallback.merge(values, indices, k=k, sorted=sorted_)),
            ):
                got = _fallback.winner_places(values, indices, *winners, sorted=sorted_)
                np.testing.assert_array_equal(
                    np.asarray(got), np.asarray(want), f"{source} k={k} sorted={sorted_}"
                )


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "bfloat16"])
def test_tangents_follow_the_winners_through_ties(backend, dtype):
    """jax.jvp through merge_topk on rows of few distinct values and repeated (value, column)
    pairs, so that the k-th place cuts through a run of equal pairs (an 8-bit float widened
    onto the kernel, and bfloat16): each slot's tangent is that of the candidate the exact
    sort of every candidate puts there, both orders."""
    from jax_topk import _fallback

    rng = np.random.default_rng(31)
    rows, m = 6, 256
    values = rng.integers(0, 4, size=(rows, m)).astype(np.float32)  # four values
    indices = rng.integers(0, 24, size=(rows, m)).astype(np.int32)  # ~40 copies of a pair
    indices[1, ::5] = -1
    values[2, ::7] = np.nan
    values = values.astype(getattr(ml_dtypes, dtype, dtype))
    tangent = rng.standard_normal((rows, m)).astype(np.float32)
    device = device_for(backend)
    values, indices = jax.device_put(values, device), jax.device_put(indices, device)
    tangent = jax.device_put(tangent.astype(values.dtype), device)
    for k in (13, 100):
        for sorted_ in (True, False):
            _, (dot, _) = jax.jvp(
                lambda v, s=sorted_, k=k: jax_topk.merge_topk(v, indices, k, sorted=s),
                (values,),
                (tangent,),
            )
            places = _fallback.merge_places(
                values.astype(jnp.float32), indices, k=k, sorted=sorted_, earlier_first=True
            )
            want = np.where(
                places >= 0, np.take_along_axis(np.asarray(tangent), np.maximum(places, 0), 1), 0
            )
            got = np.asarray(dot).astype(np.float32)
            np.testing.assert_array_equal(got, want.astype(np.float32), f"k={k} {sorted_}")


def test_trace_time_errors():
    values, indices = jnp.zeros((2, 10), jnp.float32), jnp.zeros((2, 10), jnp.int32)
    with pytest.raises(ValueError, match=r"merge_topk: k=11.*m=10"):
        jax_topk.merge_topk(values, indices, 11)
    with pytest.raises(ValueError, match=r"k=0"):
        jax_topk.merge_topk(values, indices, 0)
    with pytest.raises(TypeError, match=r"indices must be int32"):
        jax_topk.merge_topk(values, indices.astype(jnp.int16), 2)
    with pytest.raises(ValueError, match=r"one shape"):
        jax_topk.merge_topk(values, indices[:, :5], 2)
    with pytest.raises(TypeError, match=r"complex64"):
        jax_topk.merge_topk(values.astype(jnp.complex64), indices, 2)
    with pytest.raises(TypeError, match=r"sorted must be a Python bool"):
        jax_topk.merge_topk(values, indices, 2, sorted=None)
    with pytest.raises(ValueError, match=r"m >= 1"):
        jax_topk.merge_topk(jnp.float32(1.0), jnp.int32(1), 1)


def test_running_top_k_example():
    """examples/running_top_k.py: a running top-k inside lax.scan equals one top_k, and so
    does its gradient (the example asserts both)."""
    path = Path(__file__).parents[1] / "examples" / "running_top_k.py"
    spec = importlib.util.spec_from_file_location("running_top_k", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    example.main()


def wide_lists(rng, lists, per_list, dtype, family, layout):
    """Rows of `lists` candidate lists of `per_list` each, as column-sharded top_k results
    arrive (list l holds columns of shard l, ascending), one row a layout: `unequal` (each
    list filled to its own count, the rest -1 with garbage values), `same_everywhere` (equal
    values on every list), `one_list_wins` (the other lists far below), `repeated` (every
    list a copy of the first: equal (value, column) pairs)."""
    shard = 2 * per_list
    columns = np.stack(
        [np.sort(rng.permutation(shard)[:per_list]) + shard * s for s in range(lists)]
    ).astype(np.int32)
    values = families.make(family, rng, (lists, per_list), dtype)
    if layout == "unequal":
        for s in range(lists):
            fill = int(rng.integers(0, per_list + 1))
            columns[s, fill:] = -1
            values[s, fill:] = families.make("infinities", rng, (per_list - fill,), dtype)
    elif layout == "same_everywhere":
        values[:] = values[0]
    elif layout == "one_list_wins":
        values[1:] = ml_dtypes.finfo(dtype).min  # the lowest finite value
    elif layout == "repeated":
        values[:], columns[:] = values[0], columns[0]
    return values.reshape(-1), columns.reshape(-1)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_devices(), reason="no GPU visible to JAX")
@pytest.mark.parametrize("dtype", FAST_DTYPES)
@pytest.mark.parametrize(
    "lists,per_list,k",
    [
        (8, 2048, 2048),
        (8, 2048, 1),
        (8, 2048, 333),
        (1, 2048, 2048),
        (64, 256, 2048),
        (3, 1999, 1500),
        (2, 5, 3),
        (64, 2048, 2048),
    ],
)
def test_wide_rows_gpu_equals_cpu(dtype, lists, per_list, k):
    """The CUDA kernels against the CPU handler bit for bit, up to 16384 candidates a row (the
    row-in-registers kernel, widths not a multiple of 4 included) and past it: every value
    family in every layout, both orders."""
    rng = np.random.default_rng(lists * 7 + per_list + k)
    rows = [
        wide_lists(rng, lists, per_list, dtype, family, layout)
        for family in families.FAMILIES
        for layout in ("unequal", "same_everywhere", "one_list_wins", "repeated")
    ]
    values, indices = np.stack([v for v, _ in rows]), np.stack([i for _, i in rows])
    for sorted_ in (True, False):
        got = run_merge("gpu", values, indices, k, sorted_)
        assert_same(got, run_merge("cpu", values, indices, k, sorted_), f"sorted={sorted_}")


def register_kernel_rows(rng, rows, width, dtype):
    """Rows for the row-in-registers merge kernel, the row kind cycling with the row (so each
    persistent block meets every path in turn): 0 1500 candidates (all of a shorter row), keys
    from -inf to +inf and columns from 0 to 2^31 - 2 (at k >= 1500 a 63-bit order code) with
    200 ties (a crowded bucket: the 64-bit cub sort); 1 four distinct values (a boundary bin
    over 2048: the column select over the registers); 2 random bit patterns (NaN included)
    with -1 entries; 3 no candidate; 4 one (value, column) pair everywhere; 5 NaN but for 100
    entries."""
    dtype = jnp.dtype(dtype)
    unsigned = np.dtype(f"uint{dtype.itemsize * 8}")
    top = np.iinfo(np.int32).max
    values = np.empty((rows, width), dtype)
    columns = np.empty((rows, width), np.int32)
    for r in range(rows):
        kind = r % 6
        col = np.sort(rng.integers(0, top - width, width)) + np.arange(width)  # distinct
        col[0], col[-1] = 0, top - 1
        col = col.astype(np.int32)
        v = (rng.standard_normal(width) * 100).astype(dtype)
        if kind == 0:
            col[1499 : width - 1] = -1  # columns 0 and 2^31 - 2 stay candidates
            v[1:201], v[201], v[202] = 3.0, np.inf, -np.inf
        elif kind == 1:
            v = rng.integers(0, 4, width).astype(dtype)
        elif kind == 2:
            v = rng.integers(0, np.iinfo(unsigned).max, width, dtype=unsigned, endpoint=True)
            v = v.view(dtype)
            col[rng.random(width) < 0.1] = -1
        elif kind == 3:
            col[:] = -1
        elif kind == 4:
            v[:], col[:] = v[0], col[0]
        else:
            v[100:] = np.nan
        order = rng.permutation(width)
        values[r], columns[r] = v[order], col[order]
    return values, columns


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_devices(), reason="no GPU visible to JAX")
@pytest.mark.parametrize("dtype", FAST_DTYPES)
@pytest.mark.parametrize("width,k", [(16384, 2048), (16383, 2048), (16384, 1), (257, 200)])
def test_register_kernel_rows_past_the_grid_gpu_equals_cpu(dtype, width, k):
    """The row-in-registers merge kernel (m <= 16384) against the CPU handler bit for bit on
    more rows than any GPU has SMs (each persistent block takes several rows in turn, its
    shared state reset between them), with the extreme order codes and crowded buckets of
    register_kernel_rows; vector loads (m % 4 == 0) and scalar ones."""
    rows = 6 * 160 + 5  # > 132 SMs of an H200, several rows a block
    values, indices = register_kernel_rows(np.random.default_rng(width + k), rows, width, dtype)
    for sorted_ in (True, False):
        got = run_merge("gpu", values, indices, k, sorted_)
        assert_same(got, run_merge("cpu", values, indices, k, sorted_), f"sorted={sorted_}")


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_devices(), reason="no GPU visible to JAX")
@pytest.mark.parametrize("dtype", FAST_DTYPES)
def test_sorted_lists_gpu_equals_cpu(dtype):
    """Lists as top_k(sorted=True) returns them (each list's values descending), the register
    kernel's sampled cutoff included: rows of normal values, rows whose winners all sit at the
    head of one list, rows of lists scaled apart (the sample's rank lands between lists)."""
    rng = np.random.default_rng(14)
    rows, lists, per_list = 3 * 100, 8, 2048
    values = rng.standard_normal((rows, lists, per_list)).astype(np.float32)
    values[1::3, 1:] -= 100.0  # the winners all in list 0
    values[2::3] *= np.exp2(np.arange(lists) - 4.0)[:, None]
    values = -np.sort(-values, axis=-1).astype(dtype)
    columns = np.sort(rng.permutation(4 * per_list)[:per_list])
    indices = (columns + 4 * per_list * np.arange(lists)[:, None]).astype(np.int32)
    indices = np.broadcast_to(indices, values.shape).reshape(rows, -1).copy()
    values = values.reshape(rows, -1)
    for sorted_ in (True, False):
        got = run_merge("gpu", values, indices, 2048, sorted_)
        assert_same(got, run_merge("cpu", values, indices, 2048, sorted_), f"sorted={sorted_}")


def fine_bucket_rows(rng, rows, dtype, k=2048, lists=8, width=None):
    """Rows of `lists` lists of 2048 (cut to `width` columns when given) for the register
    kernel's fine-bucket rank (each takes the sampled path: ~2800 kept of 8 lists), the row
    kind cycling with the row: 0 normal values (the
    benchmark's; for 16-bit types many equal keys in the bucket holding rank k); 1 one +inf
    (the key span 2^30: wide buckets, crowded near the cutoff); 2 the top 300 values a cluster
    of adjacent keys under one huge value (a crowded bucket before rank k: sorted output falls
    back, unsorted does not rank it); 3 and 4: 40 / 100 equal values at the k-th (a tie group
    in the bucket holding rank k: ranked by column / crowded); 5 the winners' columns in a
    narrow range between columns 0 and 2^31 - 2 (the (column, key) buckets crowded)."""
    dtype = jnp.dtype(dtype)
    unsigned = np.dtype(f"uint{dtype.itemsize * 8}")
    width = lists * 2048 if width is None else width
    values = np.empty((rows, width), dtype)
    columns = np.empty((rows, width), np.int32)
    for r in range(rows):
        kind = r % 6
        v = rng.standard_normal(width).astype(dtype)
        shards = np.sort(rng.integers(0, 16384, (lists, 2048)), axis=-1)
        shards += 16384 * np.arange(lists)[:, None]
        col = shards.reshape(-1)[:width].astype(np.int32)
        order = np.argsort(-v.astype(np.float32), kind="stable")
        if kind == 1:
            v[order[5]] = np.inf
        elif kind == 2:
            top = np.asarray(3.0, dtype).view(unsigned)
            v[order[:300]] = (top + np.arange(300, dtype=unsigned)).view(dtype)
            v[order[0]] = 60000.0
        elif kind in (3, 4):
            group = 40 if kind == 3 else 100
            kth = min(k, width - 1)  # k == width: the group at the row's end
            v[order[max(kth - group // 2, 0) : kth + group // 2]] = v[order[kth]]
        elif kind == 5:
            col = (rng.permutation(width) + 1000).astype(np.int32)
            col[order[0]], col[order[1]] = 0, np.iinfo(np.int32).max - 1
        values[r], columns[r] = v, col
    return values, columns


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_devices(), reason="no GPU visible to JAX")
@pytest.mark.parametrize("dtype", FAST_DTYPES)
@pytest.mark.parametrize("k", [2048, 1500])
def test_fine_bucket_rank_gpu_equals_cpu(dtype, k):
    """The register kernel's fine-bucket rank (both of its passes, its crowded-bucket
    fallbacks and the bucket holding rank k) against the CPU handler bit for bit, on more rows
    than an H200 has SMs."""
    values, indices = fine_bucket_rows(np.random.default_rng(k), 6 * 30, dtype, k)
    for sorted_ in (True, False):
        got = run_merge("gpu", values, indices, k, sorted_)
        assert_same(got, run_merge("cpu", values, indices, k, sorted_), f"sorted={sorted_}")


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_devices(), reason="no GPU visible to JAX")
@pytest.mark.parametrize("dtype", FAST_DTYPES)
@pytest.mark.parametrize("rows_of", ["register_kernel_rows", "fine_bucket_rows"])
@pytest.mark.parametrize(
    "width,k", [(4096, 2048), (4095, 1500), (4096, 1), (2048, 2048), (8192, 2048), (6001, 2048)]
)
def test_narrow_and_wide_instances_gpu_equal_cpu(dtype, rows_of, width, k, monkeypatch):
    """Rows of m <= 8192 (two or four lists of 2048: a column split over 2-4 devices, a running
    top-k over key chunks) run the register kernel's narrow instances, two blocks an SM,
    unstaged; with JAX_TOPK_MERGE_NARROW=off the wide one. Both against the CPU handler bit for
    bit, on more rows than the narrow grid has blocks (each block takes several rows in turn):
    the extreme order codes, crowded buckets and empty rows of register_kernel_rows, and the
    fine-bucket rank's rows (tie groups at rank k, crowded buckets before it) of 1-4 lists."""
    rng = np.random.default_rng(width + k)
    rows = 6 * 100 + 5  # > 2 x 132 blocks of an H200's narrow grid
    if rows_of == "register_kernel_rows":
        values, indices = register_kernel_rows(rng, rows, width, dtype)
    else:
        values, indices = fine_bucket_rows(rng, rows, dtype, k, -(-width // 2048), width)
    for sorted_ in (True, False):
        want = run_merge("cpu", values, indices, k, sorted_)
        for narrow in ("on", "off"):
            monkeypatch.setenv("JAX_TOPK_MERGE_NARROW", narrow)
            merge = jax.jit(lambda v, i, s=sorted_: jax_topk.merge_topk(v, i, k, sorted=s))
            gpu = device_for("gpu")
            got = merge(jax.device_put(values, gpu), jax.device_put(indices, gpu))
            got = tuple(np.asarray(o) for o in got)
            assert_same(got, want, f"sorted={sorted_} narrow={narrow}")


def in_rank_order(values, columns, lists):
    """Each of a row's `lists` equal parts reordered as top_k(sorted=True) returns a list:
    value descending (+0 before -0), then column ascending, entries of column -1 last (NaN
    after the numbers, as a hand-built list might hold it)."""
    values, columns = values.reshape(lists, -1).copy(), columns.reshape(lists, -1).copy()
    for s in range(lists):
        as_float = values[s].astype(np.float32)
        keys = (columns[s], np.signbit(as_float), -as_float, np.isnan(as_float), columns[s] < 0)
        order = np.lexsort(keys)
        values[s], columns[s] = values[s, order], columns[s, order]
    return values.reshape(-1), columns.reshape(-1)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_devices(), reason="no GPU visible to JAX")
@pytest.mark.parametrize("dtype", FAST_DTYPES)
@pytest.mark.parametrize(
    "lists,per_list,k",
    [(8, 2048, 2048), (8, 2048, 333), (16, 1024, 2048), (17, 512, 1000), (2, 8, 1), (1, 4096, 7)],
)
def test_rank_order_lists_gpu_equals_cpu(dtype, lists, per_list, k):
    """Lists in rank order, as top_k(sorted=True) returns them (merge_topk's common input: a
    running top-k, split-KV decode), against the CPU handler bit for bit: every value family
    in every wide_lists layout; among them, in random order, the same lists shuffled, so that
    persistent blocks meet both kinds of row; 1 to 17 lists."""
    rng = np.random.default_rng(lists * 31 + per_list + k)
    rows = []
    for family in families.FAMILIES:
        for layout in ("unequal", "same_everywhere", "one_list_wins", "repeated"):
            values, columns = in_rank_order(
                *wide_lists(rng, lists, per_list, dtype, family, layout), lists
            )
            rows.append((values, columns))
            order = rng.permutation(values.size)
            rows.append((values[order], columns[order]))
    rows = [rows[i] for i in rng.integers(0, len(rows), 301)]  # more rows than an H200's SMs
    values, indices = np.stack([v for v, _ in rows]), np.stack([i for _, i in rows])
    for sorted_ in (True, False):
        got = run_merge("gpu", values, indices, k, sorted_)
        assert_same(got, run_merge("cpu", values, indices, k, sorted_), f"sorted={sorted_}")


@pytest.mark.parametrize("x64", [False, True], ids=["x32", "x64"])
def test_grad_under_strict_dtype_promotion(backend, x64):
    """The gradient's winner search does integer arithmetic only on int32s: under
    jax_numpy_dtype_promotion="strict" (no bool - int32, no int64 - int32 under x64) it runs
    and equals the default's."""
    with jax.enable_x64(x64):
        _check_grad_under_strict_dtype_promotion(backend)


def _check_grad_under_strict_dtype_promotion(backend):
    device = device_for(backend)
    values = jax.device_put(jnp.array([[3.0, 1.0, 2.0, 0.0, 2.0, 5.0]], jnp.float32), device)
    indices = jax.device_put(jnp.array([[0, 1, 2, 3, 4, 5]], jnp.int32), device)
    weights = jax.device_put(jnp.arange(1.0, 4.0, dtype=jnp.float32), device)

    def loss(v):
        merged, _ = jax_topk.merge_topk(v, indices, 3)
        return (merged * weights).sum()

    want = jax.grad(loss)(values)
    with jax.numpy_dtype_promotion("strict"):
        got = jax.grad(loss)(values)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    np.testing.assert_array_equal(np.asarray(want), [[2.0, 0, 3.0, 0, 0, 1.0]])
