"""Row sharding: with the rows sharded over mesh axes, each device selects in its own rows.

The custom call is wrapped in `custom_partitioning`: the partitioner keeps the row
dimension's sharding, replicates the row length n (a row must be whole on one device),
and each device calls the kernel on its shard; the scores are never all-gathered.
`num_valid_rows` counts global rows (per group of rows, one group per vmapped call), so
each shard turns it into limits for its own rows.
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec

from ._contract import Operands, Params
from ._lowering import ffi_call_p


def _bind(params: Params, *operands):
    return tuple(ffi_call_p.bind(*operands, params=params))


# The static parameters are the first (hashable) argument.
_partitioned_call = custom_partitioning(_bind, static_argnums=(0,))


def _row_axes(mesh, arg_shapes):
    """The mesh axes the rows are split over, or None to run replicated (rows not split,
    or not evenly)."""
    scores = Operands(*arg_shapes).scores
    sharding = scores.sharding
    if not isinstance(sharding, NamedSharding) or not sharding.spec or sharding.spec[0] is None:
        return None
    axes = sharding.spec[0] if isinstance(sharding.spec[0], tuple) else (sharding.spec[0],)
    rows = scores.shape[0]
    shards = math.prod(mesh.shape[a] for a in axes)
    return axes if rows > 0 and rows % shards == 0 else None


def _page_table_per_row(params: Params):
    """Whether the page table has a row per score row (else table_rows picks its rows)."""
    return params.has_page_table and not params.has_table_rows


def _shardings(params: Params, mesh, axes):
    """Each operand's sharding with the rows split over `axes`, and the results'."""
    rows = PartitionSpec(axes)
    rows_2d = PartitionSpec(axes, None)
    replicated = PartitionSpec()
    specs = Operands(
        scores=rows_2d,
        lengths=rows,
        page_table=rows_2d if _page_table_per_row(params) else replicated,
        table_rows=rows if params.has_table_rows else replicated,
        num_valid_rows=replicated,
    )
    results = (NamedSharding(mesh, rows_2d),) * len(params.results)
    return tuple(NamedSharding(mesh, s) for s in specs), results


def _shard_index(mesh, axes):
    index = 0
    for a in axes:
        index = index * mesh.shape[a] + jax.lax.axis_index(a)
    return index


def local_num_valid_rows(num_valid_rows, rows, first_row, local_rows):
    """This shard's limits: one per piece of gcd(local_rows, group) rows, each piece inside
    one global group. Clamped before shifting, so no value can wrap."""
    group = rows // num_valid_rows.shape[0]
    piece = math.gcd(local_rows, group)
    starts = first_row + piece * jnp.arange(local_rows // piece, dtype=jnp.int32)
    limits = jnp.clip(num_valid_rows[starts // group], 0, group) - starts % group
    return jnp.clip(limits, 0, piece).astype(jnp.int32)


def _partition(params: Params, mesh, arg_shapes, result_shape):
    del result_shape
    axes = _row_axes(mesh, arg_shapes)
    if axes is None:
        replicated = NamedSharding(mesh, PartitionSpec())
        return (
            mesh,
            partial(_bind, params),
            (replicated,) * len(params.results),
            (replicated,) * len(Operands._fields),
        )
    arg_shardings, result_shardings = _shardings(params, mesh, axes)
    rows = Operands(*arg_shapes).scores.shape[0]

    def local_call(*local):
        local = Operands(*local)
        if params.has_num_valid_rows:
            local_rows = local.scores.shape[0]
            first_row = _shard_index(mesh, axes) * local_rows
            local = local._replace(
                num_valid_rows=local_num_valid_rows(
                    local.num_valid_rows, rows, first_row, local_rows
                )
            )
        return _bind(params, *local)

    return mesh, local_call, result_shardings, arg_shardings


def _infer(params: Params, mesh, arg_shapes, result_shape):
    del result_shape
    axes = _row_axes(mesh, arg_shapes)
    spec = PartitionSpec(axes, None) if axes else PartitionSpec()
    return (NamedSharding(mesh, spec),) * len(params.results)


def _sharding_rule(params: Params, mesh, arg_shapes, result_shape):
    del mesh, arg_shapes, result_shape
    factors = Operands(
        scores="r n",
        lengths="r",
        page_table="r p" if _page_table_per_row(params) else "t p",
        table_rows="r" if params.has_table_rows else "c",
        num_valid_rows="g",
    )
    results = ", ".join(["r k"] * len(params.results))
    # n and the (small) num_valid_rows must be whole on each device; rows pass through.
    rule = f"{', '.join(factors)} -> {results}"
    return rule, {"need_replication_factors": ("n", "g")}


_partitioned_call.def_partition(
    partition=_partition,
    infer_sharding_from_operands=_infer,
    sharding_rule=_sharding_rule,
)


def partitioned_call(*operands, params: Params):
    """Binds the custom call through the partitioner."""
    return _partitioned_call(params, *operands)
