"""The dtypes `jax.lax.top_k` ranks that no path here reads natively: the 8-bit floats and
bool. Each widens exactly to bfloat16, where the 16-bit kernels run (two bytes an element):
every 8-bit float has at most 4 mantissa bits and exponents within bfloat16's (e8m0fnu's
2^-127 is a bfloat16 subnormal), so every value is kept, and so are the order, the ties, -0
and NaN (an fnuz type's one NaN pattern widens to a NaN, never selected). The selected
values narrow back exactly. An empty slot takes the narrow dtype's
own empty value: -inf where the dtype has one, else its lowest value (bool: False), as an
integer dtype's empty slot holds its minimum."""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np

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
# The ones this jax knows (older releases lack some), and bool.
NARROW_DTYPES = (
    *(np.dtype(getattr(jnp, name)) for name in _FLOAT8_NAMES if hasattr(jnp, name)),
    np.dtype(np.bool_),
)
WIDE_DTYPE = np.dtype(jnp.bfloat16)


def is_narrow(dtype) -> bool:
    return np.dtype(dtype) in NARROW_DTYPES


def empty_value(dtype) -> np.ndarray:
    """A narrow dtype's empty slot: -inf if it has one, else its lowest value."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return np.array(False)
    lowest = ml_dtypes.finfo(dtype).min
    has_infinity = np.isinf(np.array(-np.inf, np.float32).astype(dtype).astype(np.float32))
    return np.array(-np.inf if has_infinity else lowest, np.float32).astype(dtype)


def widened(x):
    """x as bfloat16: exact for every narrow dtype (bool: 0 and 1)."""
    return x.astype(WIDE_DTYPE)


def narrowed(values, indices, dtype):
    """Values selected from a widened array, back in `dtype` (exact: each came from it),
    the narrow empty value where no candidate was selected (index -1)."""
    return jnp.where(indices >= 0, values.astype(dtype), empty_value(dtype))
