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

from ._lowering import ffi_call_p


def _bind(params, scores, lengths, page_table, table_rows, num_valid_rows):
    return ffi_call_p.bind(scores, lengths, page_table, table_rows, num_valid_rows,
                           **dict(params))


# The static parameters travel as a sorted tuple of (name, value) pairs.
_partitioned_call = custom_partitioning(_bind, static_argnums=(0,))


def _row_axes(mesh, arg_shapes):
    """The mesh axes the rows are split over, or None to run replicated (rows not split,
    or not evenly)."""
    sharding = arg_shapes[0].sharding
    if not isinstance(sharding, NamedSharding) or not sharding.spec or sharding.spec[0] is None:
        return None
    axes = sharding.spec[0] if isinstance(sharding.spec[0], tuple) else (sharding.spec[0],)
    rows = arg_shapes[0].shape[0]
    shards = math.prod(mesh.shape[a] for a in axes)
    return axes if rows > 0 and rows % shards == 0 else None


def _page_table_per_row(params):
    """Whether the page table has a row per score row (else table_rows picks its rows)."""
    return params["has_page_table"] and not params["has_table_rows"]


def _shardings(params, mesh, axes):
    rows = PartitionSpec(axes)
    rows_2d = PartitionSpec(axes, None)
    replicated = PartitionSpec()
    specs = (rows_2d, rows, rows_2d if _page_table_per_row(params) else replicated,
             rows if params["has_table_rows"] else replicated, replicated)
    return tuple(NamedSharding(mesh, s) for s in specs), NamedSharding(mesh, rows_2d)


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


def _partition(params, mesh, arg_shapes, result_shape):
    del result_shape
    named = dict(params)
    axes = _row_axes(mesh, arg_shapes)
    if axes is None:
        replicated = NamedSharding(mesh, PartitionSpec())
        return mesh, partial(_bind, params), replicated, (replicated,) * 5
    arg_shardings, out_sharding = _shardings(named, mesh, axes)
    rows = arg_shapes[0].shape[0]

    def local_call(scores, lengths, page_table, table_rows, num_valid_rows):
        if named["has_num_valid_rows"]:
            local_rows = scores.shape[0]
            first_row = _shard_index(mesh, axes) * local_rows
            num_valid_rows = local_num_valid_rows(num_valid_rows, rows, first_row, local_rows)
        return ffi_call_p.bind(scores, lengths, page_table, table_rows, num_valid_rows, **named)

    return mesh, local_call, out_sharding, arg_shardings


def _infer(params, mesh, arg_shapes, result_shape):
    del params, result_shape
    axes = _row_axes(mesh, arg_shapes)
    return NamedSharding(mesh, PartitionSpec(axes, None) if axes else PartitionSpec())


def _sharding_rule(params, mesh, arg_shapes, result_shape):
    del mesh, arg_shapes, result_shape
    named = dict(params)
    page_table = "r p" if _page_table_per_row(named) else "t p"
    table_rows = "r" if named["has_table_rows"] else "c"
    # n and the (small) num_valid_rows must be whole on each device; rows pass through.
    rule = f"r n, r, {page_table}, {table_rows}, g -> r k"
    return rule, {"need_replication_factors": ("n", "g")}


_partitioned_call.def_partition(
    partition=_partition,
    infer_sharding_from_operands=_infer,
    sharding_rule=_sharding_rule,
)


def partitioned_call(scores, lengths, page_table, table_rows, num_valid_rows, **params):
    """Binds the custom call through the partitioner."""
    return _partitioned_call(tuple(sorted(params.items())), scores, lengths, page_table,
                             table_rows, num_valid_rows)
