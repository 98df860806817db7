"""`jax_topk.top_k`, the drop-in for `jax.lax.top_k` (docs/contract.md section 7).

`route` is the whole dispatch decision: which kernel serves a row of this dtype, length
and k. The routes differ in speed only; every one gives the contract's result bit for bit
(on the CPU they all run the one CPU algorithm). The values' JVP is jax.lax.top_k's:
the operand's tangent gathered at the indices, zero in empty (-1) slots.
"""

from __future__ import annotations

import enum
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from . import _checks, _fallback
from ._api import as_int32
from ._contract import (
    FAST_DTYPES,
    MAX_BF16_WIDTH,
    MAX_K,
    SMALL_ROWS_MAX_K,
    SMALL_ROWS_MAX_WIDTH,
    Operands,
    Params,
)
from ._primitives import PRIMITIVES


class Route(enum.Enum):
    SMALL_ROWS = "small_rows"  # a warp a row, the row in registers (MoE routing)
    REGISTER_ROWS = "topk_bf16"  # a block a row, a 16-bit row in registers
    FILTERED = "topk_filtered"  # a sample proposes a cutoff, one pass keeps the candidates
    SORT = "sort"  # exact pure JAX: other dtypes, k > 2048


def route(dtype, n: int, k: int) -> Route:
    """The kernel for rows of `n` elements of `dtype` and `k` winners."""
    if dtype not in FAST_DTYPES or k > MAX_K:
        return Route.SORT
    if n <= SMALL_ROWS_MAX_WIDTH and k <= SMALL_ROWS_MAX_K:
        return Route.SMALL_ROWS
    if dtype.itemsize == 2 and n <= MAX_BF16_WIDTH:
        return Route.REGISTER_ROWS
    return Route.FILTERED


def _select(operand, lengths, *, k: int, sorted: bool):
    """(values, indices) of 2-D rows by the route's kernel."""
    chosen = route(operand.dtype, operand.shape[1], k)
    if chosen is Route.SORT:
        return _fallback.select_with_values(operand, lengths, k=k, sorted=sorted)
    params = Params(
        op=chosen.value,
        k=k,
        log2_page_size=0,
        sorted=sorted,
        has_page_table=False,
        has_table_rows=False,
        has_num_valid_rows=False,
        with_values=True,
    )
    operands = Operands(
        scores=operand,
        lengths=lengths,
        page_table=Operands.absent(2),
        table_rows=Operands.absent(1),
        num_valid_rows=Operands.absent(1),
    )
    indices, values = PRIMITIVES[chosen.value].bind(*operands, params=params)
    return values, indices


@partial(jax.custom_jvp, nondiff_argnums=(2, 3))
def _values_and_indices(operand, lengths, k, sorted):
    return _select(operand, lengths, k=k, sorted=sorted)


@_values_and_indices.defjvp
def _values_and_indices_jvp(k, sorted, primals, tangents):
    operand, lengths = primals
    operand_dot = tangents[0]
    values, indices = _values_and_indices(operand, lengths, k, sorted)
    picked = jnp.take_along_axis(operand_dot, jnp.maximum(indices, 0), axis=-1)
    values_dot = jnp.where(indices >= 0, picked, jnp.zeros_like(picked))
    return (values, indices), (values_dot, np.zeros(indices.shape, jax.dtypes.float0))


def top_k(operand, k, *, lengths=None, sorted=True):
    """Exact top-k along the last axis: (values [..., k] in the operand's dtype, int32
    indices [..., k]), a drop-in for `jax.lax.top_k`.

    On rows without NaN and without `lengths`, the same bits as `jax.lax.top_k`: values
    rank in IEEE total order (-0 below +0), equal values rank the lower column first.
    NaN of either sign is never selected; `lengths` (integer, the operand's leading shape)
    limits row r to columns [0, clamp(lengths[r], 0, n)). A slot with no candidate holds
    index -1 and value -inf (an integer dtype's minimum). `sorted=True` gives rank order,
    `sorted=False` the same set in ascending column order. `values` is differentiable: its
    tangent is the operand's tangent at `indices`. float32, bfloat16 and float16 run on
    the fast kernels (k <= 2048); other dtypes and larger k take an exact slower path.
    """
    operand = jnp.asarray(operand)
    leading, n = _checks.check_top_k_operand(operand)
    k = _checks.check_top_k_k(k, n)
    sorted = _checks.check_sorted("top_k", sorted)
    rows = int(np.prod(leading, dtype=np.int64))
    if lengths is None:
        lengths = jnp.full((rows,), n, jnp.int32)
    else:
        lengths = jnp.asarray(lengths)
        _checks.check_lengths("top_k", lengths, leading)
        lengths = as_int32(lengths).reshape(rows)
    values, indices = _values_and_indices(operand.reshape(rows, n), lengths, k, sorted)
    return values.reshape(*leading, k), indices.reshape(*leading, k)
