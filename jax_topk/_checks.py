"""Trace-time argument checks and the shape rule (docs/contract.md section 5).

Every error a user can cause with a static argument is raised here, before anything runs,
with a message that names the argument, the value and the limit.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ._contract import FAST_DTYPES, MAX_WIDTH, OPERATORS, Operands, Params
from ._indexer_contract import INPUT_DTYPES
from ._widening import NARROW_DTYPES


def check_k(op: str, k, max_k: int | None = None) -> int:
    """k of an operator of OPERATORS (or of another with its own `max_k`)."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise TypeError(f"{op}: k must be a Python int, got {k!r} of type {type(k).__name__}")
    max_k = OPERATORS[op].max_k if max_k is None else max_k
    if not 1 <= k <= max_k:
        raise ValueError(f"{op}: k={k} is out of range; it must satisfy 1 <= k <= {max_k}")
    return int(k)


def check_page_size(op: str, page_size) -> int:
    """Returns log2(page_size)."""
    if isinstance(page_size, bool) or not isinstance(page_size, (int, np.integer)):
        raise TypeError(f"{op}: page_size must be a Python int, got {page_size!r}")
    if page_size < 1 or page_size & (page_size - 1):
        raise ValueError(f"{op}: page_size={page_size} must be a power of two >= 1")
    if page_size > 1 << 30:
        raise ValueError(f"{op}: page_size={page_size} exceeds the limit 2**30")
    return int(page_size).bit_length() - 1


def _other_operator_hint(op: str, dtype) -> str:
    """Where the dtype has an operator of its own, the error names it (and the cast)."""
    for other in OPERATORS.values():
        if other.public and other.name != op and dtype in other.dtypes:
            rows = f" up to {other.max_width}" if other.max_width < MAX_WIDTH else ""
            cast = OPERATORS[op].dtypes[0].name
            return (
                f" (use jax_topk.{other.name} for {dtype.name} rows{rows}, or cast "
                f"with .astype(jnp.{cast}))"
            )
    return ""


def check_scores(op: str, scores) -> tuple[tuple[int, ...], int]:
    """Returns (leading shape, n)."""
    operator = OPERATORS[op]
    name = operator.scores_name
    if scores.dtype not in operator.dtypes:
        accepted = " or ".join(d.name for d in operator.dtypes)
        raise TypeError(
            f"{op}: {name} must be {accepted}, got {scores.dtype}"
            f"{_other_operator_hint(op, scores.dtype)}"
        )
    if scores.ndim < 1:
        raise ValueError(f"{op}: {name} must have at least one dimension, got shape {scores.shape}")
    n = scores.shape[-1]
    if n < 1:
        raise ValueError(f"{op}: {name} row length n={n} must be >= 1")
    if n > MAX_WIDTH:
        raise ValueError(
            f"{op}: {name} row length n={n} exceeds the limit {MAX_WIDTH} "
            "(the result holds int32 column indices)"
        )
    if n > operator.max_width:
        raise ValueError(
            f"{op}: {name} row length n={n} exceeds the limit {operator.max_width} "
            "(use jax_topk.topk_filtered for longer rows)"
        )
    return tuple(scores.shape[:-1]), n


def _check_integer(
    op: str, name: str, value, shape: tuple[int, ...] | None, shape_is="the scores' leading shape"
):
    if not jnp.issubdtype(value.dtype, jnp.integer):
        raise TypeError(f"{op}: {name} must be an integer array, got dtype {value.dtype}")
    if shape is not None and tuple(value.shape) != shape:
        raise ValueError(
            f"{op}: {name} has shape {tuple(value.shape)}, expected {shape} ({shape_is})"
        )


def require_lengths(op: str, lengths, whole_rows_hint: str):
    """The operators whose `lengths` is required name it when it is missing (else
    jnp.asarray(None) fails with a message that names nothing)."""
    if lengths is None:
        raise TypeError(
            f"{op}: lengths is required (an integer array, one length per row); "
            f"for whole rows {whole_rows_hint}"
        )


def check_lengths(op: str, lengths, leading: tuple[int, ...], shape_is=None):
    """`shape_is`: what the expected shape is, for the message."""
    _check_integer(op, "lengths", lengths, leading, shape_is or "the scores' leading shape")


