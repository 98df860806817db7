"""The public primitives, one per operator, and their JAX rules.

Each primitive takes 2-D operands (scores [rows, n], lengths [rows], the optional
page-table operands, num_valid_rows [groups]: one limit per equal group of consecutive
rows) and returns int32 [rows, k]. Absent
optional operands are empty placeholders flagged by has_* parameters. Rules: shape
(abstract evaluation), batching (vmap folds the batch into the rows), JVP (integer
output: no gradient), and lowering through the row-sharding partitioner.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax.extend import core
from jax.interpreters import ad, batching, mlir
from jax._src import dispatch

from ._checks import output_shape
from ._lowering import ffi_call_p
from ._sharding import partitioned_call

topk_bf16_p = core.Primitive("jax_topk_bf16")
topk_filtered_p = core.Primitive("jax_topk_filtered")
PRIMITIVES = {"topk_bf16": topk_bf16_p, "topk_filtered": topk_filtered_p}


def _batch(args, dims, *, primitive, **params):
    """vmap: the mapped axis becomes more rows (and more num_valid_rows groups)."""
    scores, lengths, page_table, table_rows, num_valid_rows = args
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)

    def lead(x, d):  # mapped axis first; unmapped operands broadcast
        if d is None:
            return jnp.broadcast_to(x, (size, *x.shape))
        return jnp.moveaxis(x, d, 0)

    scores = lead(scores, dims[0])
    rows, n = scores.shape[1:]
    scores = scores.reshape(size * rows, n)
    lengths = lead(lengths, dims[1]).reshape(size * rows)
    if params["has_page_table"] and params["has_table_rows"]:
        if dims[2] is not None:  # one table per mapped call: stack and offset
            tables = lead(page_table, dims[2])
            count = tables.shape[1]
            page_table = tables.reshape(size * count, tables.shape[2])
            local = jnp.clip(lead(table_rows, dims[3]), 0, count - 1)
            table_rows = (local + count * jnp.arange(size, dtype=jnp.int32)[:, None])
        else:
            table_rows = lead(table_rows, dims[3])
        table_rows = table_rows.reshape(size * rows)
    elif params["has_page_table"]:
        page_table = lead(page_table, dims[2])
        page_table = page_table.reshape(size * page_table.shape[1], page_table.shape[2])
    if params["has_num_valid_rows"]:
        num_valid_rows = lead(num_valid_rows, dims[4]).reshape(-1)
    out = primitive.bind(scores, lengths, page_table, table_rows, num_valid_rows, **params)
    return out.reshape(size, rows, params["k"]), 0


def _jvp(primals, tangents, *, primitive, **params):
    """Integer indices carry no tangent: a symbolic zero of their (float0) tangent type."""
    del tangents
    out = primitive.bind(*primals, **params)
    return out, ad.Zero(jax.core.ShapedArray(out.shape, jax.dtypes.float0))


def _lowering(ctx, *operands, **params):
    # One device: nothing to partition, call the kernel directly.
    if getattr(ctx.module_context.axis_context, "num_devices", 1) == 1:
        call = partial(ffi_call_p.bind, **params)
    else:
        call = partial(partitioned_call, **params)
    return mlir.lower_fun(call, multiple_results=False)(ctx, *operands)


for _primitive in PRIMITIVES.values():
    _primitive.def_impl(partial(dispatch.apply_primitive, _primitive))
    _primitive.def_abstract_eval(output_shape)
    batching.primitive_batchers[_primitive] = partial(_batch, primitive=_primitive)
    ad.primitive_jvps[_primitive] = partial(_jvp, primitive=_primitive)
    mlir.register_lowering(_primitive, _lowering)
    # The partitioner needs the device assignment while lowering, as custom_partitioning does.
    dispatch.prim_requires_devices_during_lowering.add(_primitive)
