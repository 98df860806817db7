"""indexer_logits' derivative (docs/contract.md section 9): the tangent of the pure-JAX logits
(`_fallback.indexer_logits`), formed a span of keys at a time.

The pure-JAX logits form the [B, M, H, N] products before the relu and the head sum; their
tangent needs the relu's mask of the same size. One span of keys at a time (a `lax.map`
over spans, each span's logits under `jax.checkpoint`) keeps no more than a span's products
alive, forward or backward: `jax.grad` saves each span's inputs and forms its products again
when it runs back, instead of keeping them all.

- Span j holds keys j, j + S, j + 2S, ... (S spans, a power of two dividing N): an even split
  of N over devices (context parallelism) stays a split of each span's own keys, so no
  device gathers the keys and each forms its own keys' products. Under Explicit mesh axes
  S also leaves each span's keys divisible by the devices splitting them (a reshape could
  not keep the split otherwise); under Auto axes XLA lays the spans out.
- q enters the spans in float32 (exact), so its gradient is summed over the spans in float32
  and rounded to q's dtype once, as the unsplit dot's is.
- Spans are sized for the shape the rule sees (a vmap applied after grad multiplies a span's
  products by its batch), never below MIN_SPAN_KEYS keys; where no power of two divides N
  the products are formed whole, as before.
Only the tangent comes from here: the logits themselves come from the handlers.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from . import _fallback
from ._batch_layout import leading_axes, mesh_parts

# Products ([B, M, H, span] float32) a span should form: 64 MB of them, a few such arrays live.
SPAN_ELEMENTS = 1 << 24
# Fewer keys a span would make a long loop of small dots (N steps at worst).
MIN_SPAN_KEYS = 256


def span_count(batch: int, queries: int, heads: int, keys_count: int, devices: int = 1) -> int:
    """The spans the keys are split into: the fewest (a power of two) that keep a span's
    products within SPAN_ELEMENTS, each span a whole number of keys, a multiple of `devices`
    (those splitting N) and no fewer than MIN_SPAN_KEYS; 1: whole."""
    wanted = -(-batch * queries * heads * keys_count // SPAN_ELEMENTS)
    spans = 1
    while (
        spans < wanted
        and keys_count % (2 * spans * devices) == 0
        and keys_count // (2 * spans) >= MIN_SPAN_KEYS
    ):
        spans *= 2
    return spans


def _devices_splitting_keys(keys) -> int:
    """How many devices keys [B, N, D]'s N is split over in its type (Explicit axes; 1 under
    Auto axes or none)."""
    sharding = jax.typeof(keys).sharding
    if getattr(sharding, "mesh", None) is None or sharding.mesh.empty:
        return 1
    return mesh_parts(sharding.mesh, leading_axes(keys, 2)[1])


def logits_by_key_spans(q, keys, weights, key_scales, lengths, *, has_key_scales: bool):
    """`_fallback.indexer_logits` of the same arguments, formed a span of keys at a time
    (`span_count`); differentiable in q, keys, weights and key_scales."""
    batch, queries, heads, head_dim = q.shape
    keys_count = keys.shape[1]
    spans = span_count(batch, queries, heads, keys_count, _devices_splitting_keys(keys))
    if spans == 1:
        return _fallback.indexer_logits(
            q, keys, weights, key_scales, lengths, has_key_scales=has_key_scales
        )
    span = keys_count // spans
    q = q.astype(jnp.float32)  # exact: the spans' q gradients add in float32
    # [spans, B, span, D]: span j holds the keys i * spans + j.
    keys = keys.reshape(batch, span, spans, head_dim).transpose(2, 0, 1, 3)
    if has_key_scales:
        key_scales = key_scales.reshape(batch, span, spans).transpose(2, 0, 1)
    else:
        key_scales = jnp.zeros((spans, 0), jnp.float32)  # a placeholder to map over

    @jax.checkpoint
    def span_logits(span_keys, span_scales):
        return _fallback.indexer_logits(
            q, span_keys, weights, span_scales, None, has_key_scales=has_key_scales
        )

    logits = lax.map(lambda args: span_logits(*args), (keys, key_scales))  # [spans, B, M, span]
    logits = logits.transpose(1, 2, 3, 0).reshape(batch, queries, keys_count)
    return _fallback.masked_past_lengths(logits, lengths)
