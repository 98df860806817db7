"""Training a lightning indexer with DeepSeek-V3.2's two losses: the dense warm-up stage's,
over every visible key, and the sparse stage's, on the selected tokens only.

Dense warm-up: the indexer's logits are `indexer_logits` itself (the kernels' float32 logits;
its gradient forms the pure-JAX products a span of keys at a time, never all [M, H, N] of
them), and the loss is the KL below over every position t can see.

For query row t the indexer picks S_t, its top-k positions (`indexer_topk`: integers, no
gradient). The main attention, run on S_t, gives the target: each main head's softmax over
S_t, summed over the heads and renormalised (a stop-gradient target). The indexer's loss is
KL(target || softmax of its own logits over S_t). Only the k selected keys take part: they
are gathered at the indices (-1 slots, rows with fewer than k candidates, masked out) and
their logits recomputed in JAX, so the gradients reach q, keys and weights without the
[M, N] logits. Here q, keys and weights are the parameters themselves; in a model they come
from the indexer's projections and the gradients flow on into them.
Runs on the CPU or the GPU:  python examples/indexer_training.py
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import xlogy

from jax_topk import indexer_logits, indexer_topk

ROWS, CONTEXT, HEADS, HEAD_DIM, K = 64, 2048, 8, 32, 256  # the indexer: M, N, H, D, k
MAIN_HEADS, MAIN_DIM = 4, 32  # the main attention whose choice the indexer learns


def select_tokens(indexer, lengths, k):
    """int32 [M, k]: each row's top-k positions by the indexer's bf16 logits, -1 where a
    row has fewer than k candidates. No gradient flows through the selection."""
    q, keys, weights = jax.lax.stop_gradient((indexer["q"], indexer["keys"], indexer["weights"]))
    return indexer_topk(q.astype(jnp.bfloat16), keys.astype(jnp.bfloat16), weights, lengths, k=k)


def log_softmax_over(logits, mask):
    """log softmax over each row's True entries (its last axis); 0 elsewhere and in rows
    with none, so that neither the values nor the gradients carry a NaN."""
    top = jnp.max(jnp.where(mask, logits, -jnp.inf), axis=-1, keepdims=True)
    top = jax.lax.stop_gradient(jnp.where(jnp.isfinite(top), top, 0.0))
    shifted = jnp.where(mask, logits - top, -jnp.inf)
    total = jnp.sum(jnp.exp(shifted), axis=-1, keepdims=True)
    return jnp.where(mask, shifted - jnp.log(jnp.where(total > 0, total, 1.0)), 0.0)


def kl_over_selected(main_scores, indexer_logits, mask):
    """The loss from the main attention's scores [M, main heads, S] and the indexer's logits
    [M, S] on the same S positions a row, `mask` [M, S] marking the selected ones: the mean
    over rows that select any of KL(target || softmax(indexer_logits))."""
    per_head = jnp.exp(log_softmax_over(main_scores, mask[:, None, :]))
    target = jax.lax.stop_gradient(jnp.where(mask, per_head.mean(axis=1), 0.0))
    log_q = log_softmax_over(indexer_logits, mask)
    kl = jnp.sum(xlogy(target, target) - target * log_q, axis=-1)
    rows_selecting = jnp.maximum(jnp.sum(jnp.any(mask, axis=-1)), 1)
    return jnp.sum(kl) / rows_selecting


def sparse_indexer_loss(indexer, main, idx):
    """The loss on the selected tokens `idx` [M, k] only: keys gathered there, their logits
    recomputed in float32 (relu of each head's dot product, weighted sum over the heads)."""
    selected = idx >= 0
    at = jnp.where(selected, idx, 0)  # -1 slots read position 0 and are masked out
    keys = indexer["keys"][at]  # [M, k, D]
    products = jnp.einsum("mhd,mkd->mhk", indexer["q"], keys)
    logits = jnp.einsum("mhk,mh->mk", jax.nn.relu(products), indexer["weights"])
    main_keys = main["keys"][at]  # [M, k, main dim]
    main_scores = jnp.einsum("mhd,mkd->mhk", main["q"], main_keys) / np.sqrt(MAIN_DIM)
    return kl_over_selected(main_scores, logits, selected)


def indexer_loss(indexer, main, lengths, k=K):
    return sparse_indexer_loss(indexer, main, select_tokens(indexer, lengths, k))


def dense_warmup_loss(indexer, main, lengths):
    """The warm-up stage's loss: the same KL over every position below each row's length,
    the indexer's logits from `indexer_logits` on bf16 q and keys (-inf past the length)."""
    bf16 = jnp.bfloat16
    logits = indexer_logits(
        indexer["q"].astype(bf16), indexer["keys"].astype(bf16), indexer["weights"], lengths
    )
    context = indexer["keys"].shape[0]
    visible = jnp.arange(context)[None, :] < jnp.clip(lengths, 0, context)[:, None]
    main_scores = jnp.einsum("mhd,nd->mhn", main["q"], main["keys"]) / np.sqrt(MAIN_DIM)
    return kl_over_selected(main_scores, logits, visible)


def adam(learning_rate, b1=0.9, b2=0.999, eps=1e-8):
    """(init, update) of a plain Adam over a pytree of parameters."""

    def init(params):
        zeros = jax.tree.map(jnp.zeros_like, params)
        return (zeros, zeros, 0)

    def update(params, grads, state):
        m, v, step = state
        step += 1
        m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, m, grads)
        v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, v, grads)
        scale = learning_rate * jnp.sqrt(1 - b2**step) / (1 - b1**step)
        params = jax.tree.map(lambda p, m, v: p - scale * m / (jnp.sqrt(v) + eps), params, m, v)
        return params, (m, v, step)

    return init, update


