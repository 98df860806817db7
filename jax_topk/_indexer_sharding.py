"""Row sharding of the lightning indexer (docs/contract.md sections 6 and 9): the sequences
(B) and the query rows (M) of q split over mesh axes, each device runs the kernel on its own
queries against the whole keys, and the result comes out sharded as q.

The same machinery as the top-k operators (`_sharding`): one `custom_partitioning`, the
layout read from q's sharding (a dimension that does not split evenly runs whole), and
`num_valid_rows` (one limit per sequence, counting its global rows) offset by each shard's
first query row. The keys are replicated: a call whose keys are split over N gathers them
(context-parallel keys are later work).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec

from ._indexer_contract import LOGITS, IndexerOperands, IndexerParams
from ._indexer_lowering import indexer_call_p, native_operands
from ._sharding import _shard_index, _split_axes


def _bind(params: IndexerParams, *operands):
    operands = native_operands(IndexerOperands(*operands), params)
    return tuple(indexer_call_p.bind(*operands, params=params))


_partitioned_call = custom_partitioning(_bind, static_argnums=(0,))


def _layout(mesh, arg_shapes):
    """(batch axes, query axes): the mesh axes B and M of q are split over, or None."""
    q = IndexerOperands(*arg_shapes).q
    if not isinstance(q.sharding, NamedSharding):
        return None, None
    spec = (*q.sharding.spec, None, None)
    batch, queries = q.shape[:2]
    return _split_axes(mesh, spec[0], batch), _split_axes(mesh, spec[1], queries)


def _shardings(params: IndexerParams, mesh, batch_axes, query_axes):
    b, m = batch_axes, query_axes
    replicated = PartitionSpec()
    if not params.has_page_table:
        page_table = replicated
    elif params.has_table_rows:
        page_table = PartitionSpec(b, None, None)  # each sequence's whole table
    else:
        page_table = PartitionSpec(b, m, None)  # a table row per query row
    specs = IndexerOperands(
        q=PartitionSpec(b, m, None, None),
        keys=PartitionSpec(b, None, None),
        weights=PartitionSpec(b, m, None),
        key_scales=PartitionSpec(b, None) if params.has_key_scales else replicated,
        lengths=PartitionSpec(b, m),
        page_table=page_table,
        table_rows=PartitionSpec(b, m) if params.has_table_rows else replicated,
        num_valid_rows=PartitionSpec(b) if params.has_num_valid_rows else replicated,
    )
    result = NamedSharding(mesh, PartitionSpec(b, m, None))
    return tuple(NamedSharding(mesh, s) for s in specs), (result,)


def local_num_valid_rows(num_valid_rows, queries, first_query, local_queries):
    """Each sequence's limit for this shard's query rows [first, first + local). Clamped
    before the shift, so no value can wrap."""
    limits = jnp.clip(num_valid_rows, 0, queries) - first_query
    return jnp.clip(limits, 0, local_queries).astype(jnp.int32)


def _partition(params: IndexerParams, mesh, arg_shapes, result_shape):
    del result_shape
    batch_axes, query_axes = _layout(mesh, arg_shapes)
    arg_shardings, result_shardings = _shardings(params, mesh, batch_axes, query_axes)
    queries = IndexerOperands(*arg_shapes).q.shape[1]

    def local_call(*local):
        local = IndexerOperands(*local)
        if params.has_num_valid_rows and query_axes:
            local_queries = local.q.shape[1]
            first_query = _shard_index(mesh, query_axes) * local_queries
            local = local._replace(
                num_valid_rows=local_num_valid_rows(
                    local.num_valid_rows, queries, first_query, local_queries
                )
            )
        return _bind(params, *local)

    return mesh, local_call, result_shardings, arg_shardings


def _infer(params: IndexerParams, mesh, arg_shapes, result_shape):
    del result_shape
    batch_axes, query_axes = _layout(mesh, arg_shapes)
    return (NamedSharding(mesh, PartitionSpec(batch_axes, query_axes, None)),)


def _sharding_rule(params: IndexerParams, mesh, arg_shapes, result_shape):
    del mesh, arg_shapes, result_shape
    if not params.has_page_table:
        page_table = "p0 p1 p2"
    else:
        page_table = "b t p" if params.has_table_rows else "b m p"
    factors = IndexerOperands(
        q="b m h d",
        keys="b n d",
        weights="b m h",
        key_scales="b n" if params.has_key_scales else "s0 s1",
        lengths="b m",
        page_table=page_table,
        table_rows="b m" if params.has_table_rows else "r0 r1",
        num_valid_rows="b" if params.has_num_valid_rows else "v0",
    )
    result = "b m n" if params.op == LOGITS else "b m k"
    # Only the sequences and the query rows split; everything else is whole on each device.
    used = {factor for entry in factors for factor in entry.split()}
    whole = tuple(factor for factor in ("h", "d", "n", "t", "p") if factor in used)
    return f"{', '.join(factors)} -> {result}", {"need_replication_factors": whole}


_partitioned_call.def_partition(
    partition=_partition,
    infer_sharding_from_operands=_infer,
    sharding_rule=_sharding_rule,
)


def partitioned_call(*operands, params: IndexerParams):
    """Binds the custom call through the partitioner."""
    return _partitioned_call(params, *operands)
