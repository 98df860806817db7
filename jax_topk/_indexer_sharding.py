"""Row and key (context-parallel) sharding of the lightning indexer (docs/contract.md
sections 6 and 9).

Rows: the sequences (B) and the query rows (M) of q split over mesh axes, each device runs
the kernel on its own queries, and the result comes out sharded as q. Keys: the keys' N
(and key_scales') split over other mesh axes, each device scores its own keys, lengths
clamped to its column range (`_sharding.column_lengths`). `indexer_logits` then returns its
[M, N] split over N the same way, with no collective. `indexer_topk` selects among its own
keys' logits through topk_filtered's column sharding (`_sharding.column_shard_call`:
global column numbers, the candidates merged over the key axes, then the page transform),
so it writes each device's [M, N / devices] logits (the CUDA path writes them anyway). Both
at once on 2-D meshes.

The same machinery as the top-k operators (`_sharding`): one `custom_partitioning`, the
layout read from q's and the keys' shardings (a dimension that does not split evenly runs
whole, as does a key split over an axis that also splits the rows), and `num_valid_rows`
(one limit per sequence, counting its global rows) offset by each shard's first query row.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec

from ._contract import Operands, Params
from ._indexer_contract import LOGITS, IndexerOperands, IndexerParams
from ._indexer_lowering import indexer_call_p, native_operands
from ._sharding import (
    _shard_index,
    _split_axes,
    column_lengths,
    column_shard_call,
    traced_without_mesh,
)


def _bind(params: IndexerParams, *operands):
    operands = native_operands(IndexerOperands(*operands), params)
    return tuple(indexer_call_p.bind(*operands, params=params))


_partitioned_call = custom_partitioning(_bind, static_argnums=(0,))


def _layout(mesh, arg_shapes):
    """(batch axes, query axes, key axes): the mesh axes B and M of q and N of the keys are
    split over, or None. Keys split over an axis of the rows' are gathered (under Shardy the
    propagation may have settled such a conflict before, by gathering q's rows instead)."""
    operands = IndexerOperands(*arg_shapes)
    q, keys = operands.q, operands.keys
    if not isinstance(q.sharding, NamedSharding):
        return None, None, None
    spec = (*q.sharding.spec, None, None)
    batch, queries = q.shape[:2]
    batch_axes = _split_axes(mesh, spec[0], batch)
    query_axes = _split_axes(mesh, spec[1], queries)
    key_axes = None
    if isinstance(keys.sharding, NamedSharding):
        key_axes = _split_axes(mesh, (*keys.sharding.spec, None, None)[1], keys.shape[1])
    if key_axes and set(key_axes) & {*(batch_axes or ()), *(query_axes or ())}:
        key_axes = None
    return batch_axes, query_axes, key_axes


def _result_spec(params: IndexerParams, batch_axes, query_axes, key_axes):
    """The logits split as q's rows and the keys' N; the top-k indices as q's rows."""
    return PartitionSpec(batch_axes, query_axes, key_axes if params.op == LOGITS else None)


def _shardings(params: IndexerParams, mesh, batch_axes, query_axes, key_axes):
    b, m, n = batch_axes, query_axes, key_axes
    replicated = PartitionSpec()
    if not params.has_page_table:
        page_table = replicated
    elif params.has_table_rows:
        page_table = PartitionSpec(b, None, None)  # each sequence's whole table
    else:
        page_table = PartitionSpec(b, m, None)  # a table row per query row
    specs = IndexerOperands(
        q=PartitionSpec(b, m, None, None),
        keys=PartitionSpec(b, n, None),
        weights=PartitionSpec(b, m, None),
        key_scales=PartitionSpec(b, n) if params.has_key_scales else replicated,
        lengths=PartitionSpec(b, m) if params.has_lengths else replicated,
        page_table=page_table,
        table_rows=PartitionSpec(b, m) if params.has_table_rows else replicated,
        num_valid_rows=PartitionSpec(b) if params.has_num_valid_rows else replicated,
    )
    result = NamedSharding(mesh, _result_spec(params, b, m, n))
    return tuple(NamedSharding(mesh, s) for s in specs), (result,)


