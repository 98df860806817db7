"""`jax_topk.top_k`, the drop-in for `jax.lax.top_k` (docs/contract.md section 7).

`route` is the whole dispatch decision between targets: which kernel serves a row of this
dtype, length and k. Inside two targets' CUDA handlers a launch may still go to a sibling
kernel by row count and width (kernels/topk_cuda.h says when): k = 1 to topk_argmax, few
long rows to the cluster or register-row kernels. The routes differ in speed only; every one
gives the contract's result bit for bit (on the CPU they all run the one CPU algorithm).
The values' JVP is jax.lax.top_k's: the operand's tangent gathered at the indices, zero in
empty (-1) slots.

k above the kernels' 2048 takes them in rounds (`_select_in_rounds`): ranks 1..2048, then
2049..4096 of the row with the first round's winners masked out, and so on. The contract's
order (key descending, then column ascending) is a strict total order on a row's
candidates, so the top k2 of what is left after the first k1 are exactly ranks k1+1..k1+k2.
"""

from __future__ import annotations

import enum
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import _checks, _fallback, _widening
from ._api import as_int32, host_integers
from ._contract import (
    FAST_DTYPES,
    MAX_BF16_WIDTH,
    MAX_K,
    OPERATORS,
    SMALL_ROWS_MAX_K,
    SMALL_ROWS_MAX_K_BY_ROUNDS,
    SMALL_ROWS_MAX_WIDTH,
    Operands,
    Params,
)
from ._primitives import PRIMITIVES


class Route(enum.Enum):
    SMALL_ROWS = "small_rows"  # a warp a row, the row in registers (MoE routing)
    REGISTER_ROWS = "topk_bf16"  # a block a row, a 16-bit row in registers
    FILTERED = "topk_filtered"  # a sample proposes a cutoff, one pass keeps the candidates
    ROUNDS = "rounds"  # k > 2048: the routes above, 2048 winners a round
    SORT = "sort"  # exact pure JAX (one sort of the row): other dtypes, very large k


