"""The whole contract (docs/contract.md sections 3-4, 7 and 10) in plain JAX, for platforms
without our handlers.

It lowers the FFI-call primitive wherever no handler is registered (TPU, ROCm, an export
for such a platform, CUDA on a build without the CUDA extension) and gives the handlers'
results bit for bit. Every step is exact by construction, never by a backend's tie rule:
1. Each score becomes an ordered key: an integer whose signed order is the IEEE total order
   of the value, from the raw bits. NaN, columns past the row's length and rows past their
   group's num_valid_rows are not candidates.
2. `lax.top_k` of the keys with non-candidates at int32's minimum: its documented rule
   ranks equal keys by the lower index, which is the contract's tie rule (32-bit integers
   and 64-bit types: one `lax.sort` by (not a candidate, key descending, column ascending)
   instead). The first min(k, candidates) entries are the rank order; `sorted=False` sorts
   those k columns.
3. The page transform, in 32-bit unsigned arithmetic as the handlers do.
As fast as `jax.lax.top_k` of the same rows (it is one, on int32 keys); top_k's exact path
for k > 2048 and for dtypes the kernels do not read.

`select` returns the columns before the page transform so that a caller wanting the
values too can gather them (-1 slots are the empty ones).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec

from ._contract import Operands, Params
from ._indexer_contract import LOGITS, IndexerOperands

EMPTY_SLOT = -1


def ordered_keys(scores):
    """Keys whose signed integer order is the IEEE total order of the float scores,
    -NaN < -inf < ... < -0 < +0 < ... < +inf < +NaN (integers: their numeric order), and a
    NaN mask. Types of up to 32 bits give int32 keys (narrower keys sign-extended, which
    keeps their order), 64-bit types int64 keys."""
    if jnp.issubdtype(scores.dtype, jnp.integer):  # no NaN; the mask laid out as the keys
        keys = _integer_keys(scores)
        return keys, jnp.zeros_like(keys, dtype=bool)
    bits = jnp.finfo(scores.dtype).bits
    signed = jnp.dtype(f"int{bits}")
    raw = lax.bitcast_convert_type(scores, signed)
    magnitude_mask = np.array(np.iinfo(signed).max, signed)
    # Negative values: flip the magnitude bits, so a larger magnitude orders lower.
    keys = jnp.where(raw < 0, raw ^ magnitude_mask, raw)
    infinity = lax.bitcast_convert_type(jnp.array(np.inf, scores.dtype), signed)
    is_nan = (raw & magnitude_mask) > infinity
    return keys.astype(jnp.int32 if bits <= 32 else jnp.int64), is_nan


def _integer_keys(values):
    """Signed integers are their own keys; unsigned ones flip the top bit of their bits read
    as signed, which maps 0 to the signed minimum and keeps the order."""
    bits = jnp.iinfo(values.dtype).bits
    wide = jnp.int32 if bits <= 32 else jnp.int64
    if jnp.issubdtype(values.dtype, jnp.signedinteger):
        return values.astype(wide)
    signed = jnp.dtype(f"int{bits}")
    flipped = lax.bitcast_convert_type(values, signed) ^ np.array(np.iinfo(signed).min, signed)
    return flipped.astype(wide)


def empty_value(dtype):
    """An empty slot's value: -inf; an integer dtype's minimum; a float without -inf (such as
    float8_e4m3fn) its lowest value; bool False."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return np.array(False)
    if np.issubdtype(dtype, np.integer):
        return np.array(np.iinfo(dtype).min, dtype)
    has_infinity = np.isinf(np.array(-np.inf, np.float32).astype(dtype).astype(np.float32))
    lowest = -np.inf if has_infinity else ml_dtypes.finfo(dtype).min
    return np.array(lowest, np.float32).astype(dtype)


