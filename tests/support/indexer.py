"""The lightning indexer under test (docs/contract.md section 9): input families, the
float64 reference of the logits and the accuracy bound, and running either operator under
jit on a backend with its arrays placed there."""

from __future__ import annotations

import jax
import ml_dtypes
import numpy as np

import jax_topk

from .operators import device_for

FP8 = np.dtype(ml_dtypes.float8_e4m3fn)
BF16 = np.dtype(ml_dtypes.bfloat16)
TOLERANCE = {BF16: 2e-5, FP8: 2e-4}  # the SPEC's tol per input type
TRACED = ("lengths", "key_scales", "page_table", "table_rows", "num_valid_rows")


def make_inputs(rng, queries, heads, head_dim, keys_count, *, family="normal", dtype=BF16):
    """(q, keys, weights) of one family:
    - normal: random values;
    - repeated_keys: the keys drawn from 3 distinct rows (many equal logits);
    - zero_heads: repeated keys, and every other query row with all heads zero (relu and
      the logits tie at 0, so the lowest columns win there);
    - all_negative: every dot negative before relu (every logit 0);
    - integers: small integers (exact sums, ties between different keys);
    - periodic: every 64th key far above the rest, the order that fools a regular sample of
      the keys;
    - random_bits: normal values with about 2 % of q's and the keys' entries random bit
      patterns (NaN, +-inf, +-0, subnormals, huge values: NaN and infinite logits), and 5 %
      of the weights 0, -0, +-inf or NaN."""
    q = rng.standard_normal((queries, heads, head_dim)).astype(np.float32)
    keys = rng.standard_normal((keys_count, head_dim)).astype(np.float32)
    weights = rng.standard_normal((queries, heads)).astype(np.float32)
    if family in ("repeated_keys", "zero_heads"):
        keys = rng.standard_normal((3, head_dim)).astype(np.float32)[
            rng.integers(0, 3, size=keys_count)
        ]
    if family == "zero_heads":
        q[::2] = 0.0
        q[1::2, ::2] = 0.0  # and some heads of the other rows
    elif family == "all_negative":
        q, keys = -np.abs(q), np.abs(keys)
        weights = np.abs(weights) + 0.1
    elif family == "integers":
        q = rng.integers(-2, 3, size=q.shape).astype(np.float32)
        keys = rng.integers(-2, 3, size=keys.shape).astype(np.float32)
        weights = rng.integers(1, 4, size=weights.shape).astype(np.float32)
    elif family == "periodic":
        q, weights = np.abs(q), np.abs(weights)
        keys = 0.01 * keys
        keys[5::64] = np.abs(keys[5::64]) * 1000.0
    elif family == "random_bits":
        q, keys = q.astype(dtype), keys.astype(dtype)
        bits = np.dtype(f"u{q.dtype.itemsize}")
        specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-39, -3e-40], np.float32)
        for array in (q, keys):  # about 2 % random bit patterns, 0.5 % special values
            picked = rng.random(array.shape) < 0.02
            array.view(bits)[picked] = rng.integers(0, 1 << (8 * bits.itemsize), int(picked.sum()))
            picked = rng.random(array.shape) < 0.005
            array[picked] = rng.choice(specials, size=int(picked.sum())).astype(dtype)
        picked = rng.random(weights.shape) < 0.05
        weights[picked] = rng.choice(specials, size=int(picked.sum()))
        return q, keys, weights
    elif family != "normal" and family != "repeated_keys":
        raise ValueError(family)
    return q.astype(dtype), keys.astype(dtype), weights


def reference_logits(q, keys, weights, lengths=None, key_scales=None):
    """Float64 logits [M, N] and the SPEC's per-entry bound's scale
    sum_h |w| * |scale| * sum_d |q * k| (-inf and 0 past the lengths)."""
    q64, k64 = np.asarray(q).astype(np.float64), np.asarray(keys).astype(np.float64)
    w64 = np.asarray(weights, np.float64)
    scales = np.ones(k64.shape[0]) if key_scales is None else np.asarray(key_scales, np.float64)
    dots = np.einsum("mhd,nd->mhn", q64, k64) * scales
    magnitude = np.einsum("mhd,nd->mhn", np.abs(q64), np.abs(k64)) * np.abs(scales)
    logits = np.einsum("mh,mhn->mn", w64, np.maximum(dots, 0.0))
    scale = np.einsum("mh,mhn->mn", np.abs(w64), magnitude)
    n = k64.shape[0]
    if lengths is not None:
        past = np.arange(n)[None, :] >= np.clip(np.asarray(lengths), 0, n)[:, None]
        logits[past], scale[past] = -np.inf, 0.0
    return logits, scale


