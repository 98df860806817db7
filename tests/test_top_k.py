"""jax_topk.top_k, the drop-in for jax.lax.top_k (docs/contract.md section 7): values and
indices against jax.lax.top_k on the CPU and against a NumPy reference, every route and
dtype, the JVP rule, and JAX transformations."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jax_topk
from tests.support import families
from tests.support.bits import assert_same_bits
from tests.support.operators import device_for

FAST_DTYPES = ["float32", "bfloat16", "float16"]
# Families without NaN: there jax.lax.top_k's result is the contract's, bit for bit.
NAN_FREE = [
    "normal",
    "heavy_ties",
    "constant",
    "all_neg_inf",
    "signed_zeros",
    "denormals",
    "infinities",
    "ascending",
    "near_ties",
]


def ordered_keys(values: np.ndarray) -> np.ndarray:
    """IEEE total order (floats) or numeric order (integers) as uint64, for any dtype."""
    dtype = values.dtype
    if np.issubdtype(dtype, np.integer):
        if np.issubdtype(dtype, np.unsignedinteger):
            return values.astype(np.uint64)
        return (values.astype(np.int64).view(np.uint64)) ^ np.uint64(1 << 63)
    width = dtype.itemsize * 8
    bits = values.view(f"uint{width}").astype(np.uint64)
    sign = np.uint64(1 << (width - 1))
    mask = np.uint64((1 << width) - 1)
    return np.where(bits & sign, ~bits & mask, bits | sign)


def is_nan(values: np.ndarray) -> np.ndarray:
    if np.issubdtype(values.dtype, np.integer):
        return np.zeros(values.shape, bool)
    return np.isnan(values)


def empty_value(dtype) -> np.ndarray:
    if np.issubdtype(dtype, np.integer):
        return np.array(np.iinfo(dtype).min, dtype)
    return np.array(-np.inf, np.float32).astype(dtype)


def reference_top_k(operand, k, lengths=None, sorted=True):
    """The contract in plain NumPy: a full sort by (key descending, column ascending)."""
    operand = np.asarray(operand)
    n = operand.shape[-1]
    leading = operand.shape[:-1]
    flat = operand.reshape(-1, n)
    rows = flat.shape[0]
    lengths = np.full(rows, n) if lengths is None else np.asarray(lengths, np.int64).reshape(rows)
    values = np.full((rows, k), empty_value(operand.dtype), operand.dtype)
    indices = np.full((rows, k), -1, np.int32)
    for r in range(rows):
        row = flat[r, : int(np.clip(lengths[r], 0, n))]
        cols = np.nonzero(~is_nan(row))[0]
        order = np.lexsort((cols, ~ordered_keys(row[cols])))[:k]
        chosen = cols[order] if sorted else np.sort(cols[order])
        indices[r, : len(chosen)] = chosen
        values[r, : len(chosen)] = row[chosen]
    return values.reshape(*leading, k), indices.reshape(*leading, k)


@functools.cache
def _jitted_top_k(k, sorted):
    """One jitted function per (k, sorted): calls of the same shape compile once."""
    return jax.jit(lambda x, lengths: jax_topk.top_k(x, k, lengths=lengths, sorted=sorted))


def run_top_k(backend, operand, k, lengths=None, sorted=True):
    device = device_for(backend)
    operand = jax.device_put(operand, device)
    if lengths is not None:
        lengths = jax.device_put(np.asarray(lengths), device)
    out = _jitted_top_k(k, sorted)(operand, lengths)
    return tuple(np.asarray(o) for o in out)


@functools.cache
def _cpu_lax_top_k_flushes_bf16_subnormals() -> bool:
    """Whether XLA's CPU jax.lax.top_k ranks bfloat16 subnormals as zeros on this host (seen on
    an Intel Xeon with AVX512-BF16, not on the AMD hosts before it); its float32 rows rank them
    by value everywhere."""
    probe = jax.device_put(np.array([0.0, 1e-39], ml_dtypes.bfloat16), jax.devices("cpu")[0])
    return int(jax.lax.top_k(probe, 1)[1][0]) == 0


def lax_top_k_on_cpu(operand, k):
    """jax.lax.top_k on the CPU, the contract's result on NaN-free rows. Where the host's XLA
    flushes bfloat16 subnormals in its compare, the same top_k of the rows widened to float32
    (exact and order-preserving), narrowed back: jax.lax.top_k's own order on another host."""
    cpu = jax.devices("cpu")[0]
    operand = np.asarray(operand)
    if operand.dtype == ml_dtypes.bfloat16 and _cpu_lax_top_k_flushes_bf16_subnormals():
        values, indices = jax.lax.top_k(jax.device_put(operand.astype(np.float32), cpu), k)
        return np.asarray(values).astype(ml_dtypes.bfloat16), np.asarray(indices)
    values, indices = jax.lax.top_k(jax.device_put(operand, cpu), k)
    return np.asarray(values), np.asarray(indices)