def gather_values(scores, columns):
    """The scores at the selected columns (before any page transform), empty_value in -1
    slots. Gathered as raw bits: over column-sharded scores XLA gathers locally and adds
    the shards' results, and a float add would turn -0 into +0 (and flush subnormals on
    the CPU)."""
    bits = jnp.dtype(f"uint{jnp.dtype(scores.dtype).itemsize * 8}")
    picked_bits = jnp.take_along_axis(
        lax.bitcast_convert_type(scores, bits), jnp.maximum(columns, 0), axis=1
    )
    picked = lax.bitcast_convert_type(picked_bits, scores.dtype)
    return jnp.where(columns != EMPTY_SLOT, picked, empty_value(scores.dtype))


def columns_gathered(scores):
    """The rows (scores or merge_topk's candidates) with their columns on every device they
    span: under Explicit sharding `lax.top_k` and `lax.sort` refuse an axis sharded along
    the one they rank, so columns sharded there are gathered first (what XLA does by itself
    under Auto sharding, where the type carries no sharding and this changes nothing). Row
    sharding is kept."""
    sharding = jax.typeof(scores).sharding
    spec = getattr(sharding, "spec", None)
    if spec is None or len(spec) < scores.ndim or spec[scores.ndim - 1] is None:
        return scores
    gathered = PartitionSpec(*spec[: scores.ndim - 1], None)
    return jax.sharding.reshard(scores, NamedSharding(sharding.mesh, gathered))


def select_with_values(scores, lengths, *, k: int, sorted: bool):
    """top_k's exact path for any dtype: (values, indices) of 2-D rows."""
    scores = columns_gathered(scores)
    columns = select(scores, lengths, None, k=k, sorted=sorted, has_num_valid_rows=False)
    return gather_values(scores, columns), columns


def places_along(x, dimension: int = 1):
    """int32 iota over x's shape along `dimension`, laid out as x is: under Explicit sharding
    lax.sort wants all its operands sharded alike."""
    return lax.broadcasted_iota(jnp.int32, x.shape, dimension, out_sharding=jax.typeof(x).sharding)


