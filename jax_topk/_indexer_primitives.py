"""The lightning indexer's primitives, one per operator, and their JAX rules
(docs/contract.md section 9).

Each takes the `IndexerOperands` of `_indexer_contract` (a leading batch dim of sequences)
and the static `IndexerParams`, and returns one result. Rules: shape, batching (vmap adds
sequences to the batch dim: q, keys, weights, lengths and key_scales together, an unmapped
operand broadcast), JVP (indexer_topk's integer indices carry no tangent; indexer_logits'
tangent is that of the pure-JAX logits, formed a span of keys at a time by
`_indexer_gradient`, so that a dense loss never holds the [M, H, N] products at once; a
sparse training loss recomputes only the selected keys' logits in JAX), and lowering,
through `_indexer_sharding` on several devices.
"""

from __future__ import annotations

from functools import partial

import jax
from jax.extend import core
from jax.interpreters import ad, batching, mlir

from . import _compat
from ._batch_layout import mapped_first
from ._indexer_contract import LOGITS, TOPK, IndexerOperands, IndexerParams
from ._indexer_gradient import logits_by_key_spans
from ._indexer_lowering import indexer_call_p, native_operands
from ._indexer_sharding import partitioned_call


def _make_primitive(name: str) -> core.Primitive:
    primitive = core.Primitive(name)
    primitive.multiple_results = True
    return primitive


PRIMITIVES = {op: _make_primitive(f"jax_topk_{op}") for op in (LOGITS, TOPK)}


def _shape_rule(*avals, params: IndexerParams):
    return (params.result_aval(IndexerOperands(*avals)),)


def _present(params: IndexerParams) -> IndexerOperands:
    """Which operands are real arrays (the others are placeholders, never batched)."""
    return IndexerOperands(
        q=True,
        keys=True,
        weights=True,
        key_scales=params.has_key_scales,
        lengths=params.has_lengths,
        page_table=params.has_page_table,
        table_rows=params.has_table_rows,
        num_valid_rows=params.has_num_valid_rows,
    )


def _batch(args, dims, *, primitive, params: IndexerParams):
    """vmap: the mapped axis becomes more sequences of the batch dim."""
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)

    def fold(x, d, present):
        if not present:
            return x
        x = mapped_first(x, d, size)
        return x.reshape(size * x.shape[1], *x.shape[2:])

    batched = [fold(x, d, p) for x, d, p in zip(args, dims, _present(params))]
    (result,) = primitive.bind(*batched, params=params)
    return [result.reshape(size, -1, *result.shape[1:])], [0]


def _jvp(primals, tangents, *, primitive, params: IndexerParams):
    """Integer indices carry no tangent: a symbolic zero of their (float0) tangent type."""
    del tangents
    results = primitive.bind(*primals, params=params)
    return results, [ad.Zero(jax.core.ShapedArray(r.shape, jax.dtypes.float0)) for r in results]


def _logits_jvp(primals, tangents, *, primitive, params: IndexerParams):
    """The handler's logits; as tangent, the pure-JAX logits' tangent in q, keys, weights
    and key_scales (relu's derivative taken where the pure-JAX dots are positive)."""
    (logits,) = primitive.bind(*primals, params=params)
    operands, tangents = IndexerOperands(*primals), IndexerOperands(*tangents)

    def pure_logits(q, keys, weights, key_scales):
        lengths = operands.lengths if params.has_lengths else None
        return logits_by_key_spans(
            q, keys, weights, key_scales, lengths, has_key_scales=params.has_key_scales
        )

    differentiable = ("q", "keys", "weights", "key_scales")
    _, tangent = jax.jvp(
        pure_logits,
        tuple(getattr(operands, name) for name in differentiable),
        tuple(ad.instantiate_zeros(getattr(tangents, name)) for name in differentiable),
    )
    return [logits], [tangent]


def _direct_call(*operands, params: IndexerParams):
    operands = native_operands(IndexerOperands(*operands), params)
    return indexer_call_p.bind(*operands, params=params)


def _lowering(ctx, *operands, params: IndexerParams):
    # One device: nothing to partition, call the kernel directly.
    if _compat.lowering_num_devices(ctx) == 1:
        call = partial(_direct_call, params=params)
    else:
        call = partial(partitioned_call, params=params)
    return mlir.lower_fun(call, multiple_results=True)(ctx, *operands)


for _op, _primitive in PRIMITIVES.items():
    _compat.define_eager_impl(_primitive)
    _primitive.def_abstract_eval(_shape_rule)
    batching.primitive_batchers[_primitive] = partial(_batch, primitive=_primitive)
    jvp = _jvp if _op == TOPK else _logits_jvp
    ad.primitive_jvps[_primitive] = partial(jvp, primitive=_primitive)
    mlir.register_lowering(_primitive, _lowering)
    _compat.require_devices_during_lowering(_primitive)