def check_page_table(op: str, page_table, table_rows, leading, n: int, page_size: int):
    if page_table is None:
        if table_rows is not None:
            raise ValueError(f"{op}: table_rows was given without page_table")
        return
    if page_table.dtype != jnp.int32:
        raise TypeError(f"{op}: page_table must be int32, got {page_table.dtype}")
    if table_rows is None:
        if tuple(page_table.shape[:-1]) != leading or page_table.ndim != len(leading) + 1:
            raise ValueError(
                f"{op}: page_table has shape {tuple(page_table.shape)}; without table_rows it "
                f"needs one table row per score row, shape {leading + ('pages',)}"
            )
    else:
        if page_table.ndim != 2:
            raise ValueError(
                f"{op}: page_table must be 2-D [T, pages] with table_rows, got "
                f"shape {tuple(page_table.shape)}"
            )
        if page_table.shape[0] < 1 and int(np.prod(leading, dtype=np.int64)) > 0:
            raise ValueError(f"{op}: page_table has T=0 rows; table_rows needs T >= 1")
        # Any integer dtype: a runtime value, saturated to int32 as lengths are.
        _check_integer(op, "table_rows", table_rows, leading)
    pages = page_table.shape[-1]
    if pages * page_size < n:
        raise ValueError(
            f"{op}: page_table is too small: pages * page_size = {pages} * "
            f"{page_size} = {pages * page_size} < n = {n}"
        )


def check_num_valid_rows(op: str, num_valid_rows, leading):
    if num_valid_rows is None:
        return
    if len(leading) != 1:
        raise ValueError(
            f"{op}: num_valid_rows needs 2-D scores [rows, n], got leading shape {leading}"
        )
    if jnp.ndim(num_valid_rows) != 0:
        raise ValueError(
            f"{op}: num_valid_rows must be a scalar, got shape {jnp.shape(num_valid_rows)}"
        )
    dtype = jnp.result_type(num_valid_rows)
    if not jnp.issubdtype(dtype, jnp.integer):
        raise TypeError(f"{op}: num_valid_rows must be an integer, got dtype {dtype}")


# top_k's dtypes: the fast kernels' three, and what the exact slower path also orders.
TOP_K_DTYPES = tuple(
    dict.fromkeys(  # no repeats: the narrow dtypes include the 8- and 16-bit integers
        (
            *FAST_DTYPES,
            np.dtype(np.float64),
            *(np.dtype(f"{kind}int{bits}") for kind in ("", "u") for bits in (8, 16, 32, 64)),
            *NARROW_DTYPES,  # widened exactly to a kernel's dtype (_widening.py)
        )
    )
)


def check_top_k_dtype(operand):
    if operand.dtype not in TOP_K_DTYPES:
        raise TypeError(
            f"top_k: operand dtype {operand.dtype} is not supported; it must be one of "
            + ", ".join(d.name for d in TOP_K_DTYPES)
        )


def check_top_k_operand(operand) -> tuple[tuple[int, ...], int]:
    """top_k's operand with its axis moved last (its dtype and rank checked already, by
    check_top_k_dtype and check_axis): returns (leading shape, n)."""
    n = operand.shape[-1]
    if not 1 <= n <= MAX_WIDTH:
        raise ValueError(f"top_k: operand row length n={n} must be in [1, {MAX_WIDTH}]")
    return tuple(operand.shape[:-1]), n


def check_top_k_k(k, n: int, *, op: str = "top_k", width: str = "n") -> int:
    """k against the row length (named `width` in the message: top_k's n, merge_topk's m)."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise TypeError(f"{op}: k must be a Python int, got {k!r} of type {type(k).__name__}")
    if not 1 <= k <= n:
        raise ValueError(f"{op}: k={k} is out of range; it must satisfy 1 <= k <= {width}={n}")
    return int(k)


def check_merge_operands(values, indices) -> tuple[tuple[int, ...], int]:
    """merge_topk's candidate lists: returns (leading shape, m)."""
    if values.dtype not in TOP_K_DTYPES:
        raise TypeError(
            f"merge_topk: values dtype {values.dtype} is not supported; it must be one of "
            + ", ".join(d.name for d in TOP_K_DTYPES)
        )
    if indices.dtype != jnp.int32:
        raise TypeError(f"merge_topk: indices must be int32 (global columns), got {indices.dtype}")
    if values.shape != indices.shape:
        raise ValueError(
            f"merge_topk: values {tuple(values.shape)} and indices {tuple(indices.shape)} "
            "must have one shape [..., m]"
        )
    if values.ndim < 1 or values.shape[-1] < 1:
        raise ValueError(
            f"merge_topk: values and indices need a last axis of m >= 1 candidates, got "
            f"shape {tuple(values.shape)}"
        )
    return tuple(values.shape[:-1]), values.shape[-1]


def check_bool(op: str, name: str, flag) -> bool:
    if not isinstance(flag, (bool, np.bool_)):
        raise TypeError(f"{op}: {name} must be a Python bool, got {flag!r}")
    return bool(flag)


def check_sorted(op: str, sorted_) -> bool:
    return check_bool(op, "sorted", sorted_)


