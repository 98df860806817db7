"""Every JAX interface jax_topk uses that JAX does not document, in one place.

Checked with jax 0.10.2 and jax 0.12.0.1 (the CPU tests, each against an extension built
with its own jaxlib); the GPU machine runs jax 0.11.2. A jax that moves one of these breaks
only this file. The documented interfaces (`jax.extend.core`,
`jax.interpreters.{ad,batching,mlir}`, `jax.ffi`, `custom_partitioning`) are used directly.
"""

from __future__ import annotations

from functools import partial

from jax._src import dispatch
from jax.sharding import PartitionSpec


def define_eager_impl(primitive) -> None:
    """Outside jit a primitive runs by compiling itself alone, as JAX's own primitives do."""
    primitive.def_impl(partial(dispatch.apply_primitive, primitive))


def require_devices_during_lowering(primitive) -> None:
    """The partitioner needs the device assignment while the primitive lowers, as
    custom_partitioning does."""
    dispatch.prim_requires_devices_during_lowering.add(primitive)


def lowering_num_devices(ctx) -> int:
    """How many devices the module being lowered runs on. The axis context has this count
    under jit (`ShardingContext.num_devices`); other contexts (shard_map's manual axes) have
    none, and count as one device: each call there is already local."""
    return getattr(ctx.module_context.axis_context, "num_devices", 1)


def with_extra_results(ctx, avals):
    """The lowering context with more results than the primitive declares (the workspace)."""
    return ctx.replace(avals_out=[*ctx.avals_out, *avals])


def rows_like(aval, shape, dtype):
    """An abstract value of `shape` and `dtype` whose leading (row) axis is laid out as
    `aval`'s and whose other axes are whole: under Explicit sharding the type carries the
    rows' mesh axes (later ops, and vmap's own axis, need them), and inside shard_map the
    manual axes the value varies over are kept."""
    sharding = aval.sharding
    spec = sharding.spec
    rows_axes = spec[0] if len(spec) else None
    laid_out = sharding.update(spec=PartitionSpec(rows_axes, *[None] * (len(shape) - 1)))
    return aval.update(shape=shape, dtype=dtype, weak_type=False, sharding=laid_out)
