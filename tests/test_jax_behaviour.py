"""docs/contract.md section 6 (jit, vmap, scan, cond, grad) and section 5 (trace-time errors)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_topk
from tests.support.bits import assert_same_bits
from tests.support.operators import (
    K_ERRORS,
    OPS,
    PAGE_TABLE_ERRORS,
    SCORE_DTYPES,
    make_scores,
    permuted_page_table,
)
from tests.support.reference import reference_topk


def test_vmap_matches_loop(op):
    rng = np.random.default_rng(20)
    scores = make_scores(op, rng, (3, 5, 200))
    lengths = rng.integers(-3, 210, size=(3, 5)).astype(np.int32)
    out = jax.vmap(lambda s, lens: OPS[op](s, lens, k=16))(scores, lengths)
    np.testing.assert_array_equal(out, reference_topk(scores, lengths, 16))


def test_vmap_unmapped_lengths_and_other_axis(op):
    rng = np.random.default_rng(21)
    scores = make_scores(op, rng, (5, 4, 100))  # mapped over axis 1
    lengths = np.array([100, 3, 0, 64, 99], np.int32)
    out = jax.vmap(lambda s: OPS[op](s, lengths, k=8), in_axes=1)(scores)
    expected = np.stack([reference_topk(scores[:, b], lengths, 8) for b in range(4)])
    np.testing.assert_array_equal(out, expected)


def test_vmap_num_valid_rows_per_call(op):
    rng = np.random.default_rng(22)
    scores = make_scores(op, rng, (4, 6, 90))
    lengths = np.full((4, 6), 90, np.int32)
    valid = np.array([0, 2, 6, 9], np.int32)
    out = jax.jit(jax.vmap(lambda s, lens, v: OPS[op](s, lens, k=5, num_valid_rows=v)))(
        scores, lengths, valid
    )
    for b in range(4):
        np.testing.assert_array_equal(
            out[b], reference_topk(scores[b], lengths[b], 5, num_valid_rows=valid[b])
        )


def test_vmap_page_table_with_table_rows(op):
    rng = np.random.default_rng(23)
    batch, rows, n, page_size = 3, 4, 128, 8
    scores = make_scores(op, rng, (batch, rows, n))
    lengths = rng.integers(0, n + 1, size=(batch, rows)).astype(np.int32)
    tables = np.stack([permuted_page_table(rng, 2, n // page_size) for _ in range(batch)])
    table_rows = rng.integers(-1, 4, size=(batch, rows)).astype(np.int32)

    def fn(s, lens, t, tr):
        return OPS[op](s, lens, k=12, page_table=t, page_size=page_size, table_rows=tr)

    out = jax.vmap(fn)(scores, lengths, tables, table_rows)
    for b in range(batch):
        expected = reference_topk(
            scores[b],
            lengths[b],
            12,
            page_table=tables[b],
            page_size=page_size,
            table_rows=table_rows[b],
        )
        np.testing.assert_array_equal(out[b], expected)
    shared = jax.vmap(fn, in_axes=(0, 0, None, 0))(scores, lengths, tables[0], table_rows)
    for b in range(batch):
        expected = reference_topk(
            scores[b],
            lengths[b],
            12,
            page_table=tables[0],
            page_size=page_size,
            table_rows=table_rows[b],
        )
        np.testing.assert_array_equal(shared[b], expected)


def test_scan_and_cond(op):
    rng = np.random.default_rng(24)
    scores = make_scores(op, rng, (5, 3, 64))
    lengths = np.full((5, 3), 50, np.int32)

    def step(carry, xs):
        s, lens = xs
        picked = jax.lax.cond(
            carry > 2, lambda: OPS[op](s, lens, k=4), lambda: OPS[op](s, lens, k=4, sorted=True)
        )
        return carry + 1, picked

    _, out = jax.jit(lambda s, lens: jax.lax.scan(step, 0, (s, lens)))(scores, lengths)
    for i in range(5):
        np.testing.assert_array_equal(
            out[i], reference_topk(scores[i], lengths[i], 4, sorted=i <= 2)
        )


def test_grad_through_gather(op):
    rng = np.random.default_rng(25)
    scores = make_scores(op, rng, (4, 50)).astype(np.float32)
    lengths = np.full(4, 50, np.int32)

    def loss(x):
        idx = OPS[op](x.astype(SCORE_DTYPES[op]), lengths, k=5)
        return jnp.take_along_axis(x, idx, axis=1).sum()

    grad = jax.jit(jax.grad(loss))(scores)
    idx = reference_topk(scores.astype(SCORE_DTYPES[op]), lengths, 5)
    expected = np.zeros_like(scores)
    np.put_along_axis(expected, idx, 1.0, axis=1)
    np.testing.assert_array_equal(grad, expected)
    _, tangent = jax.jvp(
        lambda x: OPS[op](x, lengths, k=5),
        (jnp.asarray(scores.astype(SCORE_DTYPES[op])),),
        (jnp.ones_like(scores, SCORE_DTYPES[op]),),
    )
    assert tangent.dtype == jax.dtypes.float0


# --- errors (docs/contract.md section 5) ---------------------------------------------------


def _call(op, **overrides):
    args = dict(scores=jnp.zeros((4, 64), SCORE_DTYPES[op]), lengths=jnp.zeros((4,), jnp.int32))
    args.update(overrides)
    scores, lengths = args.pop("scores"), args.pop("lengths")
    return OPS[op](scores, lengths, **args)


@pytest.mark.parametrize(
    "overrides,error,words",
    K_ERRORS
    + [
        (dict(lengths=jnp.zeros((5,), jnp.int32)), ValueError, ["lengths", "(5,)", "(4,)"]),
        (dict(lengths=jnp.zeros((4,), jnp.float32)), TypeError, ["lengths", "float32"]),
    ]
    + PAGE_TABLE_ERRORS
    + [
        (
            dict(
                scores=jnp.zeros((2, 3, 64)), lengths=jnp.zeros((2, 3), jnp.int32), num_valid_rows=1
            ),
            None,
            ["num_valid_rows", "2-D"],
        ),
    ],
)
def test_errors(op, overrides, error, words):
    if "scores" in overrides:
        overrides["scores"] = overrides["scores"].astype(SCORE_DTYPES[op])
    with pytest.raises(error or ValueError) as info:
        jax.jit(lambda: _call(op, **overrides)).lower()
    for word in words:
        assert word in str(info.value), (word, str(info.value))
    assert op in str(info.value)


def test_missing_lengths_are_named(op):
    with pytest.raises(TypeError, match=rf"{op}: lengths is required.*jnp.full"):
        OPS[op](jnp.zeros((2, 8), SCORE_DTYPES[op]), None)
    q = jnp.ones((3, 2, 8), jnp.bfloat16)
    keys, weights = jnp.ones((50, 8), jnp.bfloat16), jnp.ones((3, 2), jnp.float32)
    with pytest.raises(TypeError, match=r"indexer_topk: lengths is required"):
        jax_topk.indexer_topk(q, keys, weights, None, k=4)
    with pytest.raises(ValueError, match=r"lengths has shape \(2,\), expected \(3,\).*q's M"):
        jax_topk.indexer_logits(q, keys, weights, jnp.zeros(2, jnp.int32))


def test_indexer_head_limits_are_named():
    keys, weights = jnp.ones((5, 8), jnp.bfloat16), jnp.ones((1, 2049), jnp.float32)
    with pytest.raises(ValueError, match=r"indexer_logits: q has H=2049 heads of D=8.*H <= 2048"):
        jax.eval_shape(jax_topk.indexer_logits, jnp.ones((1, 2049, 8), jnp.bfloat16), keys, weights)
    keys = jnp.ones((5, 8193), jnp.bfloat16)
    with pytest.raises(ValueError, match=r"D=8193.*D <= 8192"):
        jax.eval_shape(
            jax_topk.indexer_logits,
            jnp.ones((1, 1, 8193), jnp.bfloat16),
            keys,
            jnp.ones((1, 1), jnp.float32),
        )


def test_dtype_errors_point_to_the_other_operator():
    with pytest.raises(TypeError, match="topk_filtered"):
        jax_topk.topk_bf16(jnp.zeros((2, 8), jnp.float32), jnp.zeros(2, jnp.int32))
    with pytest.raises(TypeError, match="topk_filtered.*float32 or bfloat16 or float16"):
        jax_topk.topk_filtered(jnp.zeros((2, 8), jnp.int32), jnp.zeros(2, jnp.int32))


def test_width_limits():
    with pytest.raises(ValueError, match="16385.*16384"):
        jax_topk.topk_bf16(jnp.zeros((1, 16385), jnp.bfloat16), jnp.zeros(1, jnp.int32))
    too_wide = jax.ShapeDtypeStruct((1, 2**31), jnp.float32)
    with pytest.raises(ValueError, match="2147483647"):
        jax.eval_shape(lambda s: jax_topk.topk_filtered(s, jnp.zeros(1, jnp.int32)), too_wide)
    with pytest.raises(ValueError, match="n=0"):
        jax_topk.topk_filtered(jnp.zeros((1, 0), jnp.float32), jnp.zeros(1, jnp.int32))


def test_row_limit_of_topk_bf16():
    """topk_bf16 runs a thread block a row: more rows than the grid holds fail at trace time
    (vmapped calls counted), not at run time; top_k sends such rows elsewhere."""

    def call(scores, lengths):
        return jax_topk.topk_bf16(scores, lengths, k=1)

    rows = jax.ShapeDtypeStruct((2**31, 8), jnp.bfloat16)
    lengths = jax.ShapeDtypeStruct((2**31,), jnp.int32)
    with pytest.raises(ValueError, match="topk_bf16: 2147483648 rows.*2147483647"):
        jax.eval_shape(call, rows, lengths)
    batched = jax.ShapeDtypeStruct((2, 2**30, 8), jnp.bfloat16)
    batched_lengths = jax.ShapeDtypeStruct((2, 2**30), jnp.int32)
    with pytest.raises(ValueError, match="2147483648 rows"):
        jax.eval_shape(jax.vmap(call), batched, batched_lengths)
    most = jax.ShapeDtypeStruct((2**31 - 1, 8), jnp.bfloat16)
    most_lengths = jax.ShapeDtypeStruct((2**31 - 1,), jnp.int32)
    assert jax.eval_shape(call, most, most_lengths).shape == (2**31 - 1, 1)
    long_rows = jax.ShapeDtypeStruct((2**31, 2048), jnp.bfloat16)
    values, indices = jax.eval_shape(lambda x: jax_topk.top_k(x, 100), long_rows)
    assert values.shape == indices.shape == (2**31, 100)


def _exported_every_handler():
    """(jax.export of a function calling every handler for the CPU, its arguments, the
    function): top_k by two routes, merge_topk, both indexer operators, topk_filtered and
    topk_bf16. Asserts first that the export is refused without the disabled checks."""
    rng = np.random.default_rng(41)
    scores = rng.standard_normal((6, 3000)).astype(np.float32)
    lengths = np.array([3000, 0, 1, 2999, 100, 4000], np.int32)
    q = rng.standard_normal((6, 2, 32)).astype(jnp.bfloat16)
    keys = rng.standard_normal((500, 32)).astype(jnp.bfloat16)
    weights = rng.standard_normal((6, 2)).astype(np.float32)
    index_lengths = np.array([500, 10, 0, 499, 250, 1], np.int32)

    def every_handler(scores, lengths, q, keys, weights, index_lengths):
        values, columns = jax_topk.top_k(scores, 50, lengths=lengths)
        small = jax_topk.top_k(scores[:, :256], 8)
        merged = jax_topk.merge_topk(values, columns, 20)
        return (
            values,
            columns,
            *small,
            *merged,
            jax_topk.topk_filtered(scores, lengths, k=16),
            jax_topk.topk_bf16(scores.astype(jnp.bfloat16), lengths, k=16),
            jax_topk.indexer_logits(q, keys, weights, index_lengths),
            jax_topk.indexer_topk(q, keys, weights, index_lengths, k=64),
        )

    cpu = jax.devices("cpu")[0]
    args = [jax.device_put(a, cpu) for a in (scores, lengths, q, keys, weights, index_lengths)]
    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args]
    with pytest.raises(ValueError, match="custom calls"):
        jax.export.export(jax.jit(every_handler), platforms=["cpu"])(*shapes)
    exported = jax.export.export(
        jax.jit(every_handler),
        platforms=["cpu"],
        disabled_checks=jax_topk.export_disabled_checks(),
    )(*shapes)
    assert "custom_call @jax_topk" in exported.mlir_module()
    return exported, args, every_handler


def _assert_same_results(got, want):
    got, want = list(got), list(want)
    assert len(got) == len(want) == 10
    for g, w in zip(got, want):
        assert_same_bits(g, w)


def test_export_with_the_disabled_checks():
    """jax.export of every handler for the CPU: refused without
    jax_topk.export_disabled_checks(), and with them the exported call gives the same bits
    as the function itself."""
    exported, args, every_handler = _exported_every_handler()
    _assert_same_results(exported.call(*args), jax.jit(every_handler)(*args))


def test_export_serializes_and_reads_back():
    """The export above serialized and read back runs to the same bits (serialization needs
    the flatbuffers package, which the test extra installs)."""
    pytest.importorskip("flatbuffers")
    exported, args, every_handler = _exported_every_handler()
    restored = jax.export.deserialize(exported.serialize())
    _assert_same_results(restored.call(*args), jax.jit(every_handler)(*args))
