"""How vmap folds its mapped calls into the rows of one call, sharding included.

A batching rule moves the mapped axis first and merges it with the rows: [calls, rows, ...]
-> [calls * rows, ...]. Outside Explicit sharding the types carry no mesh axes and the fold is
call-major (call b's rows together), as XLA then lays the rows out itself. Explicit sharding
puts the mesh axes in the array's type, and a call-major merge keeps each device's rows together
only when the rows are whole: with the calls split over mesh axes A (nA parts) and each call's
rows over B (nB parts), the fold instead orders the rows by device first, [nA, calls / nA, nB,
rows / nB] -> [nA, nB, calls / nA, rows / nB] -> one axis split over (A, B), so that every device
keeps exactly its own rows (a relabelling: nothing moves) and the results unfold the same way.
Rows of one call are then no longer consecutive, so per-call row groups (num_valid_rows) cannot
pass through; the caller turns them into lengths (`Fold.keeps_groups`).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec


def mapped_first(x, dim, size: int):
    """x with vmap's mapped axis `dim` first; an unmapped operand (dim None) broadcast to
    `size` calls."""
    return jnp.broadcast_to(x, (size, *x.shape)) if dim is None else jnp.moveaxis(x, dim, 0)


def leading_axes(x, count: int) -> tuple:
    """The mesh axes x's first `count` axes are split over in its type (None: whole)."""
    spec = tuple(jax.typeof(x).sharding.spec)
    return tuple(spec[i] if i < len(spec) else None for i in range(count))


def laid_out(x, leading: tuple, mesh):
    """x with its leading axes split over `leading`'s mesh axes of `mesh` and its other axes as
    they are: operands folded together must share the rows' layout (a no-op where x has it, and
    outside Explicit sharding). Only x's leading axes change, so split columns stay split."""
    own = leading_axes(x, x.ndim)
    spec = (*leading, *own[len(leading) :])
    if own == spec:
        return x
    own_mesh = jax.typeof(x).sharding.mesh
    mesh = mesh if own_mesh.empty else own_mesh  # an unsharded operand takes the rows' mesh
    return jax.sharding.reshard(x, NamedSharding(mesh, PartitionSpec(*spec)))


def _names(axes) -> tuple:
    """Mesh `axes` (None, a name or a tuple of names) as a tuple of names."""
    return () if axes is None else axes if isinstance(axes, tuple) else (axes,)


def mesh_parts(mesh, axes) -> int:
    """How many pieces mesh `axes` split an axis into."""
    return math.prod(mesh.shape[name] for name in _names(axes))


class Fold:
    """The fold of one batch: built from the leading operand ([calls, rows, ...]), applied
    to every operand with a row axis, undone on every result."""

    def __init__(self, leading_operand):
        self.calls, self.rows = leading_operand.shape[:2]
        self.axes = leading_axes(leading_operand, 2)  # (calls' mesh axes, rows' mesh axes)
        self.mesh = jax.typeof(leading_operand).sharding.mesh
        self.call_parts = mesh_parts(self.mesh, self.axes[0])
        self.row_parts = mesh_parts(self.mesh, self.axes[1])
        # Call-major: each call's rows consecutive, so per-call row groups survive the fold.
        self.keeps_groups = self.row_parts == 1

    def __call__(self, x):
        """[calls, rows, ...] -> [calls * rows, ...], in this batch's row order."""
        x = laid_out(x, self.axes, self.mesh)
        if self.keeps_groups:
            return x.reshape(self.calls * self.rows, *x.shape[2:])
        rest = leading_axes(x, x.ndim)[2:]  # by device first: [nA, nB, calls / nA, rows / nB]
        x = self._reshape(x, self._by_device(x.shape[2:]), (self.axes[0], None, self.axes[1]), rest)
        x = jnp.swapaxes(x, 1, 2)
        merged = (*_names(self.axes[0]), *_names(self.axes[1]))
        return self._reshape(x, (self.calls * self.rows, *x.shape[4:]), (merged,), rest)

    def unfold(self, result):
        """(result [calls * rows, ...] as [calls, rows, ...], its mapped axis: 0)."""
        if self.keeps_groups:
            return result.reshape(self.calls, self.rows, *result.shape[1:]), 0
        rest = leading_axes(result, result.ndim)[1:]
        by_device = self._by_device(result.shape[1:])
        by_device = (by_device[0], by_device[2], by_device[1], *by_device[3:])
        result = self._reshape(result, by_device, self.axes, rest)
        result = jnp.swapaxes(result, 1, 2)
        return self._reshape(result, (self.calls, self.rows, *result.shape[4:]), self.axes, rest), 0

    def _by_device(self, rest: tuple) -> tuple:
        """[nA, calls / nA, nB, rows / nB, *rest]."""
        return (
            self.call_parts,
            self.calls // self.call_parts,
            self.row_parts,
            self.rows // self.row_parts,
            *rest,
        )

    def _reshape(self, x, shape: tuple, leading: tuple, rest: tuple):
        """x reshaped, its leading axes split over `leading` and the last over `rest` (JAX
        needs the layout of a reshape that splits or merges split axes spelled out)."""
        spec = (*leading, *[None] * (len(shape) - len(leading) - len(rest)), *rest)
        return jnp.reshape(x, shape, out_sharding=NamedSharding(self.mesh, PartitionSpec(*spec)))