def valid_rows(rows: int, num_valid_rows):
    """Row r is valid iff r % group < num_valid_rows[r // group], rows in equal groups."""
    group = rows // num_valid_rows.shape[0]
    row = jnp.arange(rows, dtype=jnp.int32)
    return row % group < num_valid_rows[row // group]


def select(scores, lengths, num_valid_rows, *, k: int, sorted: bool, has_num_valid_rows: bool):
    """The selected columns, int32 [rows, k], -1 past the candidates (docs/contract.md
    section 4); lengths None: every row whole."""
    rows, n = scores.shape
    if rows == 0:
        return jnp.full((0, k), EMPTY_SLOT, jnp.int32)
    keys, is_nan = ordered_keys(columns_gathered(scores))
    columns = places_along(keys)
    candidate = ~is_nan
    if lengths is not None:  # None: every row whole (top_k without lengths)
        candidate &= columns < jnp.clip(lengths, 0, n)[:, None]
    if has_num_valid_rows:
        candidate &= valid_rows(rows, num_valid_rows)[:, None]
    width = min(k, n)
    # Floats of up to 32 bits and integers of up to 16 never have a candidate at int32's
    # minimum (a float's key reaches it only from -NaN's bits 0xFFFFFFFF).
    key_above_minimum = jnp.dtype(scores.dtype).itemsize * 8 <= (
        16 if jnp.issubdtype(scores.dtype, jnp.integer) else 32
    )
    if key_above_minimum:
        # lax.top_k ranks equal keys by the lower index (its documented rule), which is the
        # contract's tie rule on the keys; non-candidates at int32's minimum rank below every
        # candidate.
        _, ranked = lax.top_k(jnp.where(candidate, keys, np.iinfo(np.int32).min), width)
    else:
        # Wider keys: one sort by (not a candidate, key descending, column ascending); the
        # columns make every sort key distinct. ~key reverses the order without overflow.
        _, _, ranked = lax.sort(
            ((~candidate).astype(jnp.int32), ~keys, columns), dimension=1, num_keys=3
        )
        ranked = ranked[:, :width]
    slot = lax.broadcasted_iota(jnp.int32, (rows, width), 1)
    empty = slot >= candidate.sum(axis=1, dtype=jnp.int32)[:, None]
    picked = ranked
    if not sorted:  # ascending columns; no column reaches int32's maximum, so empty stay last
        int32_max = np.iinfo(np.int32).max
        picked = lax.sort(jnp.where(empty, int32_max, picked), dimension=1)
    picked = jnp.where(empty, EMPTY_SLOT, picked)
    if width < k:
        picked = jnp.pad(picked, ((0, 0), (0, k - width)), constant_values=EMPTY_SLOT)
    return picked


def page_transform(columns, page_table, table_rows, *, log2_page_size: int, has_table_rows: bool):
    """Column j of row r -> page_table[t, j >> log2] << log2 | (j & (page_size - 1)) in
    32-bit unsigned arithmetic (as the handlers: a negative or huge page wraps), t =
    table_rows[r] clamped into [0, T) or r; -1 slots stay -1."""
    rows = columns.shape[0]
    if has_table_rows:
        table_row = jnp.clip(table_rows, 0, page_table.shape[0] - 1)
    else:
        table_row = jnp.arange(rows, dtype=jnp.int32)
    present = columns != EMPTY_SLOT
    column = jnp.where(present, columns, 0)
    page = page_table[table_row[:, None], column >> log2_page_size].astype(jnp.uint32)
    offset = (column & ((1 << log2_page_size) - 1)).astype(jnp.uint32)
    written = lax.bitcast_convert_type((page << log2_page_size) + offset, jnp.int32)
    return jnp.where(present, written, EMPTY_SLOT)


def ffi_call(*operands, params: Params):
    """The FFI call's operands and parameters in, its results (the indices, and the values
    when `params.with_values`) out."""
    operands = Operands(*operands)
    scores = operands.scores
    lengths = operands.lengths if params.has_lengths else None
    columns = select_by_params(scores, lengths, operands.num_valid_rows, params)
    values = gather_values(scores, columns) if params.with_values else None
    columns = page_by_params(columns, operands.page_table, operands.table_rows, params)
    return (columns,) if values is None else (columns, values)


def select_by_params(scores, lengths, num_valid_rows, params):
    """`select` with the static parameters of a call (top-k's or the indexer's)."""
    return select(
        scores,
        lengths,
        num_valid_rows,
        k=params.k,
        sorted=params.sorted,
        has_num_valid_rows=params.has_num_valid_rows,
    )


def page_by_params(columns, page_table, table_rows, params):
    """The page transform when the call has a page table (else the columns as they are)."""
    if not (params.has_page_table and columns.shape[0]):
        return columns
    return page_transform(
        columns,
        page_table,
        table_rows,
        log2_page_size=params.log2_page_size,
        has_table_rows=params.has_table_rows,
    )


def merge_places(values, indices, *, k: int, sorted: bool, earlier_first: bool = False):
    """Where merge_topk's k winners sit among each row's m candidates (docs/contract.md
    section 8): int32 [rows, k], -1 past the candidates. An entry is a candidate iff its
    index is >= 0 and its value is not NaN. One `lax.sort` by (not a candidate, key
    descending, column ascending); `sorted=False` orders the k winners by (column ascending,
    key descending). Entries equal in key and column are the same (value, column), so which
    of them goes first shows only in a tangent: `earlier_first` (the JVP rule's order, which
    `winner_places` finds from the winners) adds the place as a last sort key, so that the
    earlier goes first; otherwise it rides along unsorted."""
    rows, m = values.shape
    keys, is_nan = ordered_keys(values)
    candidate = (indices >= 0) & ~is_nan
    width = min(k, m)
    absent = (~candidate).astype(jnp.int32)
    sort_keys = 4 if earlier_first else 3
    _, ranked_keys, ranked_columns, ranked_places = lax.sort(
        (absent, ~keys, indices, places_along(indices)), dimension=1, num_keys=sort_keys
    )
    slot = lax.broadcasted_iota(jnp.int32, (rows, width), 1)
    empty = slot >= candidate.sum(axis=1, dtype=jnp.int32)[:, None]
    places = ranked_places[:, :width]
    if not sorted:  # the empty slots (the last ones) stay last
        _, _, _, places = lax.sort(
            (empty.astype(jnp.int32), ranked_columns[:, :width], ranked_keys[:, :width], places),
            dimension=1,
            num_keys=sort_keys,
        )
    places = jnp.where(empty, EMPTY_SLOT, places)
    return jnp.pad(places, ((0, 0), (0, k - width)), constant_values=EMPTY_SLOT)


def winner_places(values, indices, won_values, won_indices, *, sorted: bool):
    """merge_places(values, indices, k, sorted, earlier_first=True) from the merge's own
    winners (won_values, won_indices [rows, k]), without sorting the m candidates: only the
    k winners are sorted. The last winner in rank order (the smallest key of the filled
    slots, of those the largest column) and how many slots hold its (key, column) decide
    each candidate in one pass: it wins iff it ranks above that pair, or holds the pair and
    fewer than that many earlier places do. The winners, compacted in place order (a running
    count), are then sorted by the output's order with the place last."""
    rows, m = values.shape
    k = won_values.shape[1]
    keys, is_nan = ordered_keys(values)
    candidate = (indices >= 0) & ~is_nan
    won_keys, _ = ordered_keys(won_values)
    filled = won_indices >= 0
    key_limit = np.iinfo(keys.dtype).max
    last_key = jnp.min(jnp.where(filled, won_keys, key_limit), axis=1, keepdims=True)
    at_last_key = filled & (won_keys == last_key)
    last_column = jnp.max(jnp.where(at_last_key, won_indices, EMPTY_SLOT), axis=1, keepdims=True)
    last_count = jnp.sum(
        at_last_key & (won_indices == last_column), axis=1, keepdims=True, dtype=jnp.int32
    )  # int32 as the running counts, also under x64 (strict promotion: no int64 - int32)
    # A row without a winner: last_key is the limit and last_column -1, so nothing wins.
    above = (keys > last_key) | ((keys == last_key) & (indices < last_column))
    holds_last = candidate & (keys == last_key) & (indices == last_column)
    held = holds_last.astype(jnp.int32)  # int arithmetic (strict dtype promotion: no bool - int)
    earlier_holding = jnp.cumsum(held, axis=1) - held
    wins = candidate & (above | (holds_last & (earlier_holding < last_count)))
    # Compacted in place order: winner j (a running count) to slot j; others dropped.
    slot = jnp.where(wins, jnp.cumsum(wins, axis=1, dtype=jnp.int32) - 1, k)
    compact = jax.vmap(lambda s, p: jnp.full((k,), m, jnp.int32).at[s].set(p, mode="drop"))(
        slot, places_along(indices)
    )
    present = compact < m
    source = jnp.minimum(compact, m - 1)
    ranked_keys = ~jnp.take_along_axis(keys, source, axis=1)
    columns = jnp.take_along_axis(indices, source, axis=1)
    absent = (~present).astype(jnp.int32)
    order = (absent, ranked_keys, columns) if sorted else (absent, columns, ranked_keys)
    *_, places = lax.sort((*order, compact), dimension=1, num_keys=4)
    return jnp.where(places < m, places, EMPTY_SLOT)


def merge(values, indices, *, k: int, sorted: bool):
    """merge_topk's exact path for any dtype: the winners at `merge_places`, gathered.
    Returns (values [rows, k], indices [rows, k]); slots past the candidates hold -1 and the
    dtype's empty value."""
    values, indices = columns_gathered(values), columns_gathered(indices)
    places = merge_places(values, indices, k=k, sorted=sorted)
    columns = jnp.take_along_axis(indices, jnp.maximum(places, 0), axis=1)
    return gather_values(values, places), jnp.where(places >= 0, columns, EMPTY_SLOT)


# cuda/common/indexer_inputs.h's sum blocks.
INDEXER_DOT_BLOCK = 128
INDEXER_HEAD_BLOCK = 64


def indexer_logits(q, keys, weights, key_scales, lengths, *, has_key_scales: bool):
    """The lightning indexer's logits [B, M, N] (docs/contract.md section 9) in float32: q
    and keys widened exactly, a float32 dot over each block of INDEXER_DOT_BLOCK d per (query
    head, key), the blocks' dots added in order, the key scale, relu, then the weighted heads
    added in ascending order from +0 in blocks of INDEXER_HEAD_BLOCK (explicit sums, so the
    order is the same in every graph that computes them); -inf past each row's length
    (lengths None: every row whole)."""
    batch, queries, heads, head_dim = q.shape
    keys_count = keys.shape[1]
    # Sums in blocks as the CPU handler's (INDEXER_DOT_BLOCK terms over d, INDEXER_HEAD_BLOCK
    # heads, each block's sum added in order): the contract's bound at any D and H.
    dots = None
    for first in range(0, head_dim, INDEXER_DOT_BLOCK):
        last = min(first + INDEXER_DOT_BLOCK, head_dim)
        block = lax.dot_general(
            q[..., first:last].astype(jnp.float32).reshape(batch, queries * heads, last - first),
            keys[..., first:last].astype(jnp.float32),
            (((2,), (2,)), ((0,), (0,))),
            precision=lax.Precision.HIGHEST,
            preferred_element_type=jnp.float32,
        ).reshape(batch, queries, heads, keys_count)
        dots = block if dots is None else dots + block
    if has_key_scales:
        dots = dots * key_scales[:, None, None, :]
    relu = jnp.maximum(dots, 0.0)
    logits = None
    for first in range(0, heads, INDEXER_HEAD_BLOCK):
        block = weights[:, :, first, None] * relu[:, :, first]
        for head in range(first + 1, min(first + INDEXER_HEAD_BLOCK, heads)):
            block = block + weights[:, :, head, None] * relu[:, :, head]
        logits = block if logits is None else logits + block
    # The stated sum starts at +0: that differs from starting at the first term only where
    # every term is -0, so -0 becomes +0 (a select XLA cannot fold away, as it may `0 + x`).
    logits = jnp.where(logits == 0.0, 0.0, logits)
    return masked_past_lengths(logits, lengths)


def masked_past_lengths(logits, lengths):
    """Logits [B, M, N] with -inf at every key s >= clamp(lengths[b, t], 0, N); lengths None:
    unchanged."""
    if lengths is None:
        return logits
    keys_count = logits.shape[2]
    columns = lax.broadcasted_iota(jnp.int32, logits.shape, 2)
    return jnp.where(columns < jnp.clip(lengths, 0, keys_count)[:, :, None], logits, -jnp.inf)


def indexer_call(*operands, params):
    """The indexer custom call's native operands (`_indexer_lowering.native_operands`) and
    parameters in, its result out: the logits, or topk_filtered's selection of them."""
    operands = IndexerOperands(*operands)
    logits = indexer_logits(
        operands.q,
        operands.keys,
        operands.weights,
        operands.key_scales,
        operands.lengths if params.has_lengths else None,
        has_key_scales=params.has_key_scales,
    )
    if params.op == LOGITS:
        return (logits,)
    batch, queries, keys_count = logits.shape
    rows = batch * queries
    columns = select_by_params(
        logits.reshape(rows, keys_count),
        operands.lengths.reshape(rows),
        operands.num_valid_rows,
        params,
    )
    columns = page_by_params(columns, operands.page_table, operands.table_rows, params)
    return (columns.reshape(batch, queries, params.k),)
