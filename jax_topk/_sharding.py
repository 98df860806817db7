"""Row sharding: with the rows sharded over mesh axes, each device selects in its own rows.

The custom call is wrapped in `custom_partitioning`: the partitioner keeps the row
dimension's sharding, replicates the row length n (a row must be whole on one device),
and each device calls the kernel on its shard; the scores are never all-gathered.
`num_valid_rows` counts global rows, so each shard shifts it by its first row.
"""

from __future__ import annotations

from functools import partial

import jax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec

from ._lowering import ffi_call_p

_PARAM_NAMES = ("op", "k", "log2_page_size", "sorted", "has_page_table", "has_table_rows",
                "has_num_valid_rows", "rows_per_group")


def _bind(params, scores, lengths, page_table, table_rows, num_valid_rows):
    return ffi_call_p.bind(scores, lengths, page_table, table_rows, num_valid_rows,
                           **dict(zip(_PARAM_NAMES, params)))


_partitioned_call = custom_partitioning(_bind, static_argnums=(0,))


def _row_axes(sharding):
    """The mesh axes the row dimension of an operand's sharding is split over."""
    if not isinstance(sharding, NamedSharding) or not sharding.spec:
        return None
    axes = sharding.spec[0]
    if axes is None:
        return None
    return axes if isinstance(axes, tuple) else (axes,)


def _plan(params, mesh, arg_shapes):
    """Row axes to keep, or None to run replicated (the groups of a vmapped
    num_valid_rows do not line up with the shards)."""
    params = dict(zip(_PARAM_NAMES, params))
    axes = _row_axes(arg_shapes[0].sharding)
    if axes is None:
        return None
    rows = arg_shapes[0].shape[0]
    shards = 1
    for a in axes:
        shards *= mesh.shape[a]
    if rows % shards:
        return None
    local_rows = rows // shards
    if params["has_num_valid_rows"]:
        group = params["rows_per_group"]
        if not (local_rows % group == 0 or group == rows):
            return None
    return axes


def _shardings(params, mesh, axes):
    params = dict(zip(_PARAM_NAMES, params))
    rows = PartitionSpec(axes)
    rows_2d = PartitionSpec(axes, None)
    replicated = PartitionSpec()
    page_table = rows_2d if params["has_page_table"] and not params["has_table_rows"] else replicated
    table_rows = rows if params["has_table_rows"] else replicated
    specs = (rows_2d, rows, page_table, table_rows, replicated)
    return tuple(NamedSharding(mesh, s) for s in specs), NamedSharding(mesh, rows_2d)


def _shard_index(mesh, axes):
    index = 0
    for a in axes:
        index = index * mesh.shape[a] + jax.lax.axis_index(a)
    return index


def _partition(params, mesh, arg_shapes, result_shape):
    axes = _plan(params, mesh, arg_shapes)
    if axes is None:
        specs = (NamedSharding(mesh, PartitionSpec()),) * 5
        return mesh, partial(_bind, params), NamedSharding(mesh, PartitionSpec()), specs
    arg_shardings, out_sharding = _shardings(params, mesh, axes)
    named = dict(zip(_PARAM_NAMES, params))
    rows = arg_shapes[0].shape[0]

    def local_call(scores, lengths, page_table, table_rows, num_valid_rows):
        local_rows = scores.shape[0]
        local_params = dict(named)
        if named["has_num_valid_rows"]:
            first_row = _shard_index(mesh, axes) * local_rows
            group = named["rows_per_group"]
            if group == rows:  # one group spanning all rows: shift by this shard's first row
                num_valid_rows = num_valid_rows - first_row.astype(num_valid_rows.dtype)
                local_params["rows_per_group"] = local_rows
            else:  # whole groups per shard: take this shard's groups
                num_valid_rows = jax.lax.dynamic_slice_in_dim(
                    num_valid_rows, first_row // group, local_rows // group)
        return ffi_call_p.bind(scores, lengths, page_table, table_rows, num_valid_rows,
                               **local_params)

    return mesh, local_call, out_sharding, arg_shardings


def _infer(params, mesh, arg_shapes, result_shape):
    axes = _plan(params, mesh, arg_shapes)
    return NamedSharding(mesh, PartitionSpec(axes, None) if axes else PartitionSpec())


def _sharding_rule(params, mesh, arg_shapes, result_shape):
    del mesh, arg_shapes, result_shape
    named = dict(zip(_PARAM_NAMES, params))
    page_table = ("t p" if named["has_table_rows"] else "r p") if named["has_page_table"] else "t p"
    table_rows = "r" if named["has_table_rows"] else "c"
    # n and the groups must be whole on each device; rows pass through.
    rule = f"r n, r, {page_table}, {table_rows}, g -> r k"
    return rule, {"need_replication_factors": ("n", "g")}


_partitioned_call.def_partition(
    partition=_partition,
    infer_sharding_from_operands=_infer,
    sharding_rule=_sharding_rule,
)


def partitioned_call(scores, lengths, page_table, table_rows, num_valid_rows, **params):
    """Binds the custom call through the partitioner (single-device: a plain call)."""
    key = tuple(params[name] for name in _PARAM_NAMES)
    return _partitioned_call(key, scores, lengths, page_table, table_rows, num_valid_rows)

