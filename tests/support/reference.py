"""The contract of docs/contract.md sections 3-4 written plainly in NumPy: a full sort of each
row by (ordered key descending, column ascending). Independent of the native code on purpose."""

from __future__ import annotations

import numpy as np

from .families import BF16


def ordered_keys(row):
    if row.dtype == BF16:
        bits = row.view(np.uint16).astype(np.int64)
        sign, mask = 0x8000, 0xFFFF
    else:
        bits = row.view(np.uint32).astype(np.int64)
        sign, mask = 0x80000000, 0xFFFFFFFF
    return np.where(bits & sign, ~bits & mask, bits | sign)


def reference_topk(
    scores,
    lengths,
    k,
    *,
    page_table=None,
    page_size=1,
    table_rows=None,
    num_valid_rows=None,
    sorted=False,
):
    scores = np.asarray(scores)
    n = scores.shape[-1]
    leading = scores.shape[:-1]
    rows = int(np.prod(leading, dtype=np.int64))
    flat = scores.reshape(rows, n)
    lengths = np.asarray(lengths, np.int64).reshape(rows)
    tables = (
        None if page_table is None else np.asarray(page_table).reshape(-1, np.shape(page_table)[-1])
    )
    trows = None if table_rows is None else np.asarray(table_rows, np.int64).reshape(rows)
    valid_rows = rows if num_valid_rows is None else int(np.clip(num_valid_rows, 0, rows))
    out = np.full((rows, k), -1, np.int32)
    for r in range(valid_rows):
        length = int(np.clip(lengths[r], 0, n))
        row = flat[r, :length]
        cols = np.nonzero(~np.isnan(row.astype(np.float32)))[0]
        keys = ordered_keys(row)[cols]
        order = np.lexsort((cols, -keys))[:k]  # rank: key descending, then column ascending
        chosen = cols[order] if sorted else np.sort(cols[order])
        if tables is not None:
            t = r if trows is None else int(np.clip(trows[r], 0, tables.shape[0] - 1))
            pages = tables[t][chosen // page_size].astype(np.int64)
            wrapped = (pages * page_size + chosen % page_size) & 0xFFFFFFFF
            chosen = wrapped.astype(np.uint32).view(np.int32)
        out[r, : len(chosen)] = chosen
    return out.reshape(*leading, k)
