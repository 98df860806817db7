"""The lightning indexer's part of the bench (SPEC section 9): its inputs, the calls timed
(ours and what a JAX user writes today), the floors and the correctness check.

The JAX path is `einsum('mhd,nd->mhn')` to float32 products, the keys' scales, relu, the
weighted sum over the heads and -inf past the lengths, then `jax.lax.top_k` or our
`topk_filtered`; it runs over chunks of rows (`lax.map`) where the [M, H, N] products would
pass 8 GB. Floors: the compute floor (2 H D FLOPs a visible (query, key) pair at the matrix
rate measured in the same run) and the memory floor (inputs read once, the output written
once, at the measured copy bandwidth). bench.py times the calls; this module knows what they
compute.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jax_topk import indexer_logits, indexer_topk, topk_filtered
from tests.support import indexer as support
from tests.support.families import edge_lengths

OPS = {"indexer_logits": indexer_logits, "indexer_topk": indexer_topk}
FP8 = "float8_e4m3fn"
FP8_MAX = 448.0
MAX_PRODUCTS_BYTES = 8 << 30  # the JAX path's [M, H, N] float32 products, per chunk


# --- inputs -------------------------------------------------------------------------------


def input_bytes(shape) -> int:
    """Bytes of one input set: q, keys, weights, lengths and (fp8) the keys' scales."""
    itemsize = jnp.dtype(shape.dtype).itemsize
    scales = 4 * shape.n if shape.dtype == FP8 else 0
    q_bytes = shape.rows * shape.heads * shape.head_dim * itemsize
    keys_bytes = shape.n * shape.head_dim * itemsize
    return q_bytes + keys_bytes + shape.rows * (4 * shape.heads + 4) + scales


def quantize(values, dtype: str):
    """(values in `dtype`, float32 scales a row or None): fp8 rows scaled to its range, as
    DeepSeek-V3.2 stores its index keys (one scale a key)."""
    if dtype != FP8:
        return values.astype(dtype), None
    scales = jnp.max(jnp.abs(values), axis=-1) / FP8_MAX
    return (values / scales[..., None]).astype(dtype), scales


def make_inputs(shape, sets: int, seed: int) -> list[tuple]:
    """`sets` input tuples (q, keys, weights, lengths, key_scales) of random normal q and keys;
    weights normal over sqrt(H D), the softmax scale and the head count folded in as in
    DeepSeek-V3.2. fp8 q is cast directly (its scale would fold into the weights)."""
    lengths = jnp.asarray(shape.row_lengths())
    base = jax.random.key(seed)
    out = []
    for i in range(sets):
        q_key, keys_key, weights_key = jax.random.split(jax.random.fold_in(base, i), 3)
        q = jax.random.normal(q_key, (shape.rows, shape.heads, shape.head_dim))
        keys, key_scales = quantize(
            jax.random.normal(keys_key, (shape.n, shape.head_dim)), shape.dtype
        )
        weights = jax.random.normal(weights_key, (shape.rows, shape.heads)) / np.sqrt(
            shape.heads * shape.head_dim
        )
        out.append((q.astype(shape.dtype), keys, weights, lengths, key_scales))
    return out


# --- the calls: (q, keys, weights, lengths, key_scales) -> the result ----------------------


