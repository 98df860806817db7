"""How vmap folds its mapped calls into the rows of one call, sharding included.

A batching rule moves the mapped axis first and merges it with the rows: [calls, rows, ...]
-> [calls * rows, ...]. Call-major (call b's rows together) is the natural order. Explicit
sharding puts the mesh axes in the array's type, and a reshape can only merge axes whose
split survives the merge: calls split (or nothing split) folds call-major, but rows split
with the calls whole cannot, short of moving the scores between devices. Those fold
row-major (row r of call b becomes row r * calls + b) and come back with the mapped axis
second. Outside Explicit sharding the types carry no mesh axes and every fold is call-major.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec


def leading_axes(x, count: int) -> tuple:
    """The mesh axes x's first `count` axes are split over in its type (None: whole)."""
    spec = tuple(jax.typeof(x).sharding.spec)
    return tuple(spec[i] if i < len(spec) else None for i in range(count))


def laid_out(x, leading: tuple):
    """x with its leading axes split over `leading`'s mesh axes and the rest whole: operands
    folded together must share one layout (a no-op where x has it, and outside Explicit)."""
    spec = (*leading, *[None] * (x.ndim - len(leading)))
    if leading_axes(x, x.ndim) == spec:
        return x
    mesh = jax.typeof(x).sharding.mesh
    return jax.sharding.reshard(x, NamedSharding(mesh, PartitionSpec(*spec)))


class Fold:
    """The fold of one batch: built from the leading operand ([calls, rows, ...]), applied
    to every operand with a row axis, undone on every result."""

    def __init__(self, leading_operand):
        self.calls, self.rows = leading_operand.shape[:2]
        self.calls_axes, self.rows_axes = leading_axes(leading_operand, 2)
        self.rows_major = self.calls_axes is None and self.rows_axes is not None

    def __call__(self, x):
        """[calls, rows, ...] -> [calls * rows, ...], in this batch's row order."""
        x = laid_out(x, (self.calls_axes, self.rows_axes))
        if self.rows_major:
            x = jnp.swapaxes(x, 0, 1)
        return x.reshape(self.calls * self.rows, *x.shape[2:])

    def unfold(self, result):
        """(result [calls * rows, ...] as [calls, rows, ...] or [rows, calls, ...], its
        mapped axis)."""
        if self.rows_major:
            return result.reshape(self.rows, self.calls, *result.shape[1:]), 1
        return result.reshape(self.calls, self.rows, *result.shape[1:]), 0
