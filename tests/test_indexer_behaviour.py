"""The lightning indexer's JAX behaviour (docs/contract.md sections 6 and 9): vmap over a
batch of sequences, jit, scan and cond, grad through a gather, and the trace-time errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_topk
from jax_topk import _indexer_gradient
from jax_topk._indexer_contract import LOGITS, TOPK, IndexerParams
from tests.support.bits import assert_same_bits
from tests.support.indexer import FP8, logits_then_topk, make_inputs
from tests.support.operators import K_ERRORS, PAGE_TABLE_ERRORS, permuted_page_table

BATCH, QUERIES, HEADS, HEAD_DIM, KEYS = 3, 5, 2, 16, 300


def _sequences(rng, dtype=None):
    parts = [
        make_inputs(
            rng, QUERIES, HEADS, HEAD_DIM, KEYS, **({} if dtype is None else {"dtype": dtype})
        )
        for _ in range(BATCH)
    ]
    q, keys, weights = (np.stack(p) for p in zip(*parts))
    lengths = rng.integers(-2, KEYS + 3, size=(BATCH, QUERIES)).astype(np.int32)
    return q, keys, weights, lengths


@pytest.fixture(params=["cpu", "fallback"])
def backend(request):
    from jax_topk import _lowering

    with _lowering.forced_fallback(request.param == "fallback"):
        yield request.param


def test_vmap_matches_loop(backend):
    rng = np.random.default_rng(40)
    q, keys, weights, lengths = _sequences(rng, FP8)
    key_scales = rng.uniform(0.1, 2.0, size=(BATCH, KEYS)).astype(np.float32)
    logits = jax.vmap(lambda *a: jax_topk.indexer_logits(*a[:4], key_scales=a[4]))(
        q, keys, weights, lengths, key_scales
    )
    picked = jax.jit(
        jax.vmap(lambda *a: jax_topk.indexer_topk(*a[:4], k=40, key_scales=a[4], sorted=True))
    )(q, keys, weights, lengths, key_scales)
    for b in range(BATCH):
        one = jax_topk.indexer_logits(
            q[b], keys[b], weights[b], lengths[b], key_scales=key_scales[b]
        )
        np.testing.assert_array_equal(np.asarray(logits[b]), np.asarray(one))
        np.testing.assert_array_equal(
            np.asarray(picked[b]),
            np.asarray(
                logits_then_topk(
                    q[b],
                    keys[b],
                    weights[b],
                    lengths[b],
                    key_scales=key_scales[b],
                    k=40,
                    sorted=True,
                )
            ),
        )


def test_vmap_unmapped_keys_broadcast(backend):
    rng = np.random.default_rng(41)
    q, keys, weights, lengths = _sequences(rng)
    fn = jax.vmap(lambda a, c, d: jax_topk.indexer_topk(a, keys[0], c, d, k=16), in_axes=(1, 1, 1))
    out = jax.jit(fn)(q.swapaxes(0, 1), weights.swapaxes(0, 1), lengths.swapaxes(0, 1))
    for b in range(BATCH):  # mapped over axis 1 (the sequences), one keys for all
        want = logits_then_topk(q[b], keys[0], weights[b], lengths[b], k=16)
        np.testing.assert_array_equal(np.asarray(out[b]), np.asarray(want))


def test_vmap_num_valid_rows_and_page_tables(backend):
    rng = np.random.default_rng(42)
    q, keys, weights, lengths = _sequences(rng)
    page_size, pages = 8, KEYS // 8 + 1
    valid = np.array([0, 3, 9], np.int32)
    tables = np.stack([permuted_page_table(rng, 2, pages) for _ in range(BATCH)])
    table_rows = rng.integers(-1, 4, size=(BATCH, QUERIES)).astype(np.int32)
    per_row = np.stack([permuted_page_table(rng, QUERIES, pages) for _ in range(BATCH)])

    def fn(a, b, c, d, v, t, tr):
        return jax_topk.indexer_topk(
            a, b, c, d, k=24, num_valid_rows=v, page_table=t, page_size=page_size, table_rows=tr
        )

    out = jax.jit(jax.vmap(fn))(q, keys, weights, lengths, valid, tables, table_rows)
    shared = jax.jit(jax.vmap(fn, in_axes=(0, 0, 0, 0, 0, None, 0)))(
        q, keys, weights, lengths, valid, tables[0], table_rows
    )
    rows = jax.jit(
        jax.vmap(
            lambda a, b, c, d, t: jax_topk.indexer_topk(
                a, b, c, d, k=24, page_table=t, page_size=page_size
            )
        )
    )(q, keys, weights, lengths, per_row)
    for b in range(BATCH):
        args = (q[b], keys[b], weights[b], lengths[b])
        common = dict(k=24, page_size=page_size)
        want = logits_then_topk(
            *args, num_valid_rows=valid[b], page_table=tables[b], table_rows=table_rows[b], **common
        )
        np.testing.assert_array_equal(np.asarray(out[b]), np.asarray(want))
        want = logits_then_topk(
            *args, num_valid_rows=valid[b], page_table=tables[0], table_rows=table_rows[b], **common
        )
        np.testing.assert_array_equal(np.asarray(shared[b]), np.asarray(want))
        want = logits_then_topk(*args, page_table=per_row[b], **common)
        np.testing.assert_array_equal(np.asarray(rows[b]), np.asarray(want))


def test_scan_and_cond(backend):
    rng = np.random.default_rng(43)
    q, keys, weights, lengths = _sequences(rng)

    def step(carry, xs):
        a, b, c, d = xs
        picked = jax.lax.cond(
            carry > 1,
            lambda: jax_topk.indexer_topk(a, b, c, d, k=8),
            lambda: jax_topk.indexer_topk(a, b, c, d, k=8, sorted=True),
        )
        return carry + 1, picked

    _, out = jax.jit(lambda *xs: jax.lax.scan(step, 0, xs))(q, keys, weights, lengths)
    for i in range(BATCH):
        want = logits_then_topk(q[i], keys[i], weights[i], lengths[i], k=8, sorted=i <= 1)
        np.testing.assert_array_equal(np.asarray(out[i]), np.asarray(want))


def test_grad_through_gather(backend):
    rng = np.random.default_rng(44)
    q, keys, weights, lengths = (x[0] for x in _sequences(rng))
    lengths = np.full(QUERIES, KEYS, np.int32)
    dense = rng.standard_normal((QUERIES, KEYS)).astype(np.float32)

    def loss(w):
        idx = jax_topk.indexer_topk(q, keys, w, lengths, k=5)
        return (jnp.take_along_axis(jnp.asarray(dense), idx, axis=1) * w[:, :1]).sum()

    grad = jax.jit(jax.grad(loss))(weights)
    idx = np.asarray(jax_topk.indexer_topk(q, keys, weights, lengths, k=5))
    expected = np.zeros_like(weights)
    expected[:, 0] = np.take_along_axis(dense, idx, axis=1).sum(axis=1)
    np.testing.assert_allclose(grad, expected, rtol=1e-6)
    _, tangent = jax.jvp(
        lambda w: jax_topk.indexer_topk(q, keys, w, lengths, k=5),
        (jnp.asarray(weights),),
        (jnp.ones_like(weights),),
    )
    assert tangent.dtype == jax.dtypes.float0


def force_spans(monkeypatch, queries, heads, keys_per_span):
    """indexer_logits' tangent formed `keys_per_span` keys a span (of one sequence)."""
    monkeypatch.setattr(_indexer_gradient, "MIN_SPAN_KEYS", 1)
    monkeypatch.setattr(_indexer_gradient, "SPAN_ELEMENTS", queries * heads * keys_per_span)


