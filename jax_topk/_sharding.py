"""Row and column sharding (docs/contract.md sections 6 and 8): each device selects in its
own shard of the scores, which never cross devices.

The custom call is wrapped in `custom_partitioning`, one partition function for every
layout. Rows split over mesh axes: each device calls the kernel on its rows.
`num_valid_rows` counts global rows (per group of rows, one group per vmapped call), so
each shard turns it into limits for its own rows. Columns split over mesh axes: each
device selects k candidates among its own columns (lengths clamped to its column range,
global column numbers, with values, no page table), the candidates travel over the column
axes and `merge_topk`'s merge gives the unsharded result bit for bit, and the page
transform follows. Both at once on 2-D meshes.

How the candidates travel, `COLUMN_MERGE` (private, for the benchmark: read when a call is
partitioned, so set it before the first compile or call `jax.clear_caches()`; the
environment variable JAX_TOPK_COLUMN_MERGE sets its start value):
- "all_gather" (the default): one all-gather of [rows, devices * k] values and columns,
  then one merge of devices * k candidates a row.
- "tree": log2(devices) rounds of pairwise exchanges (recursive doubling: a
  collective_permute with the device whose column shard index differs in bit r), each
  followed by a merge of 2 k candidates to k. Exact because the top k of a union is the
  top k of the union of each part's top k (values in total order, ties by column, the same
  order at every step). Column shards of a count that is not a power of two fall back to
  the all-gather.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os

import jax
import jax.numpy as jnp
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec

from . import _fallback
from ._contract import Operands, Params
from ._lowering import ffi_call_p
from ._merge import merge_2d

COLUMN_MERGES = ("all_gather", "tree")
COLUMN_MERGE = os.environ.get("JAX_TOPK_COLUMN_MERGE", "all_gather")


def _bind(params: Params, *operands):
    return tuple(ffi_call_p.bind(*operands, params=params))


# The static parameters are the first (hashable) argument.
_partitioned_call = custom_partitioning(_bind, static_argnums=(0,))


def _split_axes(mesh, entry, size: int):
    """The mesh axes a dimension of `size` is split over (a spec entry), or None when it is
    not split, or not evenly (then it runs whole on each device)."""
    if entry is None:
        return None
    axes = entry if isinstance(entry, tuple) else (entry,)
    shards = math.prod(mesh.shape[a] for a in axes)
    return axes if size > 0 and size % shards == 0 else None


def _layout(mesh, arg_shapes):
    """(row axes, column axes) of the scores: the mesh axes the rows and the columns are
    split over, each None when not split."""
    scores = Operands(*arg_shapes).scores
    sharding = scores.sharding
    if not isinstance(sharding, NamedSharding):
        return None, None
    spec = (*sharding.spec, None, None)
    rows, n = scores.shape
    return _split_axes(mesh, spec[0], rows), _split_axes(mesh, spec[1], n)


def _page_table_per_row(params: Params):
    """Whether the page table has a row per score row (else table_rows picks its rows)."""
    return params.has_page_table and not params.has_table_rows


def _shardings(params: Params, mesh, row_axes, column_axes):
    """Each operand's sharding (rows over `row_axes`, the scores' columns over
    `column_axes`), and the results' (rows split, k whole)."""
    rows = PartitionSpec(row_axes)
    rows_2d = PartitionSpec(row_axes, None)
    replicated = PartitionSpec()
    specs = Operands(
        scores=PartitionSpec(row_axes, column_axes),
        lengths=rows if params.has_lengths else replicated,
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


def column_lengths(lengths, n: int, offset, local_n: int):
    """Global lengths as the lengths of the column range [offset, offset + local_n).
    Clamped to [0, n] before the shift, so no length can wrap."""
    return jnp.clip(jnp.clip(lengths, 0, n) - offset, 0, local_n).astype(jnp.int32)


def _merge_over(values, columns, *, mesh, axes, params: Params):
    """The exact top k of every device's candidates over the mesh `axes` (COLUMN_MERGE says
    how they travel), on every device of those axes."""
    if COLUMN_MERGE not in COLUMN_MERGES:
        raise ValueError(f"JAX_TOPK_COLUMN_MERGE={COLUMN_MERGE!r}: one of {COLUMN_MERGES}")
    devices = math.prod(mesh.shape[a] for a in axes)
    rounds = devices.bit_length() - 1
    if COLUMN_MERGE == "all_gather" or devices != 1 << rounds or rounds == 0:
        values = jax.lax.all_gather(values, axes, axis=1, tiled=True)
        columns = jax.lax.all_gather(columns, axes, axis=1, tiled=True)
        return merge_2d(values, columns, k=params.k, sorted=params.sorted, local=True)
    for bit in range(rounds):
        partners = [(i, i ^ (1 << bit)) for i in range(devices)]
        peer_values = jax.lax.ppermute(values, axes, partners)
        peer_columns = jax.lax.ppermute(columns, axes, partners)
        values, columns = merge_2d(
            jnp.concatenate([values, peer_values], axis=1),
            jnp.concatenate([columns, peer_columns], axis=1),
            k=params.k,
            sorted=params.sorted and bit == rounds - 1,
            local=True,
        )
    return values, columns


def column_shard_call(params: Params, local: Operands, *, mesh, n: int, offset, column_axes):
    """One device's columns [offset, offset + local n) of a column-sharded call: the
    candidates of its columns (global column numbers, with values, in any order), gathered
    over the column axes (k values and columns a row a device, never the scores), merged
    exactly (`_merge_over`), then the page transform."""
    lengths = local.lengths  # absent: every row whole, so every shard's columns are too
    if params.has_lengths:
        lengths = column_lengths(lengths, n, offset, local.scores.shape[1])
    candidates_params = dataclasses.replace(
        params,
        log2_page_size=0,
        sorted=False,
        has_page_table=False,
        has_table_rows=False,
        with_values=True,
    )
    indices, values = _bind(
        candidates_params,
        *local._replace(
            lengths=lengths, page_table=Operands.absent(2), table_rows=Operands.absent(1)
        ),
    )
    columns = jnp.where(indices != _fallback.EMPTY_SLOT, indices + offset, _fallback.EMPTY_SLOT)
    values, columns = _merge_over(values, columns, mesh=mesh, axes=column_axes, params=params)
    if params.has_page_table:
        columns = _fallback.page_transform(
            columns,
            local.page_table,
            local.table_rows,
            log2_page_size=params.log2_page_size,
            has_table_rows=params.has_table_rows,
        )
    return (columns, values) if params.with_values else (columns,)


_NO_MESH = jax.sharding.AbstractMesh((), ())


def traced_without_mesh(local_call):
    """A partition function's per-device body, traced with no mesh in context. It is traced
    after the partitioner has run: under `jax.set_mesh` with Explicit axes its jnp ops would
    otherwise add sharding constraints that nothing is left to consume, and the compile
    fails ("No registered implementation for untyped custom call to Sharding"). Its
    collectives and axis indices name the mesh axes, which stay bound."""

    @functools.wraps(local_call)
    def without_mesh(*local):
        with jax.sharding.use_abstract_mesh(_NO_MESH):
            return local_call(*local)

    return without_mesh


def _partition(params: Params, mesh, arg_shapes, result_shape):
    """One partition function for rows split, columns split, both, or neither."""
    del result_shape
    row_axes, column_axes = _layout(mesh, arg_shapes)
    arg_shardings, result_shardings = _shardings(params, mesh, row_axes, column_axes)
    rows, n = Operands(*arg_shapes).scores.shape

    @traced_without_mesh
    def local_call(*local):
        local = Operands(*local)
        local_rows, local_n = local.scores.shape
        if params.has_num_valid_rows and row_axes:
            first_row = _shard_index(mesh, row_axes) * local_rows
            local = local._replace(
                num_valid_rows=local_num_valid_rows(
                    local.num_valid_rows, rows, first_row, local_rows
                )
            )
        if not column_axes:
            return _bind(params, *local)
        offset = _shard_index(mesh, column_axes) * local_n
        return column_shard_call(
            params, local, mesh=mesh, n=n, offset=offset, column_axes=column_axes
        )

    return mesh, local_call, result_shardings, arg_shardings


def _infer(params: Params, mesh, arg_shapes, result_shape):
    del result_shape
    row_axes, _ = _layout(mesh, arg_shapes)
    return (NamedSharding(mesh, PartitionSpec(row_axes, None)),) * len(params.results)


def _sharding_rule(params: Params, mesh, arg_shapes, result_shape):
    del mesh, arg_shapes, result_shape
    factors = Operands(
        scores="r n",
        lengths="r" if params.has_lengths else "l",
        page_table="r p" if _page_table_per_row(params) else "t p",
        table_rows="r" if params.has_table_rows else "c",
        num_valid_rows="g",
    )
    results = ", ".join(["r k"] * len(params.results))
    # The (small) num_valid_rows must be whole on each device; rows pass through, and a
    # split n is merged inside the partitioned call (k is whole in the results).
    rule = f"{', '.join(factors)} -> {results}"
    return rule, {"need_replication_factors": ("g",)}


_partitioned_call.def_partition(
    partition=_partition,
    infer_sharding_from_operands=_infer,
    sharding_rule=_sharding_rule,
)


def partitioned_call(*operands, params: Params):
    """Binds the custom call through the partitioner."""
    return _partitioned_call(params, *operands)
