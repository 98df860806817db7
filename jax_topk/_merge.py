"""`jax_topk.merge_topk` (docs/contract.md section 8): candidate lists [..., m] (values and
global int32 columns, -1 for none) merged into the exact top-k of their union.

The primitive `merge_p` takes 2-D [rows, m] values and indices and returns (values,
indices) [rows, k]; vmap folds the batch into the rows; on several devices it runs through
`custom_partitioning`, each device merging its own rows. It lowers to the FFI target
`jax_topk_merge` (the CPU handler, the CUDA kernel) or, on other platforms and when
forced, to `_fallback.merge`. The public function routes other dtypes, k > 2048 and
m > 64 x 2048 to `_fallback.merge` directly: the same result, by a full sort.
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.custom_partitioning import custom_partitioning
from jax.extend import core
from jax.interpreters import batching, mlir
from jax.sharding import NamedSharding, PartitionSpec

from . import _checks, _compat, _fallback, _jax_topk_cpu, _widening
from ._batch_layout import Fold, mapped_first
from ._compat import rows_like
from ._contract import FAST_DTYPES, MAX_K
from ._lowering import uses_fallback

MAX_MERGE_WIDTH = _jax_topk_cpu.MAX_MERGE_WIDTH  # the kernel's longest candidate list
TARGET = "jax_topk_merge"

merge_p = core.Primitive("jax_topk_merge")
merge_p.multiple_results = True


def _shape_rule(values, indices, *, k: int, sorted: bool, local: bool):
    del sorted, local
    shape = (values.shape[0], k)
    return rows_like(values, shape, values.dtype), rows_like(values, shape, np.int32)


def _batch(args, dims, **params):
    """vmap: the mapped axis becomes more rows (folded as `_batch_layout` says)."""
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)

    values, indices = (mapped_first(x, d, size) for x, d in zip(args, dims))
    fold = Fold(values)
    results = merge_p.bind(fold(values), fold(indices), **params)
    results, dims_out = zip(*map(fold.unfold, results))
    return list(results), list(dims_out)


def _handler_lowering(ctx, values, indices, *, k: int, sorted: bool):
    return jax.ffi.ffi_lowering(TARGET)(
        ctx, values, indices, k=np.int32(k), sorted=np.bool_(sorted)
    )


_fallback_lowering = mlir.lower_fun(
    lambda values, indices, *, k, sorted: _fallback.merge(values, indices, k=k, sorted=sorted),
    multiple_results=True,
)


# Row sharding: on several devices each merges its own rows (m whole on each device).
def _bind_local(k: int, sorted: bool, values, indices):
    return tuple(merge_p.bind(values, indices, k=k, sorted=sorted, local=True))


_partitioned_merge = custom_partitioning(_bind_local, static_argnums=(0, 1))


def _row_sharding(mesh, arg_shapes):
    values = arg_shapes[0]
    sharding = values.sharding
    entry = sharding.spec[0] if isinstance(sharding, NamedSharding) and sharding.spec else None
    axes = entry if isinstance(entry, tuple) or entry is None else (entry,)
    if axes is not None and values.shape[0] % math.prod(mesh.shape[a] for a in axes):
        axes = None  # rows not split evenly: every device merges every row
    return NamedSharding(mesh, PartitionSpec(axes, None))


def _partition(k, sorted, mesh, arg_shapes, result_shape):
    del result_shape
    sharding = _row_sharding(mesh, arg_shapes)
    return mesh, partial(_bind_local, k, sorted), (sharding, sharding), (sharding, sharding)


def _infer(k, sorted, mesh, arg_shapes, result_shape):
    del k, sorted, result_shape
    return (_row_sharding(mesh, arg_shapes),) * 2


_partitioned_merge.def_partition(
    partition=_partition,
    infer_sharding_from_operands=_infer,
    sharding_rule=lambda *_: ("r m, r m -> r k, r k", {"need_replication_factors": ("m",)}),
)


def _platform_lowering(platform: str):
    """`local`: the call is already one device's (inside a partitioned function)."""

    def lowering(ctx, values, indices, *, k: int, sorted: bool, local: bool):
        if not local and _compat.lowering_num_devices(ctx) > 1:
            return mlir.lower_fun(partial(_partitioned_merge, k, sorted), multiple_results=True)(
                ctx, values, indices
            )
        if platform is None or uses_fallback(platform, "merge_topk"):
            return _fallback_lowering(ctx, values, indices, k=k, sorted=sorted)
        return _handler_lowering(ctx, values, indices, k=k, sorted=sorted)

    return lowering