def local_num_valid_rows(num_valid_rows, queries, first_query, local_queries):
    """Each sequence's limit for this shard's query rows [first, first + local). Clamped
    before the shift, so no value can wrap."""
    limits = jnp.clip(num_valid_rows, 0, queries) - first_query
    return jnp.clip(limits, 0, local_queries).astype(jnp.int32)


def _key_shard_call(params: IndexerParams, local: IndexerOperands, *, mesh, n: int, key_axes):
    """One device's keys [offset, offset + local n): their logits (lengths clamped to that
    range); for indexer_topk, topk_filtered's column-sharded selection of them."""
    local_n = local.keys.shape[1]
    offset = _shard_index(mesh, key_axes) * local_n
    logits_params = IndexerParams(
        op=LOGITS, has_key_scales=params.has_key_scales, has_lengths=params.has_lengths
    )
    absent = IndexerOperands.absent
    lengths = local.lengths
    if params.has_lengths:  # without lengths each shard's keys are all in range
        lengths = column_lengths(lengths, n, offset, local_n)
    (logits,) = _bind(
        logits_params,
        *local._replace(
            lengths=lengths,
            page_table=absent(3),
            table_rows=absent(2),
            num_valid_rows=absent(1),
        ),
    )
    if params.op == LOGITS:
        return (logits,)
    batch, queries = local.q.shape[:2]
    native = native_operands(local, params)
    selection = Operands(
        scores=logits.reshape(batch * queries, local_n),
        lengths=local.lengths.reshape(-1),
        page_table=native.page_table if params.has_page_table else Operands.absent(2),
        table_rows=native.table_rows if params.has_table_rows else Operands.absent(1),
        num_valid_rows=local.num_valid_rows,
    )
    filtered_params = Params(
        op="topk_filtered",
        k=params.k,
        log2_page_size=params.log2_page_size,
        sorted=params.sorted,
        has_page_table=params.has_page_table,
        has_table_rows=params.has_table_rows,
        has_num_valid_rows=params.has_num_valid_rows,
    )
    (columns,) = column_shard_call(
        filtered_params, selection, mesh=mesh, n=n, offset=offset, column_axes=key_axes
    )
    return (columns.reshape(batch, queries, params.k),)


def _partition(params: IndexerParams, mesh, arg_shapes, result_shape):
    del result_shape
    batch_axes, query_axes, key_axes = _layout(mesh, arg_shapes)
    arg_shardings, result_shardings = _shardings(params, mesh, batch_axes, query_axes, key_axes)
    shapes = IndexerOperands(*arg_shapes)
    queries, n = shapes.q.shape[1], shapes.keys.shape[1]

    @traced_without_mesh
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
        if not key_axes:
            return _bind(params, *local)
        return _key_shard_call(params, local, mesh=mesh, n=n, key_axes=key_axes)

    return mesh, local_call, result_shardings, arg_shardings


def _infer(params: IndexerParams, mesh, arg_shapes, result_shape):
    del result_shape
    return (NamedSharding(mesh, _result_spec(params, *_layout(mesh, arg_shapes))),)


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
        lengths="b m" if params.has_lengths else "l0 l1",
        page_table=page_table,
        table_rows="b m" if params.has_table_rows else "r0 r1",
        num_valid_rows="b" if params.has_num_valid_rows else "v0",
    )
    result = "b m n" if params.op == LOGITS else "b m k"
    # The sequences, the query rows and the keys split (a split n is merged inside the
    # partitioned indexer_topk); everything else is whole on each device.
    used = {factor for entry in factors for factor in entry.split()}
    whole = tuple(factor for factor in ("h", "d", "t", "p") if factor in used)
    return f"{', '.join(factors)} -> {result}", {"need_replication_factors": whole}


_partitioned_call.def_partition(
    partition=_partition,
    infer_sharding_from_operands=_infer,
    sharding_rule=_sharding_rule,
)


def partitioned_call(*operands, params: IndexerParams):
    """Binds the custom call through the partitioner."""
    return _partitioned_call(params, *operands)