@pytest.mark.parametrize("spans", ["one span", "32 spans of 3 keys"])
@pytest.mark.parametrize("scaled", [True, False], ids=["key_scales", "no_key_scales"])
def test_logits_gradients_match_dense_jax(backend, spans, scaled, monkeypatch):
    """indexer_logits' JVP (the pure-JAX logits' tangent, formed a span of keys at a time):
    gradients into q, keys, weights and key_scales equal those of a dense JAX evaluation on
    the same bfloat16-rounded inputs, whole or in 32 strided spans."""
    if spans != "one span":
        force_spans(monkeypatch, 4, 3, 3)
    rng = np.random.default_rng(45)
    n = 96
    q, keys, weights = (np.asarray(x, np.float32) for x in make_inputs(rng, 4, 3, 16, n))
    key_scales = rng.uniform(0.5, 2.0, size=n).astype(np.float32)
    if not scaled:
        key_scales = np.ones(n, np.float32)
    lengths = np.array([0, 1, 45, 200], np.int32)
    cotangent = rng.standard_normal((4, n)).astype(np.float32)
    visible = np.arange(n)[None, :] < np.clip(lengths, 0, n)[:, None]

    def ours(q, keys, weights, key_scales):
        bf16 = jnp.bfloat16
        logits = jax_topk.indexer_logits(
            q.astype(bf16),
            keys.astype(bf16),
            weights,
            lengths,
            key_scales=key_scales if scaled else None,
        )
        return (jnp.where(visible, logits, 0.0) * cotangent).sum()

    def dense(q, keys, weights, key_scales):
        dots = jnp.einsum("mhd,nd->mhn", q, keys, precision="highest") * key_scales
        logits = jnp.einsum("mh,mhn->mn", weights, jnp.maximum(dots, 0.0), precision="highest")
        return (jnp.where(visible, logits, 0.0) * cotangent).sum()

    args = (q, keys, weights, key_scales)
    got = jax.jit(jax.grad(ours, argnums=(0, 1, 2, 3)))(*args)
    want = jax.grad(dense, argnums=(0, 1, 2, 3))(*args)
    names = ("q", "keys", "weights", "key_scales") if scaled else ("q", "keys", "weights")
    for name, a, b in zip(names, got, want):
        # q and keys' cotangents pass through the cast to bfloat16 (rounded to 8 bits).
        tolerance = 1e-2 if name in ("q", "keys") else 1e-5
        scale = np.abs(np.asarray(b)).max()
        np.testing.assert_allclose(a, b, rtol=tolerance, atol=tolerance * scale, err_msg=name)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float8_e4m3fn], ids=["bf16", "fp8"])