def make(family, rng, shape, dtype):
    return families.make(family, rng, shape, dtype)


# Shapes that reach every route: the small-row path (n <= 1024, small k; k past 32 from
# hundreds of rows), the register kernel (16-bit n <= 16384), the filtered kernel (long rows)
# and k beyond 2048 (sort).
ROUTE_SHAPES = [
    (5, 1, 1),
    (9, 256, 8),
    (600, 256, 40),
    (4, 1000, 50),
    (3, 5000, 300),
    (3, 20000, 2048),
    (2, 20000, 2049),
    (2, 3000, 3000),
]


@pytest.mark.parametrize("dtype", FAST_DTYPES)
@pytest.mark.parametrize("rows,n,k", ROUTE_SHAPES)
def test_sorted_matches_lax_top_k(backend, dtype, rows, n, k):
    """On NaN-free rows without lengths: the same values and indices as jax.lax.top_k on
    the CPU, bit for bit, in every family (ties, signed zeros, infinities, denormals)."""
    rng = np.random.default_rng(rows * 7 + n + k)
    for family in NAN_FREE:
        operand = make(family, rng, (rows, n), dtype)
        expected = lax_top_k_on_cpu(operand, k)
        values, indices = run_top_k(backend, operand, k)
        np.testing.assert_array_equal(indices, expected[1], err_msg=family)
        assert_same_bits(values, expected[0], family)


@pytest.mark.parametrize("dtype", FAST_DTYPES)
@pytest.mark.parametrize("rows,n,k", ROUTE_SHAPES)
def test_matches_reference(backend, dtype, rows, n, k):
    """Every family (NaN of both signs and random bit patterns included), lengths at every
    boundary, both orders: the NumPy reference, values and indices."""
    rng = np.random.default_rng(rows + n * 3 + k)
    special = np.array([-3, 0, 1, k - 1, k, k + 1, n, n + 5, 2**31 - 1], np.int64)
    for family in families.FAMILIES:
        operand = make(family, rng, (rows, n), dtype)
        lengths = np.clip(rng.choice(special, size=rows), -(2**31), 2**31 - 1).astype(np.int32)
        for sorted_ in (True, False):
            values, indices = run_top_k(backend, operand, k, lengths, sorted_)
            ref_values, ref_indices = reference_top_k(operand, k, lengths, sorted_)
            np.testing.assert_array_equal(indices, ref_indices, err_msg=family)
            assert_same_bits(values, ref_values, family)


def round_boundary_rows(rng, n, dtype):
    """Rows for k past 2048 (top_k's rounds of 2048): a tie group over ranks 1900..4300
    (both round boundaries inside it), ties of +0 and -0 across rank 2048, NaN between
    the winners, -inf from rank 3000 on, and a row of one value."""
    dtype = np.dtype(dtype)
    ladder = np.arange(n, 0, -1).astype(np.float32) / n  # distinct in float32
    ties = ladder.copy()
    ties[1900:4300] = ties[1900]
    zeros = ladder.copy()
    zeros[2000:2100] = 0.0
    zeros[2100:2200] = -0.0
    zeros[2200:] = -ladder[2200:]
    holes = ladder.copy()
    holes[::7] = np.nan
    tail = ladder.copy()
    tail[3000:] = -np.inf
    rows = [ties, zeros, holes, tail, np.full(n, 0.25, np.float32)]
    return np.stack([rng.permutation(r) for r in rows]).astype(dtype)


@functools.cache
def _jitted_rounds(k, sorted):
    """top_k's rounds forced whatever the route rule picks (the rule only trades speed)."""
    from jax_topk._top_k import _select_in_rounds

    return jax.jit(lambda x, lengths: _select_in_rounds(x, lengths, k=k, sorted=sorted))


@pytest.mark.parametrize("dtype", FAST_DTYPES)
def test_rounds_at_their_boundaries(backend, dtype):
    """k past 2048 is served in rounds of 2048 (each later round with the earlier winners
    masked): ties, signed zeros, NaN and -inf across the round boundaries, lengths ending
    inside each round, k at 2 x 2048 - 1 .. 2 x 2048 + 1 and four rounds, both orders;
    through top_k (its route) and through the rounds forced."""
    rng = np.random.default_rng(19)
    n = 9000
    operand = round_boundary_rows(rng, n, dtype)
    rows = operand.shape[0]
    device = device_for(backend)
    for k in (4095, 4096, 4097, 6500):
        for lengths in (None, rng.choice([0, 2047, 2049, 4096, 4200, 9000], size=rows)):
            for sorted_ in (True, False):
                ref_values, ref_indices = reference_top_k(operand, k, lengths, sorted_)
                full = np.full(rows, n) if lengths is None else lengths
                forced = _jitted_rounds(k, sorted_)(
                    jax.device_put(operand, device), jax.device_put(full.astype(np.int32), device)
                )
                for values, indices in (run_top_k(backend, operand, k, lengths, sorted_), forced):
                    msg = f"k={k} sorted={sorted_}"
                    np.testing.assert_array_equal(np.asarray(indices), ref_indices, err_msg=msg)
                    assert_same_bits(np.asarray(values), ref_values, msg)


