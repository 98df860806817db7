"""The lightning indexer's user-facing functions (docs/contract.md section 9): check the
arguments, state the call as `IndexerOperands` (batch of one) and `IndexerParams`, bind."""

from __future__ import annotations

import jax.numpy as jnp

from . import _checks
from ._api import as_int32, host_integers
from ._indexer_contract import INDEXER_MAX_K, LOGITS, TOPK, IndexerOperands, IndexerParams
from ._indexer_primitives import PRIMITIVES


def _inputs(op, q, keys, weights, key_scales):
    q, keys, weights = jnp.asarray(q), jnp.asarray(keys), jnp.asarray(weights)
    if key_scales is not None:
        key_scales = jnp.asarray(key_scales)
    queries, _, _, keys_count = _checks.check_indexer_inputs(op, q, keys, weights, key_scales)
    return q, keys, weights, key_scales, queries, keys_count


# What the lengths' expected shape is, for the message.
QUERY_ROWS = "one length per query row: q's M"


def _bind(params, q, keys, weights, key_scales, lengths, **optional):
    operands = IndexerOperands(
        q=q[None],
        keys=keys[None],
        weights=weights[None],
        key_scales=IndexerOperands.absent(2, jnp.float32)
        if key_scales is None
        else key_scales[None],
        lengths=IndexerOperands.absent(2) if lengths is None else as_int32(lengths)[None],
        page_table=IndexerOperands.absent(3),
        table_rows=IndexerOperands.absent(2),
        num_valid_rows=IndexerOperands.absent(1),
    )._replace(**optional)
    return PRIMITIVES[params.op].bind(*operands, params=params)[0]


def indexer_logits(q, keys, weights, lengths=None, *, key_scales=None):
    """The lightning indexer's logits, float32 [M, N]:

        logits[t, s] = sum_h weights[t, h] * max(0, key_scales[s] * dot(q[t, h], keys[s]))

    for s < clamp(lengths[t], 0, N) (every s without lengths), -inf past it. `q` [M, H, D]
    and `keys` [N, D] are both bfloat16 or both float8_e4m3fn, `weights` float32 [M, H],
    `key_scales` float32 [N] or None (scales of 1); H <= 2048 and D <= 8192. Products and
    sums in float32, in an order fixed per backend (blocks of 128 d and 64 heads): the same
    bits every run.
    """
    q, keys, weights, key_scales, queries, _ = _inputs(LOGITS, q, keys, weights, key_scales)
    if lengths is not None:
        lengths = host_integers(lengths)
        _checks.check_lengths(LOGITS, lengths, (queries,), QUERY_ROWS)
    params = IndexerParams(
        op=LOGITS, has_key_scales=key_scales is not None, has_lengths=lengths is not None
    )
    return _bind(params, q, keys, weights, key_scales, lengths)[0]


def indexer_topk(
    q,
    keys,
    weights,
    lengths,
    *,
    k=2048,
    key_scales=None,
    page_table=None,
    page_size=1,
    table_rows=None,
    num_valid_rows=None,
    sorted=False,
):
    """The top-k keys of each query row by its indexer logits: int32 [M, k], bit for bit
    `topk_filtered(indexer_logits(q, keys, weights, lengths, key_scales=key_scales),
    lengths, k=k, page_table=..., page_size=..., table_rows=..., num_valid_rows=...,
    sorted=...)` on the same backend (see both docstrings for the arguments).

    By default the CUDA path writes the logits to a workspace and selects from it with
    topk_filtered's kernel; a fused kernel that never writes them runs with
    JAX_TOPK_INDEXER_TOPK=fused (set at compile and run time; measured slower).
    """
    q, keys, weights, key_scales, queries, keys_count = _inputs(TOPK, q, keys, weights, key_scales)
    _checks.require_lengths(TOPK, lengths, "pass jnp.full(q.shape[0], keys.shape[0])")
    lengths = host_integers(lengths)
    k = _checks.check_k(TOPK, k, max_k=INDEXER_MAX_K)
    log2_page_size = _checks.check_page_size(TOPK, page_size)
    sorted = _checks.check_sorted(TOPK, sorted)
    _checks.check_lengths(TOPK, lengths, (queries,), QUERY_ROWS)
    if page_table is not None:
        page_table = jnp.asarray(page_table)
    if table_rows is not None:
        table_rows = host_integers(table_rows)
    _checks.check_page_table(TOPK, page_table, table_rows, (queries,), keys_count, page_size)
    _checks.check_num_valid_rows(TOPK, num_valid_rows, (queries,))
    params = IndexerParams(
        op=TOPK,
        has_key_scales=key_scales is not None,
        has_lengths=True,  # required: checked above
        k=k,
        log2_page_size=log2_page_size,
        sorted=sorted,
        has_page_table=page_table is not None,
        has_table_rows=table_rows is not None,
        has_num_valid_rows=num_valid_rows is not None,
    )
    optional = {}
    if page_table is not None:
        optional["page_table"] = page_table[None]
    if table_rows is not None:
        optional["table_rows"] = as_int32(table_rows)[None]
    if num_valid_rows is not None:
        optional["num_valid_rows"] = as_int32(num_valid_rows).reshape(1)
    return _bind(params, q, keys, weights, key_scales, lengths, **optional)[0]