def test_q_gradient_summed_over_spans_in_float32(dtype, monkeypatch):
    """q's gradient through 1024 spans of keys equals the one-span gradient within one step
    of q's dtype: the spans' parts add in float32 and round once (adding them in bf16 or
    fp8 drifted 17 % and 91 % of the largest entry here)."""
    rng = np.random.default_rng(47)
    queries, heads, head_dim, n = 2, 2, 16, 8192
    q = rng.standard_normal((queries, heads, head_dim)).astype(np.float32)
    keys = jnp.asarray(rng.standard_normal((n, head_dim)), dtype)
    # Small weights: q's gradient (~ w x the sum of 4096 keys) stays within fp8's 448.
    weights = (np.abs(rng.standard_normal((queries, heads))) / 64).astype(np.float32)

    def loss(q):
        return jax_topk.indexer_logits(q.astype(dtype), keys, weights).sum()

    whole = np.asarray(jax.jit(jax.grad(loss))(q))
    assert np.isfinite(whole).all() and np.abs(whole).max() > 1
    force_spans(monkeypatch, queries, heads, 8)
    assert _indexer_gradient.span_count(1, queries, heads, n) == 1024
    spans = np.asarray(jax.jit(jax.grad(loss))(q))
    step = 2.0 ** -(jnp.finfo(dtype).nmant)  # one step relative to the value
    np.testing.assert_allclose(spans, whole, rtol=step, atol=step * np.abs(whole).max() / 64)