def rows_per_chunk(rows: int, heads: int, n: int) -> int:
    """The most rows, dividing `rows`, whose [rows, H, N] float32 products fit the limit."""
    fitting = max(1, MAX_PRODUCTS_BYTES // (heads * n * 4))
    return max(c for c in range(1, min(rows, fitting) + 1) if rows % c == 0)


@functools.cache
def _fp8_einsum_compiles() -> bool:
    """XLA's dot on float8 operands (cuBLASLt on Hopper); else the JAX path upcasts."""
    q = jax.ShapeDtypeStruct((1, 1, 16), jnp.float8_e4m3fn)
    keys = jax.ShapeDtypeStruct((16, 16), jnp.float8_e4m3fn)
    try:
        jax.jit(lambda q, k: _products(q, k)).lower(q, keys).compile()
    except Exception:  # XLA's refusal has no one type
        return False
    return True


def _products(q, keys):
    return jnp.einsum("mhd,nd->mhn", q, keys, preferred_element_type=jnp.float32)


def jax_path_scores(q, keys, weights, lengths, key_scales):
    """What a JAX user writes today: float32 [M, N] logits through the [M, H, N] products."""
    if q.dtype == jnp.float8_e4m3fn and not _fp8_einsum_compiles():
        q, keys = q.astype(jnp.bfloat16), keys.astype(jnp.bfloat16)
    rows, heads, _ = q.shape
    n = keys.shape[0]

    def scores(q, weights):
        products = _products(q, keys)
        if key_scales is not None:
            products = products * key_scales
        return jnp.sum(jax.nn.relu(products) * weights[:, :, None], axis=1)

    chunk = rows_per_chunk(rows, heads, n)
    if chunk == rows:
        logits = scores(q, weights)
    else:
        chunks = (q.reshape(rows // chunk, chunk, *q.shape[1:]), weights.reshape(-1, chunk, heads))
        logits = jax.lax.map(lambda c: scores(*c), chunks).reshape(rows, n)
    return jnp.where(jnp.arange(n) < lengths[:, None], logits, -jnp.inf)


def calls(op: str, k: int) -> dict:
    """The timed calls of one operator, ours first: the peers a user would pick instead."""

    def ours_logits(q, keys, weights, lengths, key_scales):
        return indexer_logits(q, keys, weights, lengths, key_scales=key_scales)

    if op == "indexer_logits":
        return {"ours_us": ours_logits, "jax_path_us": jax_path_scores}

    def ours_topk(q, keys, weights, lengths, key_scales):
        return indexer_topk(q, keys, weights, lengths, k=k, key_scales=key_scales)

    def jax_path(q, keys, weights, lengths, key_scales):
        return jax.lax.top_k(jax_path_scores(q, keys, weights, lengths, key_scales), k)[1]

    def jax_path_filtered(q, keys, weights, lengths, key_scales):
        scores = jax_path_scores(q, keys, weights, lengths, key_scales)
        return topk_filtered(scores, lengths, k=k)

    def logits_then_filtered(q, keys, weights, lengths, key_scales):
        return topk_filtered(ours_logits(q, keys, weights, lengths, key_scales), lengths, k=k)

    return {
        "ours_us": ours_topk,
        "jax_path_us": jax_path,
        "jax_path_filtered_us": jax_path_filtered,
        "logits_then_filtered_us": logits_then_filtered,
    }


# --- floors ---------------------------------------------------------------------------------


def flops(shape) -> float:
    """2 H D a visible (query, key) pair: the causal chunk's queries see only their past."""
    visible = int(np.clip(shape.row_lengths(), 0, shape.n).sum())
    return 2.0 * shape.heads * shape.head_dim * visible


def bytes_moved(shape) -> int:
    """Inputs read once and the output written once (logits [M, N] or indices [M, k])."""
    out_columns = shape.n if shape.op == "indexer_logits" else shape.k
    return input_bytes(shape) + 4 * shape.rows * out_columns


# --- correctness ----------------------------------------------------------------------------


def f32_reference(q, keys, weights, lengths, key_scales):
    """(float32 logits at the highest precision, the SPEC's error scale
    sum_h |w| scale sum_d |q k|), both [M, N]; -inf past the lengths."""
    q, keys = q.astype(jnp.float32), keys.astype(jnp.float32)
    scales = jnp.ones(keys.shape[0]) if key_scales is None else key_scales
    exact = functools.partial(jnp.einsum, precision=jax.lax.Precision.HIGHEST)
    products = exact("mhd,nd->mhn", q, keys) * scales
    logits = exact("mhn,mh->mn", jax.nn.relu(products), weights)
    scale = exact("mhn,mh->mn", exact("mhd,nd->mhn", jnp.abs(q), jnp.abs(keys)), jnp.abs(weights))
    visible = jnp.arange(keys.shape[0]) < lengths[:, None]
    return jnp.where(visible, logits, -jnp.inf), scale * scales


def tolerance(dtype: str) -> float:
    """SPEC section 9's tol for q and keys of `dtype`."""
    return support.TOLERANCE[np.dtype(dtype)]


def within_bound(logits, reference, scale, tolerance: float) -> bool:
    """-inf exactly where the reference has it, within tolerance * scale elsewhere."""
    logits, reference, scale = (np.asarray(a, np.float64) for a in (logits, reference, scale))
    visible = np.isfinite(reference)
    if not np.array_equal(np.isfinite(logits), visible):
        return False
    error = np.abs(logits[visible] - reference[visible])
    return bool((error <= tolerance * scale[visible]).all())


def logits_within_bound(logits, inputs, dtype: str) -> bool:
    """Within twice the SPEC's bound of the float32 reference above (its own error is within
    the bound too); the float64 one of the tests is too slow at the timed shapes."""
    return within_bound(logits, *f32_reference(*inputs), 2 * tolerance(dtype))


def check_rows(inputs, rows: int = 8) -> tuple:
    """(the first and last `rows` query rows of a set, the inputs of those rows only): what
    the bound check of a timed shape reads (the reference's [M, H, N] products of every row
    may not fit)."""
    q, keys, weights, lengths, key_scales = inputs
    picked = np.unique(np.r_[: min(rows, len(q)), max(0, len(q) - rows) : len(q)])
    return picked, (q[picked], keys, weights[picked], lengths[picked], key_scales)


def same_indices(a, b) -> bool:
    return bool(np.array_equal(np.asarray(a), np.asarray(b)))


def overlap(ours, peer) -> float:
    """The share of our selected positions that the peer selected too (rows pooled)."""
    ours, peer = np.asarray(ours), np.asarray(peer)
    hits = sum(len(np.intersect1d(o[o >= 0], p[p >= 0])) for o, p in zip(ours, peer))
    return hits / max(1, int((ours >= 0).sum()))


FAMILIES = ("normal", "repeated_keys", "zero_heads", "all_negative", "integers", "periodic")


def check_cases(dtypes) -> list[tuple]:
    """(dtype, family, rows, n, k): rows of every boundary length (families.edge_lengths),
    n not a multiple of any tile, at the GPU grid's H = 64 and D = 128."""
    return [(dtype, f, 12, 3001, k) for dtype in dtypes for f in FAMILIES for k in (1, 512)]


def check(cases, progress) -> list[str]:
    """indexer_topk must equal topk_filtered(indexer_logits(...)) bit for bit (both orders),
    the logits within the SPEC's bound of the tests' float64 reference (tests/support/
    indexer.py's families and reference). Returns the failures."""
    failures = []
    for dtype, family, rows, n, k in progress(cases, desc="check indexer"):
        rng = np.random.default_rng(k * 7 + n)
        q, keys, weights = support.make_inputs(
            rng, rows, 64, 128, n, family=family, dtype=np.dtype(dtype)
        )
        key_scales = rng.uniform(0.01, 2.0, size=n).astype(np.float32) if dtype == FP8 else None
        lengths = edge_lengths(k, n, rows, rng)
        inputs = jax.device_put((q, keys, weights, lengths, key_scales))
        logits = jax.jit(calls("indexer_logits", k)["ours_us"])(*inputs)
        reference, scale = support.reference_logits(q, keys, weights, lengths, key_scales)
        good = within_bound(logits, reference, scale, tolerance(dtype))
        for sorted in (False, True):
            fused = jax.jit(
                lambda q, keys, w, lens, s: indexer_topk(
                    q, keys, w, lens, k=k, key_scales=s, sorted=sorted
                )
            )(*inputs)
            good &= same_indices(fused, topk_filtered(logits, inputs[3], k=k, sorted=sorted))
        if not good:
            failures.append(f"indexer {dtype} {family} {rows}x{n} k={k}")
    return failures
