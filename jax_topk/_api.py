"""The user-facing functions: check the arguments, bring them to the primitives' 2-D form,
bind, and give the result the scores' leading shape."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from . import _checks
from ._contract import Operands, Params
from ._primitives import PRIMITIVES

_INT32_MAX = np.iinfo(np.int32).max
_INT32_MIN = np.iinfo(np.int32).min


def host_integers(value):
    """`jnp.asarray(value)`, except that host integers wider than int32 saturate to its range
    first (NumPy arrays of 64-bit integers, Python ints and lists of them): with x64 off
    (JAX's default) jnp.asarray narrows them by wrapping, so a length of 2**31 would become
    -2**31, an empty row, before any clamp could see it (a Python int past int64 raises)."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = np.asarray(_saturated(value), np.int32)
    elif isinstance(value, (list, tuple)):
        integers = _host_integer_list(value)
        if integers is not None:
            value = integers
    if isinstance(value, (np.ndarray, np.generic)) and value.dtype.kind in "iu":
        if value.dtype.itemsize > 4:
            low = 0 if value.dtype.kind == "u" else _INT32_MIN
            value = np.clip(value, np.array(low, value.dtype), np.array(_INT32_MAX, value.dtype))
            value = value.astype(np.int32)
    return jnp.asarray(value)


def _saturated(value: int) -> int:
    """A Python int clamped into int32's range."""
    return min(max(int(value), _INT32_MIN), _INT32_MAX)


def _host_integer_list(value):
    """A (nested) list of Python or NumPy integers as a saturated int32 array; None for
    anything else (floats, bools, JAX arrays or tracers: jnp.asarray's to take). Converted
    element by element, since NumPy would make [2**63, 1] float64 and JAX would wrap a
    uint64."""
    try:
        items = np.array(value, dtype=object)
    except ValueError:  # ragged: jnp.asarray's error
        return None
    flat = items.reshape(-1)
    if not all(
        isinstance(item, (int, np.integer)) and not isinstance(item, (bool, np.bool_))
        for item in flat
    ):
        return None
    return np.array([_saturated(item) for item in flat], np.int32).reshape(items.shape)


def as_int32(value):
    """Integer runtime values as int32, saturating (not wrapping) wider ones."""
    if isinstance(value, int):  # a Python int may not fit any JAX integer
        return jnp.int32(_saturated(value))
    value = host_integers(value)
    if value.dtype == jnp.int32:
        return value
    info = jnp.iinfo(value.dtype)
    if info.max > _INT32_MAX or info.min < _INT32_MIN:
        bounds = np.array([max(info.min, _INT32_MIN), min(info.max, _INT32_MAX)], value.dtype)
        value = jnp.clip(value, bounds[0], bounds[1])
    return value.astype(jnp.int32)


def topk(op, scores, lengths, *, k, page_table, page_size, table_rows, num_valid_rows, sorted):
    """Checks the arguments, states the call as `Operands` and `Params` (the 2-D form the
    primitives take), binds, and gives the indices the scores' leading shape."""
    scores = jnp.asarray(scores)
    _checks.require_lengths(
        op, lengths, "pass jnp.full(scores.shape[:-1], scores.shape[-1]), or use jax_topk.top_k"
    )
    lengths = host_integers(lengths)
    k = _checks.check_k(op, k)
    log2_page_size = _checks.check_page_size(op, page_size)
    sorted = _checks.check_sorted(op, sorted)
    leading, n = _checks.check_scores(op, scores)
    _checks.check_lengths(op, lengths, leading)
    if page_table is not None:
        page_table = jnp.asarray(page_table)
    if table_rows is not None:
        table_rows = host_integers(table_rows)
    _checks.check_page_table(op, page_table, table_rows, leading, n, page_size)
    _checks.check_num_valid_rows(op, num_valid_rows, leading)

    rows = int(np.prod(leading, dtype=np.int64))
    if page_table is not None:
        page_table = page_table.reshape(-1, page_table.shape[-1])
    if table_rows is not None:
        table_rows = as_int32(table_rows).reshape(rows)
    if num_valid_rows is not None:
        num_valid_rows = as_int32(num_valid_rows).reshape(1)
    params = Params(
        op=op,
        k=k,
        log2_page_size=log2_page_size,
        sorted=sorted,
        has_page_table=page_table is not None,
        has_table_rows=table_rows is not None,
        has_num_valid_rows=num_valid_rows is not None,
    )
    operands = Operands(
        scores=scores.reshape(rows, n),
        lengths=as_int32(lengths).reshape(rows),
        page_table=Operands.absent(2) if page_table is None else page_table,
        table_rows=Operands.absent(1) if table_rows is None else table_rows,
        num_valid_rows=Operands.absent(1) if num_valid_rows is None else num_valid_rows,
    )
    (indices,) = PRIMITIVES[op].bind(*operands, params=params)
    return indices.reshape(*leading, k)


def topk_bf16(
    scores,
    lengths,
    *,
    k=512,
    page_table=None,
    page_size=1,
    table_rows=None,
    num_valid_rows=None,
    sorted=False,
):
    """Exact top-k of bfloat16 rows up to 16384 long: int32 column indices [..., k].

    Row r selects among columns [0, clamp(lengths[r], 0, n)), never a NaN; values rank in
    IEEE total order (-0 below +0) and equal values rank the lower column first. Slots past
    the number of candidates hold -1. `sorted=False` gives ascending columns, `sorted=True`
    rank order (as jax.lax.top_k). With `page_table`, column j of row r is written as
    page_table[t, j // page_size] * page_size + j % page_size, t = table_rows[r] (clamped)
    or r. Rows at or past `num_valid_rows` (2-D scores only) are all -1 and never read.
    """
    return topk(
        "topk_bf16",
        scores,
        lengths,
        k=k,
        page_table=page_table,
        page_size=page_size,
        table_rows=table_rows,
        num_valid_rows=num_valid_rows,
        sorted=sorted,
    )


def topk_filtered(
    logits,
    lengths,
    *,
    k=2048,
    page_table=None,
    page_size=1,
    table_rows=None,
    num_valid_rows=None,
    sorted=False,
):
    """Exact top-k of float32, bfloat16 or float16 rows of any length: int32 column indices
    [..., k].

    The same contract as topk_bf16 (see its docstring) for logits of any of the three types
    (16-bit rows are read at two bytes an element); on the GPU a sample of each row proposes a
    boundary that one full pass validates, so long rows are read about once.
    """
    return topk(
        "topk_filtered",
        logits,
        lengths,
        k=k,
        page_table=page_table,
        page_size=page_size,
        table_rows=table_rows,
        num_valid_rows=num_valid_rows,
        sorted=sorted,
    )