def test_route_of_short_rows():
    """Rows of <= 1024 columns: a warp a row for k <= 32 at any row count; past 32 winners
    (by digits) from the row counts where it measured faster than a block a row."""
    from jax_topk._top_k import Route, route

    f32, bf16 = np.dtype("float32"), np.dtype(ml_dtypes.bfloat16)
    assert route(f32, 256, 8, rows=1) is Route.SMALL_ROWS
    assert route(f32, 1024, 32, rows=1) is Route.SMALL_ROWS
    assert route(f32, 1024, 64, rows=1024) is Route.SMALL_ROWS
    assert route(f32, 1024, 64, rows=1023) is Route.FILTERED
    assert route(f32, 256, 33, rows=512) is Route.SMALL_ROWS
    assert route(f32, 256, 33, rows=511) is Route.FILTERED
    assert route(bf16, 1024, 64, rows=512) is Route.SMALL_ROWS
    assert route(bf16, 1024, 64, rows=511) is Route.REGISTER_ROWS
    assert route(bf16, 512, 40, rows=128) is Route.SMALL_ROWS
    assert route(bf16, 1025, 8, rows=65536) is Route.REGISTER_ROWS
    assert route(f32, 1024, 65, rows=65536) is Route.FILTERED
    # topk_bf16's block a row stops at 2^31 - 1 rows; more go to the filtered kernel.
    assert route(bf16, 2048, 100, rows=2**31 - 1) is Route.REGISTER_ROWS
    assert route(bf16, 2048, 100, rows=2**31) is Route.FILTERED


def test_route_past_2048():
    """k past 2048 goes to rounds while they beat one sort of the rows (2 rounds always, 4
    from 2^21 elements, 8 from 8 rows of 65536 or more), then to the sort; dtypes the
    kernels do not read always sort."""
    from jax_topk._top_k import Route, route

    f32 = np.dtype("float32")
    assert route(f32, 131072, 2048, rows=64) is Route.FILTERED
    for rows, n, most in (
        (1, 131072, 2),
        (64, 32768, 4),
        (4096, 8192, 4),
        (8, 131072, 8),
        (1, 2**22, 4),
    ):
        assert route(f32, n, 2048 * most, rows) is Route.ROUNDS, (rows, n)
        assert route(f32, n, 2048 * most + 1, rows) is Route.SORT, (rows, n)
    assert route(np.dtype("int32"), 131072, 2049, rows=64) is Route.SORT


def test_nan_never_selected_and_empty_slots(backend):
    """NaN (either sign) is never selected: its slots are index -1 and value -inf."""
    row = np.array([[np.nan, 1.0, -np.nan, -np.inf, np.nan]], np.float32)
    for dtype in FAST_DTYPES:
        values, indices = run_top_k(backend, row.astype(dtype), 4)
        np.testing.assert_array_equal(indices, [[1, 3, -1, -1]])
        assert values.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(values.astype(np.float32), [[1.0, -np.inf, -np.inf, -np.inf]])


def test_float16_specials(backend):
    """float16's own specials: its subnormals, its larger exponent step, its largest finite
    value, and NaN/inf patterns that are ordinary numbers in bfloat16."""
    bits = np.array(
        [
            0x0001,
            0x8001,
            0x03FF,
            0x0400,
            0x7BFF,
            0xFBFF,
            0x7C00,
            0xFC00,
            0x7C01,
            0xFE00,
            0x3C00,
            0x3C01,
            0x0000,
            0x8000,
        ],
        np.uint16,
    )
    rng = np.random.default_rng(12)
    operand = rng.choice(bits, size=(6, 700)).view(np.float16)
    for k in (1, 13, 699):
        for sorted_ in (True, False):
            values, indices = run_top_k(backend, operand, k, sorted=sorted_)
            ref_values, ref_indices = reference_top_k(operand, k, sorted=sorted_)
            np.testing.assert_array_equal(indices, ref_indices)
            assert_same_bits(values, ref_values)


