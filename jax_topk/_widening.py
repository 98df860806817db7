"""Dtypes no kernel reads that widen exactly to one that does, so that they run on the
kernels instead of the exact sort path: the 8-bit floats, bool and the 8-bit integers to
bfloat16, the 16-bit integers to float32.

Exact: every 8-bit float has at most 4 mantissa bits and exponents within bfloat16's
(e8m0fnu's 2^-127 is a bfloat16 subnormal), bfloat16 holds every integer of magnitude up to
256 and float32 every one up to 2^24. So every value is kept, and with it the order, the
ties, -0 and NaN (an fnuz type's one NaN pattern widens to a NaN, never selected). The
selected values narrow back exactly. An empty slot takes the narrow dtype's own empty value:
-inf where the dtype has one, else its lowest value (bool: False; an integer: its minimum).
Wider integers (and float64) have no exact order-keeping float of the kernels' widths and
stay on the sort path."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from . import _fallback

_FLOAT8_NAMES = (
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "float8_e4m3b11fnuz",
    "float8_e3m4",
    "float8_e4m3",
    "float8_e8m0fnu",
)
# Each narrow dtype and the kernel dtype it widens to; the 8-bit floats this jax knows
# (older releases lack some).
WIDER = {
    **{
        np.dtype(getattr(jnp, name)): np.dtype(jnp.bfloat16)
        for name in _FLOAT8_NAMES
        if hasattr(jnp, name)
    },
    np.dtype(np.bool_): np.dtype(jnp.bfloat16),
    np.dtype(np.int8): np.dtype(jnp.bfloat16),
    np.dtype(np.uint8): np.dtype(jnp.bfloat16),
    np.dtype(np.int16): np.dtype(np.float32),
    np.dtype(np.uint16): np.dtype(np.float32),
}
NARROW_DTYPES = tuple(WIDER)


def is_narrow(dtype) -> bool:
    return np.dtype(dtype) in WIDER


def widened(x):
    """x in its kernel dtype, every value exactly (bool: 0 and 1)."""
    return x.astype(WIDER[np.dtype(x.dtype)])


def narrowed(values, indices, dtype):
    """Values selected from a widened array, back in `dtype` (exact: each came from it),
    the narrow empty value where no candidate was selected (index -1)."""
    # The empty slots' widened value (-inf) is not cast: a float8 without inf would make it
    # NaN, which jax_debug_nans reports although no NaN leaves the call.
    selected = jnp.where(indices >= 0, values, jnp.ones((), values.dtype)).astype(dtype)
    return jnp.where(indices >= 0, selected, _fallback.empty_value(dtype))
