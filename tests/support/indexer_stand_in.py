"""TEMPORARY: `jax_topk.indexer_logits` and `jax_topk.indexer_topk` (SPEC section 9) until
the indexer-api branch merges; then this module goes and its importers (the bench,
examples/indexer_training.py, tests/test_indexer_training.py) import from jax_topk.

Where jax_topk already has the functions they are used; otherwise a plain-JAX stand-in of
the same contract: float32 logits, relu, weighted sum over the heads, -inf past the
lengths, then topk_filtered.
"""

from __future__ import annotations

import jax.numpy as jnp

import jax_topk


def _stand_in_logits(q, keys, weights, lengths=None, *, key_scales=None):
    products = jnp.einsum(
        "mhd,nd->mhn",
        q.astype(jnp.float32),
        keys.astype(jnp.float32),
        preferred_element_type=jnp.float32,
    )
    if key_scales is not None:
        products = products * key_scales.astype(jnp.float32)
    logits = jnp.einsum("mhn,mh->mn", jnp.maximum(products, 0.0), weights)
    if lengths is None:
        return logits
    columns = jnp.arange(keys.shape[0])
    return jnp.where(columns < jnp.asarray(lengths)[:, None], logits, -jnp.inf)


def _stand_in_topk(q, keys, weights, lengths, *, k=2048, key_scales=None, **selection):
    logits = _stand_in_logits(q, keys, weights, lengths, key_scales=key_scales)
    return jax_topk.topk_filtered(logits, lengths, k=k, **selection)


indexer_logits = getattr(jax_topk, "indexer_logits", _stand_in_logits)
indexer_topk = getattr(jax_topk, "indexer_topk", _stand_in_topk)
STAND_IN = indexer_topk is _stand_in_topk