def pivot_rows(rng, n, k, dtype):
    """One row per k-th value worth breaking (+inf, -inf, the largest finite value, +0, -0,
    the smallest subnormal): k//3 values above it, k + 7 equal to it (its quota splits the
    ties), n//3 NaNs that share an infinity's high byte, the rest below it (NaN where
    nothing is). The register kernel's byte histograms put those NaNs in the infinities'
    bins, and -inf is the fill it loads past a row's length: they must count for nothing."""
    inf = int(np.array(np.inf, dtype).view(np.uint16))
    nans = np.arange(inf + 1, (inf | 0xFF) + 1)
    nans = np.concatenate([nans, nans | 0x8000])
    largest = inf - 1
    one = int(np.array(1.0, dtype).view(np.uint16))
    pool = np.array([inf, largest, one, 0x0001, 0x0000])
    pool = np.concatenate([pool, pool | 0x8000])
    keys = ordered_keys(pool.astype(np.uint16).view(dtype))
    rows = []
    for pivot in (inf, inf | 0x8000, largest, 0x0000, 0x8000, 0x0001):
        pivot_key = ordered_keys(np.array([pivot], np.uint16).view(dtype))[0]
        above, below = pool[keys > pivot_key], pool[keys < pivot_key]
        above_count = k // 3 if len(above) else 0
        below_count = n - above_count - (k + 7) - n // 3
        parts = [
            rng.choice(above, size=above_count) if above_count else np.zeros(0, int),
            np.full(k + 7, pivot),
            rng.choice(nans, size=n // 3),
            rng.choice(below if len(below) else nans, size=below_count),
        ]
        rows.append(rng.permutation(np.concatenate(parts)))
    return np.stack(rows).astype(np.uint16).view(dtype)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("n,k", [(1000, 50), (5000, 300), (16384, 2048)])
def test_pivots_beside_nan_bins(backend, dtype, n, k):
    """16-bit rows whose k-th value is an infinity, a signed zero or a subnormal, among
    NaNs that share the infinities' high bytes, with and without lengths, both orders."""
    rng = np.random.default_rng(n + k)
    operand = pivot_rows(rng, n, k, np.dtype(dtype))
    rows = operand.shape[0]
    for lengths in (None, rng.integers(k, n + 1, size=rows).astype(np.int32)):
        for sorted_ in (True, False):
            values, indices = run_top_k(backend, operand, k, lengths, sorted_)
            ref_values, ref_indices = reference_top_k(operand, k, lengths, sorted_)
            np.testing.assert_array_equal(indices, ref_indices)
            assert_same_bits(values, ref_values)


@pytest.mark.parametrize("dtype", ["int32", "int8", "uint8", "uint32", "int16", "uint16", "int64"])
def test_integer_dtypes(backend, dtype):
    """Integers: the 8- and 16-bit ones widened exactly onto the kernels (short rows, the
    register kernel, the filtered kernel), the wider ones on the exact sort path; the same
    contract either way, the dtype's minimum in empty slots."""
    with jax.enable_x64(dtype == "int64"):  # else JAX narrows int64 to int32
        _check_integer_rows(backend, dtype)


def _check_integer_rows(backend, dtype):
    rng = np.random.default_rng(13)
    info = np.iinfo(dtype)
    for n, k in ((300, 10), (300, 100), (20000, 700)):
        operand = rng.integers(info.min, info.max, size=(5, n), endpoint=True, dtype=dtype)
        operand[1] = operand[1, 0]  # a constant row: all ties
        operand[2, ::3] = info.min  # the minimum, as an empty slot holds it
        operand[2, 1::3] = info.max
        lengths = np.array([n, n, 2**31 - 1, 4, -(2**31)], np.int32)
        for sorted_ in (True, False):
            values, indices = run_top_k(backend, operand, k, lengths, sorted_)
            ref_values, ref_indices = reference_top_k(operand, k, lengths, sorted_)
            np.testing.assert_array_equal(indices, ref_indices, f"n={n} k={k}")
            np.testing.assert_array_equal(values, ref_values, f"n={n} k={k}")
            assert values.dtype == np.dtype(dtype)
        assert (indices == -1).any() and (indices[2] >= 0).all()


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16", "uint16", "bool", "float8_e5m2"])
def test_narrow_dtypes_take_a_kernel(dtype):
    """The widened dtypes lower to a kernel's custom call, not to a sort of the rows."""
    operand = jnp.zeros((4, 300), getattr(jnp, dtype if dtype != "bool" else "bool_"))
    for fn in (
        lambda x: jax_topk.top_k(x, 8),
        lambda x: jax_topk.merge_topk(x, x.astype("int32"), 8),
    ):
        text = jax.jit(fn).lower(operand).as_text()
        assert "custom_call @jax_topk" in text and "stablehlo.sort" not in text, text[:2000]


def test_float64(backend):
    with jax.enable_x64(True):
        rng = np.random.default_rng(14)
        bits = rng.integers(0, 2**63, size=(4, 500), dtype=np.uint64) * np.uint64(2)
        operand = (bits | rng.integers(0, 2, size=(4, 500), dtype=np.uint64)).view(np.float64)
        operand[0, ::3] = -0.0
        values, indices = run_top_k(backend, operand, 33, np.array([500, 0, 7, 400], np.int32))
        ref_values, ref_indices = reference_top_k(operand, 33, np.array([500, 0, 7, 400]))
        np.testing.assert_array_equal(indices, ref_indices)
        assert_same_bits(values, ref_values)


# jax.lax.top_k's 8-bit floats and bool, those this jax knows; top_k widens them to bfloat16.
NARROW = [
    name
    for name in (
        "float8_e4m3fn",
        "float8_e5m2",
        "float8_e4m3fnuz",
        "float8_e5m2fnuz",
        "float8_e4m3b11fnuz",
        "float8_e3m4",
        "float8_e4m3",
        "float8_e8m0fnu",
    )
    if hasattr(jnp, name)
] + ["bool"]


def narrow_rows(rng, dtype, shape):
    """Every byte pattern of an 8-bit float (NaNs, -0, infinities where the type has them)
    in the first 256 columns in random places, a tied run and random bytes after them; bool
    rows of both values."""
    if dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(bool)
    operand = rng.integers(0, 256, size=shape, dtype=np.uint8)
    operand[:, :256] = rng.permuted(
        np.broadcast_to(np.arange(256, dtype=np.uint8), (shape[0], 256)), axis=1
    )
    operand[:, 256:296] = operand[:, :1]
    return operand.view(np.dtype(getattr(ml_dtypes, dtype)))


# The contract's empty slot as bits: -inf where the type has one, else its lowest value.
NARROW_EMPTY_BITS = {
    "float8_e4m3fn": 0xFE,  # -448
    "float8_e5m2": 0xFC,  # -inf
    "float8_e4m3fnuz": 0xFF,  # -240
    "float8_e5m2fnuz": 0xFF,  # -57344
    "float8_e4m3b11fnuz": 0xFF,  # -30
    "float8_e3m4": 0xF0,  # -inf
    "float8_e4m3": 0xF8,  # -inf
    "float8_e8m0fnu": 0x00,  # 2**-127, its smallest (it has no sign and no zero)
    "bool": 0x00,  # False
}


@pytest.mark.parametrize("dtype", NARROW)
def test_narrow_dtypes(backend, dtype):
    """The 8-bit floats and bool, ranked by value (bool: False < True), NaN never selected,
    values in their own dtype, the dtype's own empty value in -1 slots; without NaN the same
    bits as jax.lax.top_k (of the rows widened to float32 where XLA's CPU compare of the
    narrow type itself is not by value: float8_e5m2fnuz, docs/contract.md section 7)."""
    rng = np.random.default_rng(25)
    operand = narrow_rows(rng, dtype, (6, 400))
    wide = operand.astype(np.float32)
    lengths = np.array([-1, 0, 1, 39, 300, 10**6])
    empty = np.array(NARROW_EMPTY_BITS[dtype], np.uint8)
    for k, sorted_ in ((1, True), (40, True), (400, True), (300, False)):
        values, indices = run_top_k(backend, operand, k, lengths, sorted_)
        _, want_indices = reference_top_k(wide, k, lengths, sorted_)
        np.testing.assert_array_equal(indices, want_indices, err_msg=f"k={k}")
        picked = np.take_along_axis(operand, np.maximum(want_indices, 0), axis=1)
        want_bits = np.where(want_indices >= 0, picked.view(np.uint8), empty)
        assert values.dtype == operand.dtype
        np.testing.assert_array_equal(values.view(np.uint8), want_bits, f"k={k}")
    assert (indices == -1).any(), "no empty slot was checked"
    # NaN slots to the bits 0x00: +0, or e8m0fnu's 2**-127 (it has no zero).
    nan_free = np.where(np.isnan(wide), np.zeros((), np.uint8).view(operand.dtype), operand)
    cpu = jax.devices("cpu")[0]
    for k in (50, 400):
        values, indices = run_top_k(backend, nan_free, k)
        if dtype == "float8_e5m2fnuz":
            want = jax.lax.top_k(jax.device_put(nan_free.astype(np.float32), cpu), k)
            want = (np.asarray(want[0]).astype(operand.dtype), want[1])
        else:
            want = jax.lax.top_k(jax.device_put(nan_free, cpu), k)
        np.testing.assert_array_equal(indices, np.asarray(want[1]), f"k={k}")
        np.testing.assert_array_equal(values.view(np.uint8), np.asarray(want[0]).view(np.uint8))


@pytest.mark.parametrize("shape", [(300,), (2, 3, 300), (1, 1, 1, 17)])
def test_leading_shapes(backend, shape):
    rng = np.random.default_rng(15)
    operand = make("normal", rng, shape, "float32")
    values, indices = run_top_k(backend, operand, 5)
    assert values.shape == indices.shape == shape[:-1] + (5,)
    ref_values, ref_indices = reference_top_k(operand, 5)
    np.testing.assert_array_equal(indices, ref_indices)
    assert_same_bits(values, ref_values)


def test_k_equal_to_n_and_one(backend):
    rng = np.random.default_rng(16)
    for n in (1, 2, 33, 2048, 2049):
        operand = make("heavy_ties", rng, (3, n), "bfloat16")
        for k in {1, n}:
            values, indices = run_top_k(backend, operand, k)
            expected = lax_top_k_on_cpu(operand, k)
            np.testing.assert_array_equal(indices, expected[1])
            assert_same_bits(values, expected[0])


@pytest.mark.parametrize("axis", [0, 1, 2, -1, -2, -3])
def test_axis_matches_lax_top_k(backend, axis):
    """A row along any axis: the result with k in that axis's place, what jax.lax.top_k(...,
    axis=) gives, and lengths shaped as the operand without that axis."""
    rng = np.random.default_rng(23)
    shape = (40, 30, 50)
    operand = make("heavy_ties", rng, shape, "bfloat16")
    k = 7
    device = device_for(backend)
    values, indices = jax.jit(lambda x: jax_topk.top_k(x, k, axis=axis))(
        jax.device_put(operand, device)
    )
    expected = jax.lax.top_k(jax.device_put(operand, jax.devices("cpu")[0]), k, axis=axis)
    assert values.shape == indices.shape == expected[0].shape
    np.testing.assert_array_equal(np.asarray(indices), np.asarray(expected[1]))
    assert_same_bits(np.asarray(values), np.asarray(expected[0]))

    moved = np.moveaxis(operand, axis, -1)
    lengths = rng.integers(-2, moved.shape[-1] + 3, size=moved.shape[:-1])
    values, indices = jax_topk.top_k(
        jax.device_put(operand, device), k, axis=axis, lengths=lengths, sorted=False
    )
    ref_values, ref_indices = reference_top_k(moved, k, lengths, sorted=False)
    np.testing.assert_array_equal(np.asarray(indices), np.moveaxis(ref_indices, -1, axis))
    assert_same_bits(np.asarray(values), np.moveaxis(ref_values, -1, axis))


def test_is_stable_is_accepted_and_changes_nothing(backend):
    """jax.lax.top_k's is_stable (jax 0.12): ours is always stable, so both settings give
    the lower column first among equal values."""
    x = jax.device_put(np.array([[2.0, 5.0, 5.0, 2.0, 5.0]], np.float32), device_for(backend))
    for is_stable in (True, False):
        values, indices = jax_topk.top_k(x, 4, is_stable=is_stable)
        np.testing.assert_array_equal(np.asarray(indices), [[1, 2, 4, 0]])
        np.testing.assert_array_equal(np.asarray(values), [[5.0, 5.0, 5.0, 2.0]])


# --- Differentiation: the JVP rule of jax.lax.top_k for values; no tangent for indices.


def _tie_free(rng, shape):
    """Distinct values in every row, so jax.lax.top_k's gradient is well defined."""
    return (
        np.stack([rng.permutation(shape[-1]) for _ in range(int(np.prod(shape[:-1])))])
        .reshape(shape)
        .astype(np.float32)
        / shape[-1]
        + 0.5
    )


@pytest.mark.parametrize("n,k", [(64, 8), (3000, 50), (5000, 2049)])
def test_grad_matches_lax_top_k(backend, n, k):
    rng = np.random.default_rng(17)
    x = jax.device_put(_tie_free(rng, (3, n)), device_for(backend))
    weights = jnp.asarray(rng.standard_normal((3, k)), jnp.float32)

    def loss(top_k_fn, x):
        values, indices = top_k_fn(x, k)
        gathered = jnp.take_along_axis(jnp.sin(x), indices, axis=-1)  # a gathered loss too
        return jnp.sum(values * weights) + jnp.sum(gathered**2)

    ours = jax.grad(lambda x: loss(jax_topk.top_k, x))(x)
    theirs = jax.grad(lambda x: loss(jax.lax.top_k, x))(x)
    np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), rtol=1e-6, atol=0)
    assert np.count_nonzero(np.asarray(ours)) > 0


