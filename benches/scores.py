"""Random normal scores of any dtype, as the benchmarks draw them.

Drawn in float32 and rounded to the row's dtype, like a model's logits kept in 16 bits.
`jax.random.normal(key, shape, jnp.bfloat16)` instead draws from a bfloat16 uniform and takes
only 128 distinct values (a row of 152064 holds its largest value ~1,200 times), so every k-th
key sits in a crowd of ties: a tie benchmark, not a normal one (benches/NOTES.md "bf16 rows of
128 values")."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def normal(key, shape, dtype):
    """Standard normal values of `shape`, float32 draws rounded to `dtype`."""
    return jax.random.normal(key, shape, jnp.float32).astype(dtype)
