"""examples/indexer_training.py: the sparse-stage indexer loss, computed on the selected
tokens only, has the gradients (into q, keys and weights) of a dense reference that computes
every logit and masks to the same selected set; the dense warm-up loss through
indexer_logits has those of dense float32 JAX."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest


def _load_example():
    path = Path(__file__).parents[1] / "examples" / "indexer_training.py"
    spec = importlib.util.spec_from_file_location("indexer_training", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example


example = _load_example()
ROWS, CONTEXT, K = 16, 128, 32


def dense_kl(main, logits, mask):
    """The loss from all [M, N] indexer logits and the main scores, masked to `mask`:
    softmaxes with the others at -1e30, KL summed where masked in, mean over rows with any."""
    main_scores = jnp.einsum("mhd,nd->mhn", main["q"], main["keys"]) / np.sqrt(example.MAIN_DIM)
    per_head = jax.nn.softmax(jnp.where(mask[:, None], main_scores, -1e30), axis=-1)
    target = jax.lax.stop_gradient(per_head.mean(axis=1) * mask)
    log_q = jax.nn.log_softmax(jnp.where(mask, logits, -1e30), axis=-1)
    kl = jnp.where(mask, target * (jnp.log(target) - log_q), 0.0).sum()
    return kl / jnp.maximum(jnp.any(mask, axis=-1).sum(), 1)


def dense_reference_loss(indexer, main, idx):
    """All [M, N] logits and main scores, then masked to the positions in `idx`."""
    rows, context = idx.shape[0], indexer["keys"].shape[0]
    selected = idx >= 0
    mask = jnp.zeros((rows, context), bool)
    mask = mask.at[jnp.arange(rows)[:, None], jnp.where(selected, idx, context)].set(
        True, mode="drop"
    )
    products = jnp.einsum("mhd,nd->mhn", indexer["q"], indexer["keys"])
    logits = jnp.einsum("mhn,mh->mn", jax.nn.relu(products), indexer["weights"])
    return dense_kl(main, logits, mask)


LENGTHS = {
    # queries spread from the start of the sequence: the rows shorter than K have -1 slots
    "causal_from_start": lambda: example.causal_lengths(ROWS, ROWS) * (CONTEXT // ROWS),
    "causal_chunk": lambda: example.causal_lengths(ROWS, CONTEXT),
    "edges": lambda: jnp.array(  # 0, 1, k - 1, k, k + 1, N and beyond N
        [0, 1, K - 1, K, K + 1, CONTEXT, CONTEXT + 7, 2, 5, 40, 64, 90, 100, 127, 0, 33],
        jnp.int32,
    ),
}


@pytest.mark.parametrize("lengths_kind", list(LENGTHS))
def test_sparse_loss_and_gradients_match_dense(lengths_kind):
    indexer, main = example.random_problem(seed=3, rows=ROWS, context=CONTEXT)
    lengths = LENGTHS[lengths_kind]()
    idx = example.select_tokens(indexer, lengths, K)
    expected_slots = np.minimum(np.clip(np.asarray(lengths), 0, CONTEXT), K)
    assert np.array_equal((np.asarray(idx) >= 0).sum(axis=1), expected_slots)

    sparse_loss, sparse_grads = jax.value_and_grad(example.sparse_indexer_loss)(indexer, main, idx)
    dense_loss, dense_grads = jax.value_and_grad(dense_reference_loss)(indexer, main, idx)
    np.testing.assert_allclose(sparse_loss, dense_loss, rtol=1e-5)
    for name in ("q", "keys", "weights"):
        sparse, dense = np.asarray(sparse_grads[name]), np.asarray(dense_grads[name])
        assert np.isfinite(sparse).all(), name
        assert np.abs(dense).max() > 0, name
        np.testing.assert_allclose(sparse, dense, rtol=1e-5, atol=1e-6 * np.abs(dense).max())


def dense_warmup_reference(indexer, main, lengths):
    """The warm-up loss from dense float32 JAX on the same bf16-rounded q and keys: every
    logit of a row below its length, -1e30 past it."""
    context = indexer["keys"].shape[0]
    q, keys = (indexer[name].astype(jnp.bfloat16).astype(jnp.float32) for name in ("q", "keys"))
    visible = jnp.arange(context)[None, :] < jnp.clip(lengths, 0, context)[:, None]
    products = jnp.einsum("mhd,nd->mhn", q, keys, precision="highest")
    weights = indexer["weights"]
    logits = jnp.einsum("mhn,mh->mn", jax.nn.relu(products), weights, precision="highest")
    return dense_kl(main, logits, visible)


@pytest.mark.parametrize("spans", ["one span", "8 spans of 16 keys"])
def test_dense_warmup_gradients_match_dense_jax(spans, monkeypatch):
    """The warm-up loss through indexer_logits (its gradient formed span by span when
    forced) has the loss and gradients of dense float32 JAX."""
    from jax_topk import _indexer_gradient

    if spans != "one span":
        monkeypatch.setattr(_indexer_gradient, "MIN_SPAN_KEYS", 1)
        monkeypatch.setattr(_indexer_gradient, "SPAN_ELEMENTS", ROWS * example.HEADS * 16)
        assert _indexer_gradient.span_count(1, ROWS, example.HEADS, CONTEXT) == 8
    indexer, main = example.random_problem(seed=6, rows=ROWS, context=CONTEXT)
    lengths = LENGTHS["edges"]()
    loss, grads = jax.jit(jax.value_and_grad(example.dense_warmup_loss))(indexer, main, lengths)
    want_loss, want = jax.value_and_grad(dense_warmup_reference)(indexer, main, lengths)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    for name in ("q", "keys", "weights"):
        got, dense = np.asarray(grads[name]), np.asarray(want[name])
        assert np.isfinite(got).all() and np.abs(dense).max() > 0, name
        # q and keys' cotangents are rounded to bfloat16 at their cast, after sums whose
        # order differs: one bfloat16 step (2^-8) apart at most.
        tolerance = 1e-2 if name in ("q", "keys") else 1e-5
        scale = np.abs(dense).max()
        np.testing.assert_allclose(got, dense, rtol=tolerance, atol=tolerance * scale, err_msg=name)


def test_gradients_under_jit_equal_eager():
    indexer, main = example.random_problem(seed=4, rows=ROWS, context=CONTEXT)
    lengths = LENGTHS["causal_from_start"]()
    grad = jax.grad(example.indexer_loss)
    eager = grad(indexer, main, lengths, K)
    jitted = jax.jit(grad, static_argnums=3)(indexer, main, lengths, K)
    for name in ("q", "keys", "weights"):
        np.testing.assert_allclose(jitted[name], eager[name], rtol=1e-6, atol=1e-7)


def test_rows_without_candidates_add_nothing():
    """A row of length 0 selects nothing (all -1): its loss and gradients are zero, not NaN."""
    indexer, main = example.random_problem(seed=5, rows=2, context=CONTEXT)
    lengths = jnp.array([0, CONTEXT], jnp.int32)
    loss, grads = jax.value_and_grad(example.indexer_loss)(indexer, main, lengths, K)
    alone = {"q": indexer["q"][1:], "keys": indexer["keys"], "weights": indexer["weights"][1:]}
    main_alone = {"q": main["q"][1:], "keys": main["keys"]}
    alone_loss = example.indexer_loss(alone, main_alone, lengths[1:], K)
    np.testing.assert_allclose(loss, alone_loss, rtol=1e-6)
    assert not np.asarray(grads["q"][0]).any() and not np.asarray(grads["weights"][0]).any()
    assert np.isfinite(np.asarray(grads["keys"])).all()


def test_example_loss_falls():
    losses = example.main(steps=12)
    assert losses[-1] < losses[0]