def test_grad_along_another_axis(backend):
    rng = np.random.default_rng(24)
    x = jax.device_put(np.moveaxis(_tie_free(rng, (5, 60)), 1, 0), device_for(backend))

    def loss(top_k_fn, x):
        return jnp.sum(jnp.cos(top_k_fn(x, 6, axis=0)[0]))

    ours = jax.grad(lambda x: loss(jax_topk.top_k, x))(x)
    theirs = jax.grad(lambda x: loss(jax.lax.top_k, x))(x)
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
    assert np.count_nonzero(np.asarray(ours)) == 5 * 6


def test_jacfwd_and_vmapped_grad(backend):
    rng = np.random.default_rng(18)
    x = jax.device_put(_tie_free(rng, (4, 40)), device_for(backend))
    jac_ours = jax.jacfwd(lambda x: jax_topk.top_k(x, 5)[0])(x)
    jac_theirs = jax.jacfwd(lambda x: jax.lax.top_k(x, 5)[0])(x)
    np.testing.assert_array_equal(np.asarray(jac_ours), np.asarray(jac_theirs))
    grad_rows = jax.vmap(jax.grad(lambda row: jnp.sum(jax_topk.top_k(row, 3)[0] ** 2)))(x)
    grad_rows_lax = jax.vmap(jax.grad(lambda row: jnp.sum(jax.lax.top_k(row, 3)[0] ** 2)))(x)
    np.testing.assert_allclose(np.asarray(grad_rows), np.asarray(grad_rows_lax), rtol=1e-6)