def test_logits_gradient_never_holds_every_product():
    """jax.grad of a dense loss through indexer_logits at 64 queries x 64 heads x 65536 keys
    compiles to temporaries far below the 1 GiB of [M, H, N] float32 products: the tangent's
    products are formed a span of keys at a time and formed again running back."""
    queries, heads, head_dim, keys_count = 64, 64, 128, 65536
    products_bytes = 4 * queries * heads * keys_count

    def loss(q, keys, weights):
        return jax_topk.indexer_logits(q, keys, weights).sum()

    shapes = (
        jax.ShapeDtypeStruct((queries, heads, head_dim), jnp.bfloat16),
        jax.ShapeDtypeStruct((keys_count, head_dim), jnp.bfloat16),
        jax.ShapeDtypeStruct((queries, heads), jnp.float32),
    )
    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    with jax.default_device(jax.devices("cpu")[0]):
        memory = grad.lower(*shapes).compile().memory_analysis()
    assert memory.temp_size_in_bytes < products_bytes // 2, memory  # unsplit: ~3x more


def test_vmap_and_grad_without_lengths(backend):
    """indexer_logits without lengths (an unbatched placeholder under vmap, a pure-JAX
    tangent without a mask) equals the call with lengths of N: logits and gradients."""
    rng = np.random.default_rng(46)
    q, keys, weights, _ = _sequences(rng)
    whole = np.full((BATCH, QUERIES), KEYS, np.int32)
    got = jax.jit(jax.vmap(jax_topk.indexer_logits))(q, keys, weights)
    assert_same_bits(got, jax.jit(jax.vmap(jax_topk.indexer_logits))(q, keys, weights, whole))

    def loss(q32, w, *lengths):
        return jax_topk.indexer_logits(q32.astype(jnp.bfloat16), keys[0], w, *lengths).sum()

    grad = jax.jit(jax.grad(loss, argnums=(0, 1)))
    q32 = np.asarray(q[0], np.float32)
    for a, b in zip(grad(q32, weights[0]), grad(q32, weights[0], whole[0])):
        assert_same_bits(a, b)


def _raw_indexer_call(op, result_shape, has_lengths, lengths):
    """An indexer custom call bound by hand on the CPU (bf16, M = 4, H = 2, D = 16, N = 64),
    bypassing the shape rule: the handler's own checks are what it meets."""
    absent = [jnp.zeros((0,) * ndim, jnp.int32) for ndim in (3, 2, 1)]  # table, rows, limits
    operands = (
        jnp.zeros((1, 4, 2, 16), jnp.bfloat16),
        jnp.zeros((1, 64, 16), jnp.bfloat16),
        jnp.ones((1, 4, 2), jnp.float32),
        jnp.zeros((0, 0), jnp.float32),  # no key scales
        lengths,
        *absent,
    )
    params = IndexerParams(op=op, has_key_scales=False, has_lengths=has_lengths, k=8)
    dtype = jnp.float32 if op == LOGITS else jnp.int32
    call = jax.ffi.ffi_call(params.target, jax.ShapeDtypeStruct(result_shape, dtype))
    with jax.default_device(jax.devices("cpu")[0]):
        return np.asarray(jax.block_until_ready(call(*operands, **params.ffi_attributes())))


def test_handlers_check_the_lengths_they_are_told_of():
    """Bound by hand: indexer_logits ignores a lengths array when has_lengths is false (lengths
    of 0 would make every logit -inf; every key is scored: +0, relu(0) summed), reads it when
    true, and refuses one of the wrong size; indexer_topk refuses a call without lengths."""
    zero_lengths, no_lengths = jnp.zeros((1, 4), jnp.int32), jnp.zeros((0, 0), jnp.int32)
    for lengths in (zero_lengths, no_lengths):
        logits = _raw_indexer_call(LOGITS, (1, 4, 64), False, lengths)
        assert_same_bits(logits, np.zeros((1, 4, 64), np.float32))
    logits = _raw_indexer_call(LOGITS, (1, 4, 64), True, zero_lengths)
    assert_same_bits(logits, np.full((1, 4, 64), -np.inf, np.float32))
    with pytest.raises(Exception, match="lengths or key_scales do not match"):
        _raw_indexer_call(LOGITS, (1, 4, 64), True, no_lengths)
    with pytest.raises(Exception, match="indexer_topk needs lengths"):
        _raw_indexer_call(TOPK, (1, 4, 8), False, zero_lengths)


