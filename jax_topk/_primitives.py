"""The public primitives, one per operator, and their JAX rules.

Each primitive takes the 2-D `Operands` of `_contract` and the static `Params` (one
parameter, `params`), and returns the results `Params.result_avals` names (today int32
indices [rows, k]) as a tuple. Rules: shape (abstract evaluation), batching (vmap folds
the batch into the rows), JVP (integer output: no gradient), and lowering through the
row-sharding partitioner.
"""

from __future__ import annotations

import dataclasses
from functools import partial

import jax
import jax.numpy as jnp
from jax.extend import core
from jax.interpreters import ad, batching, mlir

from . import _compat
from ._batch_layout import Fold, laid_out, mapped_first
from ._checks import shape_rule
from ._contract import OPERATORS, Operands, Params
from ._lowering import ffi_call_p
from ._sharding import partitioned_call


def _make_primitive(name: str) -> core.Primitive:
    primitive = core.Primitive(name)
    primitive.multiple_results = True
    return primitive


PRIMITIVES = {op: _make_primitive(operator.primitive) for op, operator in OPERATORS.items()}


def _batch(args, dims, *, primitive, params: Params):
    """vmap: the mapped axis becomes more rows (and more num_valid_rows groups). Where the
    fold does not keep each call's rows together (`_batch_layout`: Explicit sharding with the
    rows split), num_valid_rows cannot pass as groups: the rows past a group's limit get
    lengths of 0 instead (the same result, docs/contract.md section 3)."""
    operands, dims = Operands(*args), Operands(*dims)
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)

    def lead(x, d):
        return mapped_first(x, d, size)

    scores = lead(operands.scores, dims.scores)
    fold = Fold(scores)
    rows, n = scores.shape[1:]
    lengths = operands.lengths  # absent (every row whole): stays the placeholder
    if params.has_lengths:
        lengths = lead(lengths, dims.lengths)
    num_valid_rows = operands.num_valid_rows
    if params.has_num_valid_rows:
        # [size, groups]: a group a call, or several (nested vmap: the inner calls).
        limits = lead(num_valid_rows, dims.num_valid_rows).reshape(size, -1)
        num_valid_rows = limits.reshape(-1)
        if not fold.keeps_groups:
            group_rows = max(rows // limits.shape[1], 1)
            row = jnp.arange(rows, dtype=jnp.int32)
            valid = row % group_rows < limits[:, row // group_rows]  # RowIsValid's rule
            whole = lengths if params.has_lengths else jnp.full((size, rows), n, jnp.int32)
            lengths = jnp.where(valid, laid_out(whole, (None, None), fold.mesh), 0)
            num_valid_rows = Operands.absent(1)
            params = dataclasses.replace(params, has_lengths=True, has_num_valid_rows=False)
    if params.has_lengths:
        lengths = fold(lengths)
    page_table, table_rows = operands.page_table, operands.table_rows
    if params.has_page_table and params.has_table_rows:
        if dims.page_table is not None:  # one table per mapped call: stack and offset
            tables = laid_out(lead(page_table, dims.page_table), (None, None), fold.mesh)
            count = tables.shape[1]
            page_table = tables.reshape(size * count, tables.shape[2])
            local = jnp.clip(lead(table_rows, dims.table_rows), 0, count - 1)
            table_rows = local + count * jnp.arange(size, dtype=jnp.int32)[:, None]
        else:
            table_rows = lead(table_rows, dims.table_rows)
        table_rows = fold(table_rows)
    elif params.has_page_table:
        page_table = fold(lead(page_table, dims.page_table))
    batched = Operands(fold(scores), lengths, page_table, table_rows, num_valid_rows)
    results, dims_out = zip(*map(fold.unfold, primitive.bind(*batched, params=params)))
    return list(results), list(dims_out)


def _jvp(primals, tangents, *, primitive, params: Params):
    """Integer indices carry no tangent: a symbolic zero of their (float0) tangent type."""
    del tangents
    results = primitive.bind(*primals, params=params)
    zeros = [ad.Zero(jax.core.ShapedArray(r.shape, jax.dtypes.float0)) for r in results]
    return results, zeros


def _lowering(ctx, *operands, params: Params):
    # One device: nothing to partition, call the kernel directly.
    if _compat.lowering_num_devices(ctx) == 1:
        call = partial(ffi_call_p.bind, params=params)
    else:
        call = partial(partitioned_call, params=params)
    return mlir.lower_fun(call, multiple_results=True)(ctx, *operands)


for _primitive in PRIMITIVES.values():
    _compat.define_eager_impl(_primitive)
    _primitive.def_abstract_eval(shape_rule)
    batching.primitive_batchers[_primitive] = partial(_batch, primitive=_primitive)
    ad.primitive_jvps[_primitive] = partial(_jvp, primitive=_primitive)
    mlir.register_lowering(_primitive, _lowering)
    _compat.require_devices_during_lowering(_primitive)