def test_empty_slots_carry_no_tangent(backend):
    """A -1 slot's value is -inf and its tangent is zero (nothing was gathered)."""
    x = jax.device_put(np.array([[1.0, 2.0, np.nan]], np.float32), device_for(backend))
    tangent = jnp.ones_like(x)
    (values, indices), (value_tangents, _) = jax.jvp(
        lambda x: jax_topk.top_k(x, 3), (x,), (tangent,)
    )
    np.testing.assert_array_equal(np.asarray(indices), [[1, 0, -1]])
    np.testing.assert_array_equal(np.asarray(value_tangents), [[1.0, 1.0, 0.0]])


# --- JAX behaviour: jit, vmap, scan; errors at trace time.


def test_vmap_and_scan(backend):
    rng = np.random.default_rng(19)
    x = jax.device_put(make("heavy_ties", rng, (3, 4, 500), "bfloat16"), device_for(backend))
    lengths = jnp.asarray(rng.integers(-1, 600, size=(3, 4)), jnp.int32)
    mapped = jax.vmap(lambda a, lens: jax_topk.top_k(a, 20, lengths=lens))(x, lengths)
    direct = jax_topk.top_k(x, 20, lengths=lengths)
    for a, b in zip(mapped, direct):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    mapped = jax.vmap(lambda a: jax_topk.top_k(a, 20))(x)  # no lengths: rows whole
    for a, b in zip(mapped, reference_top_k(np.asarray(x), 20)):
        assert_same_bits(np.asarray(a), b)

    def step(carry, rows):
        values, indices = jax_topk.top_k(rows, 20)
        return carry + jnp.sum(indices), values

    total, stacked = jax.lax.scan(step, jnp.int32(0), x)
    ref_values, ref_indices = reference_top_k(np.asarray(x), 20)
    assert int(total) == int(ref_indices.astype(np.int64).sum())
    assert_same_bits(np.asarray(stacked), ref_values)