_compat.define_eager_impl(merge_p)
merge_p.def_abstract_eval(_shape_rule)
batching.primitive_batchers[merge_p] = _batch
mlir.register_lowering(merge_p, _platform_lowering(None))  # every platform without a handler
mlir.register_lowering(merge_p, _platform_lowering("cpu"), platform="cpu")
mlir.register_lowering(merge_p, _platform_lowering("cuda"), platform="cuda")
_compat.require_devices_during_lowering(merge_p)


def merge_2d(values, indices, *, k: int, sorted: bool, local: bool = False):
    """(values, indices) [rows, k] of 2-D candidate lists, by the kernel where it serves.
    `local`: called inside a partitioned function, on one device's rows."""
    m = values.shape[1]
    if values.dtype in FAST_DTYPES and k <= MAX_K and m <= MAX_MERGE_WIDTH:
        return tuple(merge_p.bind(values, indices, k=k, sorted=sorted, local=local))
    return _fallback.merge(values, indices, k=k, sorted=sorted)


@partial(jax.custom_jvp, nondiff_argnums=(2, 3, 4))
def _merged(values, indices, k, sorted, differentiable):
    return merge_2d(values, indices, k=k, sorted=sorted)


@_merged.defjvp
def _merged_jvp(k, sorted, differentiable, primals, tangents):
    """top_k's rule: a winner's tangent is its candidate's (the winners' places among the
    candidates found from the merge's own result, `_fallback.winner_places`); 0 in empty
    slots; none for indices.
    `differentiable`: the caller's values are floats (integers and bool widened to floats
    for the kernel have no tangent, and their places are not searched for)."""
    values, indices = primals
    merged_values, merged_indices = _merged(values, indices, k, sorted, differentiable)
    no_tangent = np.zeros(merged_indices.shape, jax.dtypes.float0)
    values_dot = tangents[0]
    if not jnp.issubdtype(values.dtype, jnp.floating):  # integers: a float0 tangent
        return (merged_values, merged_indices), (no_tangent, no_tangent)
    if not differentiable:  # widened integers or bool: zero, as their float0 tangent says
        return (merged_values, merged_indices), (jnp.zeros_like(merged_values), no_tangent)
    # Under Explicit sharding the candidates' axis is gathered first, as top_k's rule does.
    values, indices = _fallback.columns_gathered(values), _fallback.columns_gathered(indices)
    won_values = _fallback.columns_gathered(merged_values)
    won_indices = _fallback.columns_gathered(merged_indices)
    places = _fallback.winner_places(values, indices, won_values, won_indices, sorted=sorted)
    picked = jnp.take_along_axis(
        _fallback.columns_gathered(values_dot), jnp.maximum(places, 0), axis=1
    )
    values_dot = jnp.where(places >= 0, picked, jnp.zeros_like(picked))
    return (merged_values, merged_indices), (values_dot, no_tangent)


def merge_topk(values, indices, k, *, sorted=True):
    """The exact top-k of the union of candidate lists: (values [..., k], indices [..., k]).

    `values` [..., m] (float32, bfloat16, float16 on the fast path, the 8-bit floats, bool
    and 8/16-bit integers widened for it; float64 and wider integers through a slower one) and
    `indices` int32 [..., m] are the candidates of each row, e.g. the concatenated results
    of top_k over chunks of the row, columns already global. An entry whose index is
    negative (-1: an empty slot) or whose value is NaN is not a candidate. The winners rank
    as in top_k: value in IEEE total order descending, equal values by ascending column.
    Columns are assumed distinct (a repeated column may be selected twice). `1 <= k <= m`;
    slots past the candidates hold index -1 and value -inf (an integer dtype's minimum; a
    dtype without -inf, its lowest value). `sorted=True`: rank order; `sorted=False`:
    ascending columns. Equals `top_k` over the union. `jax.grad`/`jax.jvp` through the
    values follow top_k's rule: a winner's tangent is its candidate's (of candidates equal
    in value and column, the earlier one's first); indices have none.
    """
    values = jnp.asarray(values)
    indices = jnp.asarray(indices)
    leading, m = _checks.check_merge_operands(values, indices)
    k = _checks.check_top_k_k(k, m, op="merge_topk", width="m")
    sorted = _checks.check_sorted("merge_topk", sorted)
    rows = int(np.prod(leading, dtype=np.int64))
    dtype = values.dtype
    if _widening.is_narrow(dtype):  # 8-bit floats, bool, 8/16-bit integers: on the kernel
        values = _widening.widened(values)
    differentiable = bool(jnp.issubdtype(dtype, jnp.floating))
    merged_values, merged_indices = _merged(
        values.reshape(rows, m), indices.reshape(rows, m), k, sorted, differentiable
    )
    if _widening.is_narrow(dtype):
        merged_values = _widening.narrowed(merged_values, merged_indices, dtype)
    return merged_values.reshape(*leading, k), merged_indices.reshape(*leading, k)