# --- errors (docs/contract.md sections 5 and 9) --------------------------------------------


def _args(**overrides):
    args = dict(
        q=jnp.zeros((4, 2, 16), jnp.bfloat16),
        keys=jnp.zeros((64, 16), jnp.bfloat16),
        weights=jnp.zeros((4, 2), jnp.float32),
        lengths=jnp.zeros((4,), jnp.int32),
    )
    args.update(overrides)
    return args


@pytest.mark.parametrize("op", ["indexer_logits", "indexer_topk"])
@pytest.mark.parametrize(
    "overrides,error,words",
    [
        (dict(q=jnp.zeros((4, 2, 16), jnp.float32)), TypeError, ["q", "float32", "bfloat16"]),
        (dict(keys=jnp.zeros((64, 16), jnp.float8_e4m3fn)), TypeError, ["keys", "float8_e4m3fn"]),
        (dict(q=jnp.zeros((4, 16), jnp.bfloat16)), ValueError, ["q", "[M, H, D]", "(4, 16)"]),
        (dict(keys=jnp.zeros((64, 8), jnp.bfloat16)), ValueError, ["keys", "D=16", "(64, 8)"]),
        (dict(keys=jnp.zeros((0, 16), jnp.bfloat16)), ValueError, ["N=0", "1 <= N"]),
        (dict(weights=jnp.zeros((4, 3), jnp.float32)), ValueError, ["weights", "(4, 3)", "(4, 2)"]),
        (dict(weights=jnp.zeros((4, 2), jnp.bfloat16)), TypeError, ["weights", "float32"]),
        (dict(key_scales=jnp.zeros((63,), jnp.float32)), ValueError, ["key_scales", "(63,)"]),
        (dict(key_scales=jnp.zeros((64,), jnp.float16)), TypeError, ["key_scales", "float16"]),
        (dict(lengths=jnp.zeros((5,), jnp.int32)), ValueError, ["lengths", "(5,)", "(4,)"]),
        (dict(lengths=jnp.zeros((4,), jnp.float32)), TypeError, ["lengths", "float32"]),
    ],
)
def test_input_errors(op, overrides, error, words):
    args = _args(**overrides)
    with pytest.raises(error) as info:
        jax.jit(lambda: getattr(jax_topk, op)(**args)).lower()
    for word in words:
        assert word in str(info.value), (word, str(info.value))
    assert op in str(info.value)


@pytest.mark.parametrize(
    "overrides,error,words",
    K_ERRORS
    + PAGE_TABLE_ERRORS
    + [
        (dict(sorted=1), TypeError, ["sorted"]),
        (dict(num_valid_rows=jnp.zeros((2,), jnp.int32)), ValueError, ["num_valid_rows", "scalar"]),
    ],
)
def test_selection_errors(overrides, error, words):
    args = _args(**overrides)
    with pytest.raises(error) as info:
        jax.jit(lambda: jax_topk.indexer_topk(**args)).lower()
    for word in words:
        assert word in str(info.value), (word, str(info.value))
    assert "indexer_topk" in str(info.value)


def test_n_limit():
    too_long = jax.ShapeDtypeStruct((2**31, 16), jnp.bfloat16)
    with pytest.raises(ValueError, match="2147483647"):
        jax.eval_shape(
            lambda k: jax_topk.indexer_logits(
                jnp.zeros((1, 1, 16), jnp.bfloat16), k, jnp.zeros((1, 1), jnp.float32)
            ),
            too_long,
        )
