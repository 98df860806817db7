"""The lightning indexer's operand contract (docs/contract.md section 9), stated once.

- `IndexerOperands`: what one call of either primitive passes, every array with a leading
  batch dim (the sequences of a vmap; 1 outside one). `indexer_logits` passes placeholders
  for the page table, table_rows and num_valid_rows, and for lengths when it has none (so
  that no [M] array of N is built on every call: XLA keeps such a fill as a kernel).
- `IndexerParams`: the static parameters; `ffi_attributes()` gives the attributes both
  targets decode by name, `result_aval()` the one result.

`_indexer` builds both records, `_indexer_primitives` (batching, sharding) and
`_indexer_lowering` (the custom call) take them apart by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ._contract import MAX_K

INPUT_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float8_e4m3fn))  # q and keys share one
LOGITS = "indexer_logits"
TOPK = "indexer_topk"
TARGETS = {LOGITS: "jax_topk_indexer_logits", TOPK: "jax_topk_indexer_topk"}
INDEXER_MAX_K = MAX_K  # indexer_topk selects with topk_filtered's selection


class IndexerOperands(NamedTuple):
    """The operands in the handlers' order. An absent optional operand is an empty int32 or
    float32 placeholder and an `IndexerParams.has_*` flag says so."""

    q: Any  # [B, M, H, D], bfloat16 or float8_e4m3fn
    keys: Any  # [B, N, D], q's dtype
    weights: Any  # float32 [B, M, H]
    key_scales: Any  # float32 [B, N]; absent: float32 [0, 0]
    lengths: Any  # int32 [B, M]; absent (indexer_logits without lengths): int32 [0, 0]
    page_table: Any  # int32 [B, M, pages] or, with table_rows, [B, T, pages]; absent [0, 0, 0]
    table_rows: Any  # int32 [B, M], rows of the call's own [T, pages] table; absent: [0, 0]
    num_valid_rows: Any  # int32 [B], one limit per sequence; absent: [0]

    @staticmethod
    def absent(ndim: int, dtype=jnp.int32):
        return jnp.zeros((0,) * ndim, dtype)


@dataclass(frozen=True)
class IndexerParams:
    """The static parameters of a call (hashable: JAX keys its caches on them)."""

    op: str  # LOGITS or TOPK
    has_key_scales: bool
    has_lengths: bool  # False only for indexer_logits called without lengths
    k: int = 1
    log2_page_size: int = 0
    sorted: bool = False
    has_page_table: bool = False
    has_table_rows: bool = False
    has_num_valid_rows: bool = False

    @property
    def target(self) -> str:
        return TARGETS[self.op]

    def ffi_attributes(self) -> dict:
        """The custom call's attributes, named as the handlers decode them (both targets
        take all of them)."""
        return dict(
            k=np.int32(self.k),
            log2_page_size=np.int32(self.log2_page_size),
            sorted=np.bool_(self.sorted),
            has_key_scales=np.bool_(self.has_key_scales),
            has_lengths=np.bool_(self.has_lengths),
            has_page_table=np.bool_(self.has_page_table),
            has_table_rows=np.bool_(self.has_table_rows),
            has_num_valid_rows=np.bool_(self.has_num_valid_rows),
        )

    def result_aval(self, operands: IndexerOperands) -> jax.core.ShapedArray:
        batch, queries = operands.q.shape[:2]
        if self.op == LOGITS:
            return jax.core.ShapedArray((batch, queries, operands.keys.shape[1]), np.float32)
        return jax.core.ShapedArray((batch, queries, self.k), np.int32)
