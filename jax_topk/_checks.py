"""Trace-time argument checks and the shape rule (docs/contract.md section 5).

Every error a user can cause with a static argument is raised here, before anything runs,
with a message that names the argument, the value and the limit.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from . import _jax_topk_cpu

MAX_K = _jax_topk_cpu.MAX_K                    # the native code's limits, one definition
MAX_BF16_WIDTH = _jax_topk_cpu.MAX_BF16_WIDTH
MAX_WIDTH = 2**31 - 1


def check_k(op: str, k) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise TypeError(f"{op}: k must be a Python int, got {k!r} of type {type(k).__name__}")
    if not 1 <= k <= MAX_K:
        raise ValueError(f"{op}: k={k} is out of range; it must satisfy 1 <= k <= {MAX_K}")
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


def check_scores(op: str, scores) -> tuple[tuple[int, ...], int]:
    """Returns (leading shape, n)."""
    if op == "topk_bf16":
        if scores.dtype != jnp.bfloat16:
            hint = (" (use jax_topk.topk_filtered for float32 rows, or cast with "
                    ".astype(jnp.bfloat16))") if scores.dtype == jnp.float32 else ""
            raise TypeError(f"topk_bf16: scores must be bfloat16, got {scores.dtype}{hint}")
    elif scores.dtype != jnp.float32:
        hint = (" (use jax_topk.topk_bf16 for bfloat16 rows up to 16384, or cast with "
                ".astype(jnp.float32))") if scores.dtype == jnp.bfloat16 else ""
        raise TypeError(f"topk_filtered: logits must be float32, got {scores.dtype}{hint}")
    name = "scores" if op == "topk_bf16" else "logits"
    if scores.ndim < 1:
        raise ValueError(f"{op}: {name} must have at least one dimension, got shape {scores.shape}")
    n = scores.shape[-1]
    if n < 1:
        raise ValueError(f"{op}: {name} row length n={n} must be >= 1")
    if n > MAX_WIDTH:
        raise ValueError(f"{op}: {name} row length n={n} exceeds the limit {MAX_WIDTH} "
                         "(the result holds int32 column indices)")
    if op == "topk_bf16" and n > MAX_BF16_WIDTH:
        raise ValueError(f"topk_bf16: scores row length n={n} exceeds the limit {MAX_BF16_WIDTH} "
                         "(use jax_topk.topk_filtered for longer rows)")
    return tuple(scores.shape[:-1]), n


def _check_integer(op: str, name: str, value, shape: tuple[int, ...] | None):
    if not jnp.issubdtype(value.dtype, jnp.integer):
        raise TypeError(f"{op}: {name} must be an integer array, got dtype {value.dtype}")
    if shape is not None and tuple(value.shape) != shape:
        raise ValueError(f"{op}: {name} has shape {tuple(value.shape)}, expected {shape} "
                         "(the scores' leading shape)")


def check_lengths(op: str, lengths, leading: tuple[int, ...]):
    _check_integer(op, "lengths", lengths, leading)


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
                f"needs one table row per score row, shape {leading + ('pages',)}")
    else:
        if page_table.ndim != 2:
            raise ValueError(f"{op}: page_table must be 2-D [T, pages] with table_rows, got "
                             f"shape {tuple(page_table.shape)}")
        if page_table.shape[0] < 1 and int(np.prod(leading, dtype=np.int64)) > 0:
            raise ValueError(f"{op}: page_table has T=0 rows; table_rows needs T >= 1")
        if table_rows.dtype != jnp.int32:
            raise TypeError(f"{op}: table_rows must be int32, got {table_rows.dtype}")
        if tuple(table_rows.shape) != leading:
            raise ValueError(f"{op}: table_rows has shape {tuple(table_rows.shape)}, expected "
                             f"{leading} (the scores' leading shape)")
    pages = page_table.shape[-1]
    if pages * page_size < n:
        raise ValueError(f"{op}: page_table is too small: pages * page_size = {pages} * "
                         f"{page_size} = {pages * page_size} < n = {n}")


def check_num_valid_rows(op: str, num_valid_rows, leading):
    if num_valid_rows is None:
        return
    if len(leading) != 1:
        raise ValueError(f"{op}: num_valid_rows needs 2-D scores [rows, n], got leading shape "
                         f"{leading}")
    if jnp.ndim(num_valid_rows) != 0:
        raise ValueError(f"{op}: num_valid_rows must be a scalar, got shape "
                         f"{jnp.shape(num_valid_rows)}")
    dtype = jnp.result_type(num_valid_rows)
    if not jnp.issubdtype(dtype, jnp.integer):
        raise TypeError(f"{op}: num_valid_rows must be an integer, got dtype {dtype}")


def check_sorted(op: str, sorted_) -> bool:
    if not isinstance(sorted_, (bool, np.bool_)):
        raise TypeError(f"{op}: sorted must be a Python bool, got {sorted_!r}")
    return bool(sorted_)


def output_shape(scores, lengths, page_table, table_rows, num_valid_rows, *, op, k,
                 has_num_valid_rows, **_):
    """The shape rule of the 2-D primitives (the user-facing checks above ran already)."""
    del page_table, table_rows
    rows = scores.shape[0]
    if scores.ndim != 2 or lengths.shape != (rows,) or lengths.dtype != np.int32:
        raise ValueError(f"{op}: internal operands must be scores [rows, n] and int32 lengths "
                         f"[rows]; got {scores.shape} and {lengths.dtype}{lengths.shape}")
    if has_num_valid_rows and rows and (num_valid_rows.ndim != 1 or not num_valid_rows.shape[0]
                                        or rows % num_valid_rows.shape[0]):
        raise ValueError(f"{op}: num_valid_rows {num_valid_rows.shape} does not split {rows} rows "
                         "into equal groups")
    return jax.core.ShapedArray((rows, k), np.int32)