def test_no_lengths_array_without_lengths():
    """top_k without lengths passes the kernels no [rows] array of n (building one inside
    jit costs a broadcast kernel per call): the custom call's lengths operand is the empty
    placeholder and its has_lengths attribute false; with lengths, the array is passed."""
    x = jnp.zeros((64, 300), jnp.float32)
    without = jax.jit(lambda a: jax_topk.top_k(a, 8)).lower(x).as_text()
    calls = [line for line in without.splitlines() if "custom_call @jax_topk" in line]
    assert len(calls) == 1 and "has_lengths = false" in calls[0]
    assert "tensor<64xi32>" not in without
    lengths = jnp.full((64,), 300, jnp.int32)
    given = jax.jit(lambda a, lens: jax_topk.top_k(a, 8, lengths=lens)).lower(x, lengths)
    calls = [line for line in given.as_text().splitlines() if "custom_call @jax_topk" in line]
    assert len(calls) == 1 and "has_lengths = true" in calls[0] and "tensor<64xi32>" in calls[0]


def raw_small_rows_call(x, lengths, has_lengths, indices_shape, values_shape=None):
    """top_k's small-rows custom call bound by hand (k = 8, values asked for), bypassing the
    shape rule: the handlers' own checks are what it meets."""
    results = (
        jax.ShapeDtypeStruct(indices_shape, jnp.int32),
        jax.ShapeDtypeStruct(values_shape or indices_shape, x.dtype),
    )
    absent_1d, absent_2d = jnp.zeros((0,), jnp.int32), jnp.zeros((0, 0), jnp.int32)
    return jax.ffi.ffi_call("jax_topk_small_rows", results)(
        x, lengths, absent_2d, absent_1d, absent_1d,
        k=np.int32(8), log2_page_size=np.int32(0), sorted=True, has_page_table=False,
        has_table_rows=False, has_num_valid_rows=False, with_values=True,
        has_lengths=has_lengths,
    )  # fmt: skip


def test_handler_checks_lengths_only_when_given():
    """The handlers re-check what the shape rule checks, for a caller that bypasses it: with
    has_lengths true, lengths of another size than the rows (empty included) are an error;
    with has_lengths false the operand is a placeholder, never read. A raw custom call on the
    CPU, against top_k."""
    x = jnp.asarray(np.random.default_rng(3).standard_normal((4, 64)), jnp.float32)

    def call(lengths, has_lengths):
        return raw_small_rows_call(x, lengths, has_lengths, indices_shape=(4, 8))

    cpu = jax.devices("cpu")[0]
    with jax.default_device(cpu):
        for size in (0, 3):
            with pytest.raises(Exception, match=f"lengths has {size} entries for 4 rows"):
                jax.block_until_ready(call(jnp.zeros((size,), jnp.int32), True))
        want_values, want_indices = jax_topk.top_k(x, 8)
        for size in (0, 3):
            indices, values = call(jnp.zeros((size,), jnp.int32), False)
            np.testing.assert_array_equal(np.asarray(indices), np.asarray(want_indices))
            assert_same_bits(np.asarray(values), np.asarray(want_values))