def rounds(k: int) -> int:
    """How many rounds of at most MAX_K winners make k."""
    return -(-k // MAX_K)


def max_rounds(rows: int, n: int) -> int:
    """The most rounds before one sort of the rows is the faster way. A round costs a kernel
    call and a masking pass over the rows; the sort, about n log n a row whatever k is.
    Measured on an H200 (benches/NOTES.md "top_k past 2048: rounds"; crossover = the rounds
    at which the sort would catch up, from sort / rounds x rounds):

    | rows x n, float32 | crossover | allowed here |
    | 64 x 131072       | ~21       | 8            |
    | 8 x 131072        | ~9.5      | 8            |
    | 1024 x 32768      | ~15       | 4            |
    | 64 x 32768        | ~7.6      | 4            |
    | 4096 x 8192       | ~5.4      | 4            |
    | 1 x 131072        | ~4 (est.) | 2            |

    Short rows sort fast, and one row leaves the GPU idle in each round."""
    elements = rows * n
    if n >= 65536 and rows >= 8:
        return 8
    if elements >= 2**21:
        return 4
    return 2


def small_rows_take(dtype, n: int, k: int, rows: int) -> bool:
    """Whether a warp a row serves these rows (n <= 1024, k <= 64). Past
    SMALL_ROWS_MAX_K_BY_ROUNDS winners it finds them by radix digits, a serial chain that a
    block a row beats on fewer rows. Measured on an H200 (benches/NOTES.md "small rows: k past
    32 by digits"; block a row / warp a row, device time):

    | rows | f32 n=1024 k=64 | f32 n=256 k=64 | bf16 n=1024 k=64 | f16 n=512 k=40 |
    | 128  | 0.50            | 0.82           | 0.61             | 1.27           |
    | 512  | 0.65            | 1.10           | 1.02             | 1.27           |
    | 1024 | 1.00            | 1.67           | 1.60             | 1.98           |
    | 2048 | 1.39            | 2.65           | 2.23             | 2.87           |"""
    if n > SMALL_ROWS_MAX_WIDTH or k > SMALL_ROWS_MAX_K:
        return False
    if k <= SMALL_ROWS_MAX_K_BY_ROUNDS:
        return True
    if dtype.itemsize == 2:
        return rows >= (128 if n <= 512 else 512)
    return rows >= (512 if n <= 512 else 1024)


def route(dtype, n: int, k: int, rows: int = 1) -> Route:
    """The kernel for `rows` rows of `n` elements of `dtype` and `k` winners."""
    if dtype not in FAST_DTYPES:
        return Route.SORT
    if k > MAX_K:
        return Route.ROUNDS if rounds(k) <= max_rounds(rows, n) else Route.SORT
    if small_rows_take(dtype, n, k, rows):
        return Route.SMALL_ROWS
    if dtype.itemsize == 2 and n <= MAX_BF16_WIDTH and rows <= OPERATORS["topk_bf16"].max_rows:
        return Route.REGISTER_ROWS
    return Route.FILTERED


def _select(operand, lengths, *, k: int, sorted: bool):
    """(values, indices) of 2-D rows by the route's kernel."""
    rows, n = operand.shape
    chosen = route(operand.dtype, n, k, rows)
    if chosen is Route.SORT:
        return _fallback.select_with_values(operand, lengths, k=k, sorted=sorted)
    if chosen is Route.ROUNDS:
        return _select_in_rounds(operand, lengths, k=k, sorted=sorted)
    indices, values = bind_rows(
        chosen.value, operand, lengths, k=k, sorted=sorted, with_values=True
    )
    return values, indices


def bind_rows(op: str, scores, lengths, *, k: int, sorted: bool, with_values: bool = False):
    """The primitive of `op` ("topk_bf16", "topk_filtered", "small_rows") on 2-D rows with no
    page table and every row valid: (indices,), or (indices, values) with_values; lengths None:
    every row whole. Also what the benchmark probes call to time one kernel route against
    another on the same call."""
    params = Params(
        op=op,
        k=k,
        log2_page_size=0,
        sorted=sorted,
        has_page_table=False,
        has_table_rows=False,
        has_num_valid_rows=False,
        with_values=with_values,
        has_lengths=lengths is not None,
    )
    operands = Operands(
        scores=scores,
        lengths=Operands.absent(1) if lengths is None else lengths,
        page_table=Operands.absent(2),
        table_rows=Operands.absent(1),
        num_valid_rows=Operands.absent(1),
    )
    return PRIMITIVES[op].bind(*operands, params=params)


# Jitted so that its NaN masks stay inside one computation: op by op (outside any jit),
# jax_debug_nans would report them although no NaN leaves the call.
@partial(jax.jit, static_argnames=("k", "sorted"))
def _select_in_rounds(operand, lengths, *, k: int, sorted: bool):
    """(values, indices) for k > MAX_K, MAX_K winners a round in rank order (the last round
    the rest). Before each later round, every element ranked at or above the previous
    round's last winner (its ordered key and column) turns NaN, which is never a candidate;
    a row whose round came up short (a -1 in its last slot) has no candidates left and
    turns NaN whole. The mask is elementwise against a per-row boundary taken from the
    round's own results, so it fuses into one pass over the row and keeps the row's
    sharding (no gather across columns)."""
    rows, n = operand.shape
    keys, _ = _fallback.ordered_keys(operand)
    columns = lax.broadcasted_iota(jnp.int32, (rows, n), 1)
    not_a_candidate = jnp.array(jnp.nan, operand.dtype)
    remaining = operand
    values_by_round, indices_by_round = [], []
    taken = 0
    while taken < k:
        round_k = min(MAX_K, k - taken)
        values, indices = _select(remaining, lengths, k=round_k, sorted=True)
        values_by_round.append(values)
        indices_by_round.append(indices)
        taken += round_k
        if taken < k:
            last_column = indices[:, -1:]
            last_key, _ = _fallback.ordered_keys(values[:, -1:])
            ranked_above = (keys > last_key) | ((keys == last_key) & (columns <= last_column))
            remaining = jnp.where(ranked_above | (last_column < 0), not_a_candidate, operand)
    values = jnp.concatenate(values_by_round, axis=1)
    indices = jnp.concatenate(indices_by_round, axis=1)
    if not sorted:  # ascending columns, the empty (-1) slots last as the kernels leave them
        int32_max = np.iinfo(np.int32).max
        by_column, values = lax.sort(
            (jnp.where(indices < 0, int32_max, indices), values), dimension=1, num_keys=1
        )
        indices = jnp.where(by_column == int32_max, -1, by_column)
    return values, indices


@partial(jax.custom_jvp, nondiff_argnums=(2, 3))
def _values_and_indices(operand, lengths, k, sorted):
    return _select(operand, lengths, k=k, sorted=sorted)


@_values_and_indices.defjvp
def _values_and_indices_jvp(k, sorted, primals, tangents):
    operand, lengths = primals
    operand_dot = tangents[0]
    values, indices = _values_and_indices(operand, lengths, k, sorted)
    # Under Explicit sharding a gather along a sharded axis needs its columns whole first (a
    # no-op otherwise); the transpose (jax.grad) scatters back into the sharded layout.
    gathered_dot = _fallback.columns_gathered(operand_dot)
    picked = jnp.take_along_axis(gathered_dot, jnp.maximum(indices, 0), axis=-1)
    values_dot = jnp.where(indices >= 0, picked, jnp.zeros_like(picked))
    return (values, indices), (values_dot, np.zeros(indices.shape, jax.dtypes.float0))


def top_k(operand, k, *, axis=-1, lengths=None, sorted=True, is_stable=True):
    """Exact top-k along `axis` (default the last): (values, int32 indices) with k in place
    of that axis, a drop-in for `jax.lax.top_k`.

    On rows without NaN and without `lengths`, the same bits as `jax.lax.top_k`: values
    rank in IEEE total order (-0 below +0), equal values rank the lower column first.
    NaN of either sign is never selected; `lengths` (integer, the operand's shape without
    `axis`) limits row r to columns [0, clamp(lengths[r], 0, n)). A slot with no candidate
    holds index -1 and value -inf (an integer dtype's minimum; a dtype without -inf, its
    lowest value). `sorted=True` gives rank order, `sorted=False` the same set in ascending
    column order. `is_stable` is accepted as `jax.lax.top_k` takes it; the result is always
    stable (equal values by ascending column). `values` is differentiable: its tangent is
    the operand's tangent at `indices`. float32, bfloat16 and float16 run on the fast
    kernels (k <= 2048 a round, 2 to 8 rounds by the rows' size), the 8-bit floats, bool
    and the 8- and 16-bit integers widened exactly to one of them first; float64, the wider
    integers and larger k take an exact slower path (one sort of the row). A row along any
    axis but the last is moved last first (a transpose XLA may have to copy).
    """
    operand = jnp.asarray(operand)
    _checks.check_top_k_dtype(operand)
    axis = _checks.check_axis("top_k", axis, operand)
    _checks.check_bool("top_k", "is_stable", is_stable)
    operand = jnp.moveaxis(operand, axis, -1)  # nothing to move for the last axis
    leading, n = _checks.check_top_k_operand(operand)
    k = _checks.check_top_k_k(k, n)
    sorted = _checks.check_sorted("top_k", sorted)
    rows = int(np.prod(leading, dtype=np.int64))
    if lengths is not None:  # None stays None: no [rows] array of n on the device
        lengths = host_integers(lengths)
        _checks.check_lengths("top_k", lengths, leading, "the operand's shape without axis")
        lengths = as_int32(lengths).reshape(rows)
    dtype = operand.dtype
    if _widening.is_narrow(dtype):  # 8-bit floats, bool, 8/16-bit integers: on the kernels
        operand = _widening.widened(operand)
    values, indices = _values_and_indices(operand.reshape(rows, n), lengths, k, sorted)
    if _widening.is_narrow(dtype):
        values = _widening.narrowed(values, indices, dtype)
    values, indices = values.reshape(*leading, k), indices.reshape(*leading, k)
    return jnp.moveaxis(values, -1, axis), jnp.moveaxis(indices, -1, axis)
