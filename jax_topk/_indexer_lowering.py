"""The lightning indexer's FFI custom call: the native operand form and per-platform
lowering (docs/contract.md section 9).

`native_operands` turns a call's `IndexerOperands` into what the handlers read: the page
table flattened to [B * rows, pages] (the TopkProblem's table over B * M score rows) and
table_rows offset into it, after clamping each into its own call's table. `indexer_call_p`,
bound on that form inside the (possibly partitioned) lowering of the public primitives,
lowers to the custom call of `IndexerParams.target`: the CPU handler, the CUDA handler or,
everywhere else and when forced (`_lowering.forced_fallback`), `_fallback.indexer_call`.

On CUDA, indexer_topk gets two workspaces as extra results (dropped at once, never seen by
the user): the float32 logits [B * M * N] and topk_filtered's selection workspace, which the
default (unfused) path fills and selects from; indexer_logits gets one. Where fp8 inputs have
enough queries, the logits workspace (after the logits) and indexer_logits' workspace hold f16
copies of q and the keys, widened once for the tensor-core kernel
(cuda/common/indexer_widened.h); otherwise indexer_logits' workspace is a byte. With
JAX_TOPK_INDEXER_TOPK=fused when the call is traced, indexer_topk's take the sizes of
cuda/common/indexer_topk_workspace.h, which the fused kernels (cuda/kernels/indexer_topk.cu:
the logits never in memory, measured slower so far) need: the handler reads the variable again
at dispatch and runs the unfused path on smaller ones.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core
from jax.interpreters import mlir

from . import _compat, _fallback
from ._indexer_contract import TOPK, IndexerOperands, IndexerParams
from ._lowering import (
    filtered_workspace_bytes,
    indexer_topk_workspace_bytes,
    indexer_widened_bytes,
    indexer_widened_offset_after_logits,
    uses_fallback,
)


def native_operands(operands: IndexerOperands, params: IndexerParams) -> IndexerOperands:
    """The handlers' form: page_table [B * rows, pages], table_rows int32 [B * M] naming
    rows of that flat table (each clamped into its own call's [0, T) first)."""
    if not params.has_page_table:
        return operands
    batch, count, pages = operands.page_table.shape
    page_table = operands.page_table.reshape(batch * count, pages)
    table_rows = operands.table_rows
    if params.has_table_rows:
        offsets = count * jnp.arange(batch, dtype=jnp.int32)[:, None]
        table_rows = (jnp.clip(table_rows, 0, count - 1) + offsets).reshape(-1)
    return operands._replace(page_table=page_table, table_rows=table_rows)


def _shape_rule(*avals, params: IndexerParams):
    return (params.result_aval(IndexerOperands(*avals)),)


indexer_call_p = core.Primitive("jax_topk_indexer_call")
indexer_call_p.multiple_results = True
indexer_call_p.def_abstract_eval(_shape_rule)


def _workspace_bytes(ctx, params: IndexerParams) -> list[int]:
    """The CUDA handler's workspace results, in bytes (module docstring)."""
    batch, queries, heads, head_dim = ctx.avals_in[0].shape
    keys_count = ctx.avals_in[1].shape[1]
    rows = batch * queries
    fp8 = ctx.avals_in[0].dtype == jnp.float8_e4m3fn
    widened = indexer_widened_bytes(fp8, batch, queries, heads, head_dim, keys_count)
    if params.op != TOPK:
        return [max(widened, 1)]
    if os.environ.get("JAX_TOPK_INDEXER_TOPK") == "fused":
        return list(indexer_topk_workspace_bytes(rows, keys_count, params.k))
    logits_bytes = 4 * rows * keys_count
    if widened:
        logits_bytes = indexer_widened_offset_after_logits(rows, keys_count) + widened
    return [logits_bytes, filtered_workspace_bytes(rows, keys_count, params.k)]


def _handler_lowering(ctx, *operands, params: IndexerParams, with_workspaces: bool):
    if with_workspaces:
        ctx = _compat.with_extra_results(
            ctx,
            [jax.core.ShapedArray((size,), np.uint8) for size in _workspace_bytes(ctx, params)],
        )
    results = jax.ffi.ffi_lowering(params.target)(ctx, *operands, **params.ffi_attributes())
    return results[:1]  # the workspaces are dropped


_fallback_lowering = mlir.lower_fun(_fallback.indexer_call, multiple_results=True)


def _platform_lowering(platform: str):
    def lowering(ctx, *operands, params: IndexerParams):
        if uses_fallback(platform, params.op):
            return _fallback_lowering(ctx, *operands, params=params)
        with_workspaces = platform == "cuda"
        return _handler_lowering(ctx, *operands, params=params, with_workspaces=with_workspaces)

    return lowering


mlir.register_lowering(indexer_call_p, _fallback_lowering)  # every platform without a handler
mlir.register_lowering(indexer_call_p, _platform_lowering("cpu"), platform="cpu")
mlir.register_lowering(indexer_call_p, _platform_lowering("cuda"), platform="cuda")
