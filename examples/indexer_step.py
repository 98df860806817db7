"""One step of a lightning-indexer-style sparse attention, inside jax.jit.

The indexer scores every cached position for each query row, topk_bf16 keeps the best
k positions per row (physical slots, through the page table), and attention runs on
those slots only. Runs on the CPU or the GPU:  python examples/indexer_step.py
"""

import jax
import jax.numpy as jnp
import numpy as np

import jax_topk

ROWS, CONTEXT, HEAD_DIM, K, PAGE_SIZE = 8, 4096, 64, 256, 64


@jax.jit
def sparse_attention_step(queries, index_keys, cache_keys, cache_values, lengths, page_table):
    scores = jnp.einsum("rd,nd->rn", queries, index_keys).astype(jnp.bfloat16)
    slots = jax_topk.topk_bf16(
        scores, lengths, k=K, page_table=page_table, page_size=PAGE_SIZE
    )  # int32 [rows, K], -1 = none
    valid = slots >= 0
    keys = cache_keys[jnp.where(valid, slots, 0)]  # [rows, K, d]
    values = cache_values[jnp.where(valid, slots, 0)]
    logits = jnp.einsum("rd,rkd->rk", queries, keys) / np.sqrt(HEAD_DIM)
    weights = jax.nn.softmax(jnp.where(valid, logits, -jnp.inf), axis=-1)
    return jnp.einsum("rk,rkd->rd", weights, values)


def main():
    rng = np.random.default_rng(0)
    pages = CONTEXT // PAGE_SIZE
    queries = jnp.asarray(rng.standard_normal((ROWS, HEAD_DIM)), jnp.float32)
    index_keys = jnp.asarray(rng.standard_normal((CONTEXT, HEAD_DIM)), jnp.float32)
    cache_keys = jnp.asarray(rng.standard_normal((CONTEXT, HEAD_DIM)), jnp.float32)
    cache_values = jnp.asarray(rng.standard_normal((CONTEXT, HEAD_DIM)), jnp.float32)
    lengths = jnp.asarray(np.linspace(300, CONTEXT, ROWS).astype(np.int32))  # causal-ish
    page_table = jnp.asarray(np.stack([rng.permutation(pages) for _ in range(ROWS)]), jnp.int32)
    out = sparse_attention_step(queries, index_keys, cache_keys, cache_values, lengths, page_table)
    print("attention output", out.shape, "finite:", bool(jnp.isfinite(out).all()))


if __name__ == "__main__":
    main()