def causal_lengths(rows, context):
    """Row t of a chunk of `rows` queries ending at position `context` sees N - M + t + 1."""
    return jnp.arange(context - rows + 1, context + 1, dtype=jnp.int32)


def random_problem(seed, rows=ROWS, context=CONTEXT):
    """(indexer parameters, the main attention's q and keys) at random."""
    q_key, keys_key, weights_key, main_q_key, main_keys_key = jax.random.split(
        jax.random.key(seed), 5
    )
    indexer = {
        "q": jax.random.normal(q_key, (rows, HEADS, HEAD_DIM)) / np.sqrt(HEAD_DIM),
        "keys": jax.random.normal(keys_key, (context, HEAD_DIM)),
        "weights": jax.random.normal(weights_key, (rows, HEADS)) / np.sqrt(HEADS),
    }
    main = {
        "q": 2 * jax.random.normal(main_q_key, (rows, MAIN_HEADS, MAIN_DIM)),
        "keys": jax.random.normal(main_keys_key, (context, MAIN_DIM)),
    }
    return indexer, main


def train(loss_fn, indexer, main_attention, lengths, steps, stage):
    """`steps` Adam steps on loss_fn(indexer, main, lengths); the indexer and the losses."""
    init, update = adam(learning_rate=3e-2)
    state = init(indexer)

    @jax.jit
    def train_step(indexer, state):
        loss, grads = jax.value_and_grad(loss_fn)(indexer, main_attention, lengths)
        indexer, state = update(indexer, grads, state)
        return indexer, state, loss

    losses = []
    for step in range(steps):
        indexer, state, loss = train_step(indexer, state)
        losses.append(float(loss))
        if step % 10 == 0 or step == steps - 1:
            print(f"{stage} step {step:3d}  indexer KL {losses[-1]:.4f}")
    assert losses[-1] < 0.8 * losses[0], f"the {stage} loss should fall"
    return indexer, losses


def main(steps=60, warmup_steps=20):
    """The dense warm-up, then the sparse stage from where it left off; the sparse losses."""
    indexer, main_attention = random_problem(seed=0)
    lengths = causal_lengths(ROWS, CONTEXT)
    indexer, _ = train(dense_warmup_loss, indexer, main_attention, lengths, warmup_steps, "dense")
    _, losses = train(indexer_loss, indexer, main_attention, lengths, steps, "sparse")
    return losses


if __name__ == "__main__":
    main()