def check_axis(op: str, axis, operand) -> int:
    """The axis a top-k runs along, as a non-negative int (`operand` needs a dimension)."""
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(
            f"{op}: axis must be a Python int, got {axis!r} of type {type(axis).__name__}"
        )
    if operand.ndim < 1:
        raise ValueError(
            f"{op}: operand must have at least one dimension (axis={axis} names none), got "
            f"shape {operand.shape}"
        )
    if not -operand.ndim <= axis < operand.ndim:
        raise ValueError(
            f"{op}: axis={axis} is out of range for an operand of {operand.ndim} dimensions; "
            f"it must satisfy {-operand.ndim} <= axis < {operand.ndim}"
        )
    return int(axis) % operand.ndim


def shape_rule(*avals, params: Params):
    """The shape rule of the 2-D primitives (the user-facing checks above ran already)."""
    operands = Operands(*avals)
    scores, lengths, num_valid_rows = operands.scores, operands.lengths, operands.num_valid_rows
    rows = scores.shape[0]
    max_rows = OPERATORS[params.op].max_rows
    if max_rows is not None and rows > max_rows:
        raise ValueError(
            f"{params.op}: {rows} rows (every leading axis, vmapped calls included) exceed its "
            f"limit of {max_rows}; split the call"
        )
    lengths_shape = (rows,) if params.has_lengths else (0,)
    if scores.ndim != 2 or lengths.shape != lengths_shape or lengths.dtype != np.int32:
        raise ValueError(
            f"{params.op}: internal operands must be scores [rows, n] and int32 "
            f"lengths {list(lengths_shape)}; got {scores.shape} and {lengths.dtype}{lengths.shape}"
        )
    if (
        params.has_num_valid_rows
        and rows
        and (
            num_valid_rows.ndim != 1
            or not num_valid_rows.shape[0]
            or rows % num_valid_rows.shape[0]
        )
    ):
        raise ValueError(
            f"{params.op}: num_valid_rows {num_valid_rows.shape} does not split "
            f"{rows} rows into equal groups"
        )
    return params.result_avals(operands)


# The indexer's largest H and D: its sums in blocks (128 terms over d, 64 heads) round at most
# ~190 + D / 128 + H / 64 times, within the contract's 2e-5 (~335 float32 roundings) up to
# D / 128 + H / 64 ~ 145; these limits keep it at 96.
INDEXER_MAX_HEADS = 2048
INDEXER_MAX_HEAD_DIM = 8192


def check_indexer_inputs(op: str, q, keys, weights, key_scales) -> tuple[int, int, int, int]:
    """The lightning indexer's arrays (docs/contract.md section 9): returns (M, H, D, N)."""
    accepted = " or ".join(d.name for d in INPUT_DTYPES)
    if q.dtype not in INPUT_DTYPES:
        raise TypeError(f"{op}: q must be {accepted}, got {q.dtype}")
    if keys.dtype != q.dtype:
        raise TypeError(f"{op}: keys must have q's dtype {q.dtype}, got {keys.dtype}")
    if q.ndim != 3:
        raise ValueError(f"{op}: q must be 3-D [M, H, D], got shape {tuple(q.shape)}")
    queries, heads, head_dim = q.shape
    if keys.ndim != 2 or keys.shape[1] != head_dim:
        raise ValueError(
            f"{op}: keys must be 2-D [N, D] with q's D={head_dim}, got shape {tuple(keys.shape)}"
        )
    keys_count = keys.shape[0]
    if heads < 1 or head_dim < 1:
        raise ValueError(f"{op}: q needs H >= 1 heads and D >= 1, got shape {tuple(q.shape)}")
    if heads > INDEXER_MAX_HEADS or head_dim > INDEXER_MAX_HEAD_DIM:
        raise ValueError(
            f"{op}: q has H={heads} heads of D={head_dim}; the limits are H <= "
            f"{INDEXER_MAX_HEADS} and D <= {INDEXER_MAX_HEAD_DIM} (past them the float32 sums, "
            "even in blocks, could leave the accuracy bound of docs/contract.md section 9)"
        )
    if not 1 <= keys_count <= MAX_WIDTH:
        raise ValueError(
            f"{op}: keys has N={keys_count} rows; it must satisfy 1 <= N <= {MAX_WIDTH} "
            "(the logits' row length, int32 column indices)"
        )
    if weights.dtype != jnp.float32:
        raise TypeError(f"{op}: weights must be float32, got {weights.dtype}")
    if tuple(weights.shape) != (queries, heads):
        raise ValueError(
            f"{op}: weights has shape {tuple(weights.shape)}, expected (M, H) = {(queries, heads)}"
        )
    if key_scales is not None:
        if key_scales.dtype != jnp.float32:
            raise TypeError(f"{op}: key_scales must be float32, got {key_scales.dtype}")
        if tuple(key_scales.shape) != (keys_count,):
            raise ValueError(
                f"{op}: key_scales has shape {tuple(key_scales.shape)}, expected (N,) = "
                f"{(keys_count,)}"
            )
    return queries, heads, head_dim, keys_count