def _flushed(x):
    """x with float32 subnormals replaced by zeros of their sign: XLA runs CPU code with
    denormals flushed (FTZ and DAZ), so every input and result of the handler's arithmetic
    is flushed."""
    tiny = np.abs(x) < np.finfo(np.float32).tiny
    return np.where(tiny, np.copysign(np.float32(0), x), x).astype(np.float32)


# cuda/common/indexer_inputs.h's sum blocks.
DOT_BLOCK = 128
HEAD_BLOCK = 64


def ordered_logits(q, keys, weights, lengths=None, key_scales=None):
    """The CPU handler's logits in float32, in its stated order (docs/contract.md section 9):
    per head in order, the dot over d in order from 0, times the key scale, relu, then
    logits += weight * relu from 0 (sums of more than DOT_BLOCK d terms or HEAD_BLOCK heads
    in blocks, each block's sum from 0, the blocks' sums added in order); -inf past the
    lengths; denormals flushed as XLA's CPU does. Vectorised over (t, s) only, so every sum
    is the handler's: equal to it bit for bit, but for a NaN's payload and sign (which the
    compiler's operand order decides)."""
    q32 = _flushed(np.asarray(q).astype(np.float32))
    k32 = _flushed(np.asarray(keys).astype(np.float32))
    w32 = _flushed(np.asarray(weights, np.float32))
    queries, heads, head_dim = q32.shape
    n = k32.shape[0]
    logits = np.zeros((queries, n), np.float32)
    with np.errstate(all="ignore"):
        for first_head in range(0, heads, HEAD_BLOCK):  # blocks of the sums: see the docstring
            block_logits = np.zeros((queries, n), np.float32)
            for h in range(first_head, min(first_head + HEAD_BLOCK, heads)):
                dots = np.zeros((queries, n), np.float32)
                for first in range(0, head_dim, DOT_BLOCK):
                    partial = np.zeros((queries, n), np.float32)
                    for d in range(first, min(first + DOT_BLOCK, head_dim)):
                        partial = _flushed(partial + _flushed(q32[:, h, d, None] * k32[None, :, d]))
                    dots = partial if first == 0 else _flushed(dots + partial)
                if key_scales is not None:
                    dots = _flushed(dots * _flushed(np.asarray(key_scales, np.float32))[None, :])
                relu = np.where(dots < 0, np.float32(0), dots)  # std::max(dots, 0): NaN stays
                block_logits = _flushed(block_logits + _flushed(w32[:, h, None] * relu))
            logits = block_logits if first_head == 0 else _flushed(logits + block_logits)
    if lengths is not None:
        past = np.arange(n)[None, :] >= np.clip(np.asarray(lengths), 0, n)[:, None]
        logits[past] = -np.inf
    return logits


def run(fn, backend, q, keys, weights, **kwargs):
    """Runs fn(q, keys, weights, **kwargs) under jit on one backend; arrays of TRACED names
    are traced operands, the rest static."""
    device = device_for(backend)
    traced = {name: np.asarray(v) for name, v in kwargs.items() if name in TRACED and v is not None}
    static = {name: v for name, v in kwargs.items() if name not in traced}
    call = jax.jit(lambda a, b, c, t: fn(a, b, c, **t, **static))
    args = jax.device_put((q, keys, weights, traced), device)
    return np.asarray(call(*args))


def logits_then_topk(q, keys, weights, lengths, *, key_scales=None, k=2048, **selection):
    """What indexer_topk must equal bit for bit: topk_filtered of indexer_logits."""
    logits = jax_topk.indexer_logits(q, keys, weights, lengths, key_scales=key_scales)
    return jax_topk.topk_filtered(logits, lengths, k=k, **selection)
