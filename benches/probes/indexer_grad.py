"""indexer_logits' gradient on the GPU: jax.grad of a dense loss (sum of squares of the
visible logits) into q, keys and weights, its tangent formed whole or in strided spans of
keys (jax_topk/_indexer_gradient.py), at H = 64, D = 128, bf16. Device time a call and the
compiled temporaries (XLA's memory analysis); the two gradients compared first.
Run from the repo root on a GPU: python -m benches.probes.indexer_grad"""

import jax
import jax.numpy as jnp
import numpy as np

import jax_topk
from benches.bench import device_time_us
from jax_topk import _indexer_gradient

HEADS, HEAD_DIM = 64, 128


def main():
    print("| M x N | spans | device time (ms) | temporaries (GiB) | max rel. difference |")
    print("| --- | --- | --- | --- | --- |")
    rng = np.random.default_rng(0)
    for queries, keys_count in ((128, 65536), (512, 32768)):
        q = jnp.asarray(rng.standard_normal((queries, HEADS, HEAD_DIM)) / 16, jnp.float32)
        keys = jnp.asarray(rng.standard_normal((keys_count, HEAD_DIM)), jnp.float32)
        weights = jnp.asarray(rng.standard_normal((queries, HEADS)) / 8, jnp.float32)
        lengths = jnp.arange(keys_count - queries + 1, keys_count + 1, dtype=jnp.int32)

        def loss(q, keys, weights):
            bf16 = jnp.bfloat16
            logits = jax_topk.indexer_logits(q.astype(bf16), keys.astype(bf16), weights, lengths)
            return jnp.sum(jnp.where(jnp.isfinite(logits), logits, 0.0) ** 2)

        results = []
        for span_elements in (1 << 40, _indexer_gradient.SPAN_ELEMENTS):
            saved = _indexer_gradient.SPAN_ELEMENTS
            _indexer_gradient.SPAN_ELEMENTS = span_elements
            try:
                spans = _indexer_gradient.span_count(1, queries, HEADS, keys_count)
                grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
                compiled = grad.lower(q, keys, weights).compile()
                temporaries = compiled.memory_analysis().temp_size_in_bytes / 2**30
                got = [np.asarray(g) for g in grad(q, keys, weights)]
                time = device_time_us(grad, [(q, keys, weights)], 5) / 1e3
            finally:
                _indexer_gradient.SPAN_ELEMENTS = saved
            results.append(got)
            difference = max(
                float(np.abs(a - b).max() / np.abs(b).max()) for a, b in zip(got, results[0])
            )
            print(
                f"| {queries} x {keys_count} | {spans} | {time:.2f} | {temporaries:.2f} | "
                f"{difference:.1e} |"
            )


if __name__ == "__main__":
    main()
