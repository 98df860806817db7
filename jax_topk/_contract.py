"""The operand contract between the Python side and the FFI handlers, stated once.

- `OPERATORS`: the table of operators: the public name, the JAX primitive, the FFI target,
  the score dtypes accepted, the limits and whether the CUDA handler needs a workspace.
- `Operands`: what one call passes, in the order the handlers decode them by position.
- `Params`: the static parameters; `ffi_attributes()` gives the attributes the handlers
  decode by name, `result_avals()` the results.

`_api` builds both records, `_primitives` (batching), `_sharding` (partitioning) and
`_lowering` (the custom call) take them apart by name, never by position. Growing the
contract is one change here: a dtype is an entry of `Operator.dtypes`, a result a name in
`Params.results` with its shape in `Params.result_avals`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from . import _jax_topk_cpu
from ._compat import rows_like

MAX_K = _jax_topk_cpu.MAX_K  # the native code's limits, one definition
MAX_BF16_WIDTH = _jax_topk_cpu.MAX_BF16_WIDTH
SMALL_ROWS_MAX_WIDTH = _jax_topk_cpu.SMALL_ROWS_MAX_WIDTH
SMALL_ROWS_MAX_K = _jax_topk_cpu.SMALL_ROWS_MAX_K
SMALL_ROWS_MAX_K_BY_ROUNDS = _jax_topk_cpu.SMALL_ROWS_MAX_K_BY_ROUNDS
FAST_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
MAX_WIDTH = 2**31 - 1  # the result holds int32 column indices


@dataclass(frozen=True)
class Operator:
    name: str  # the public function, jax_topk.<name>
    primitive: str  # the JAX primitive's name
    target: str  # the FFI target, registered for every backend under this name
    scores_name: str  # what the public function calls its scores argument
    dtypes: tuple[np.dtype, ...]  # the score dtypes it accepts
    max_width: int  # the longest row n
    max_k: int
    needs_workspace: bool  # the CUDA handler takes a device workspace as an extra result
    public: bool = True  # jax_topk.<name> exists (else only top_k reaches it)
    max_rows: int | None = None  # the most rows in one call (vmapped calls included)


OPERATORS = {
    operator.name: operator
    for operator in (
        Operator(
            name="topk_bf16",
            primitive="jax_topk_bf16",
            target="jax_topk_bf16",
            scores_name="scores",
            dtypes=(jnp.dtype(jnp.bfloat16),),
            max_width=MAX_BF16_WIDTH,
            max_k=MAX_K,
            needs_workspace=False,
            max_rows=2**31 - 1,  # the CUDA kernel's thread block a row: the grid's x extent
        ),
        Operator(  # top_k's short rows (MoE routing); no public function of its own
            name="small_rows",
            primitive="jax_topk_small_rows",
            target="jax_topk_small_rows",
            scores_name="operand",
            dtypes=FAST_DTYPES,
            max_width=SMALL_ROWS_MAX_WIDTH,
            max_k=SMALL_ROWS_MAX_K,
            needs_workspace=False,
            public=False,
        ),
        Operator(
            name="topk_filtered",
            primitive="jax_topk_filtered",
            target="jax_topk_filtered",
            scores_name="logits",
            dtypes=FAST_DTYPES,
            max_width=MAX_WIDTH,
            max_k=MAX_K,
            needs_workspace=True,
        ),
    )
}


class Operands(NamedTuple):
    """The operands of a call, 2-D, in the handlers' order. An absent optional operand is an
    empty int32 placeholder (`absent(ndim)`), and a `Params.has_*` flag says it is absent."""

    scores: Any  # [rows, n], one of the operator's dtypes
    lengths: Any  # int32 [rows]; absent (every row whole, top_k without lengths): [0]
    page_table: Any  # int32 [T, pages] (T = rows without table_rows); absent: [0, 0]
    table_rows: Any  # int32 [rows]; absent: [0]
    num_valid_rows: Any  # int32 [groups], a limit per equal group of consecutive rows; absent: [0]

    @staticmethod
    def absent(ndim: int):
        return jnp.zeros((0,) * ndim, jnp.int32)


@dataclass(frozen=True)
class Params:
    """The static parameters of a call (hashable: JAX keys its caches on them)."""

    op: str  # a key of OPERATORS
    k: int
    log2_page_size: int
    sorted: bool
    has_page_table: bool
    has_table_rows: bool
    has_num_valid_rows: bool
    with_values: bool = False  # a second result: the selected values (top_k)
    # lengths given; False (top_k without lengths): every row is whole and lengths is the
    # empty placeholder, so no [rows] array of n is built and broadcast on the device
    has_lengths: bool = True

    @property
    def operator(self) -> Operator:
        return OPERATORS[self.op]

    def ffi_attributes(self) -> dict:
        """The custom call's attributes, named as the handlers decode them."""
        return dict(
            k=np.int32(self.k),
            log2_page_size=np.int32(self.log2_page_size),
            sorted=np.bool_(self.sorted),
            has_page_table=np.bool_(self.has_page_table),
            has_table_rows=np.bool_(self.has_table_rows),
            has_num_valid_rows=np.bool_(self.has_num_valid_rows),
            with_values=np.bool_(self.with_values),
            has_lengths=np.bool_(self.has_lengths),
        )

    @property
    def results(self) -> tuple[str, ...]:
        """The results' names, in the handlers' order."""
        return ("indices", "values") if self.with_values else ("indices",)

    def result_avals(self, operands: Operands) -> tuple[jax.core.ShapedArray, ...]:
        scores = operands.scores
        shape = (scores.shape[0], self.k)
        shapes = {
            "indices": rows_like(scores, shape, np.int32),  # column indices
            "values": rows_like(scores, shape, scores.dtype),
        }
        return tuple(shapes[name] for name in self.results)