def test_handler_checks_the_indices_result():
    """A raw custom call whose indices result is not [rows, k] is refused by the handler
    (it would write past the result), as a wrong values result is; on the CPU."""
    x = jnp.zeros((4, 64), jnp.float32)
    no_lengths = jnp.zeros((0,), jnp.int32)
    for indices_shape, values_shape, message in (
        ((4, 7), (4, 8), r"indices result must be \[4, 8\]"),
        ((4, 8), (4, 7), r"values must be \[4, 8\]"),
    ):
        with jax.default_device(jax.devices("cpu")[0]), pytest.raises(Exception, match=message):
            jax.block_until_ready(
                raw_small_rows_call(x, no_lengths, False, indices_shape, values_shape)
            )


def test_trace_time_errors():
    x = jnp.zeros((2, 10), jnp.float32)
    with pytest.raises(ValueError, match=r"k=11.*n=10"):
        jax_topk.top_k(x, 11)
    with pytest.raises(ValueError, match=r"k=0"):
        jax_topk.top_k(x, 0)
    with pytest.raises(TypeError, match=r"k must be a Python int"):
        jax_topk.top_k(x, 2.0)
    with pytest.raises(TypeError, match=r"complex64"):
        jax_topk.top_k(x.astype(jnp.complex64), 2)
    with pytest.raises(ValueError, match=r"lengths has shape \(3,\)"):
        jax_topk.top_k(x, 2, lengths=jnp.zeros(3, jnp.int32))
    with pytest.raises(ValueError, match=r"at least one dimension"):
        jax_topk.top_k(jnp.float32(1.0), 1)
    with pytest.raises(TypeError, match=r"sorted must be a Python bool"):
        jax_topk.top_k(x, 2, sorted=None)
    with pytest.raises(ValueError, match=r"axis=2 is out of range.*2 dimensions.*-2 <= axis < 2"):
        jax_topk.top_k(x, 2, axis=2)
    with pytest.raises(ValueError, match=r"axis=-3 is out of range"):
        jax_topk.top_k(x, 2, axis=-3)
    with pytest.raises(TypeError, match=r"axis must be a Python int, got 1.0"):
        jax_topk.top_k(x, 2, axis=1.0)
    with pytest.raises(TypeError, match=r"axis must be a Python int, got True"):
        jax_topk.top_k(x, 2, axis=True)
    with pytest.raises(ValueError, match=r"k=3 .* n=2"):  # n is the chosen axis's length
        jax_topk.top_k(x, 3, axis=0)
    with pytest.raises(TypeError, match=r"is_stable must be a Python bool"):
        jax_topk.top_k(x, 2, is_stable="yes")
    with pytest.raises(TypeError, match=r"complex64"):  # the dtype before the shape
        jax_topk.top_k(jnp.complex64(1.0), 1)
    with pytest.raises(TypeError, match=r"axis must be a Python int, got 'x'"):
        jax_topk.top_k(jnp.float32(1.0), 1, axis="x")
    with pytest.raises(ValueError, match=r"shape \(2,\), expected \(10,\).*without axis"):
        jax_topk.top_k(x, 2, axis=0, lengths=jnp.zeros(2, jnp.int32))


def test_bfloat16_float16_dtypes_are_kept():
    x = jnp.asarray(np.arange(12, dtype=np.float32).reshape(2, 6))
    for dtype in (jnp.bfloat16, jnp.float16, jnp.float32):
        values, indices = jax_topk.top_k(x.astype(dtype), 2)
        assert values.dtype == dtype and indices.dtype == jnp.int32
    assert np.dtype(ml_dtypes.bfloat16) == jnp.bfloat16


def test_no_nan_reported_under_debug_nans(backend):
    """jax_debug_nans (op by op, outside jit) sees no NaN where none goes in or comes out:
    the rounds' NaN masks (k > 2048) stay inside one jitted computation, and a float8
    without inf does not pass its empty slots through a cast of -inf (NaN there)."""
    device = device_for(backend)
    x = jax.device_put(jnp.arange(3000.0, dtype=jnp.float32)[None], device)
    e4m3 = jax.device_put(jnp.ones((1, 4), jnp.float8_e4m3fn), device)
    with jax.debug_nans(True):
        values, indices = jax_topk.top_k(x, 2100)
        assert int(indices[0, 0]) == 2999 and int(indices[0, -1]) == 900
        jax.grad(lambda v: jax_topk.top_k(v, 2100)[0].sum())(x)
        values, indices = jax_topk.top_k(e4m3, 2, lengths=jnp.array([1]))
        np.testing.assert_array_equal(np.asarray(indices), [[0, -1]])
        assert float(values[0, 1]) == -448.0  # e4m3fn's lowest: its empty value
        merged, _ = jax_topk.merge_topk(e4m3, jnp.array([[0, -1, -1, -1]], jnp.int32), 2)
        assert float(merged[0, 1]) == -448.0
