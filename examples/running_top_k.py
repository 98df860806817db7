"""A running top-k over key chunks inside lax.scan, kept exact by merge_topk.

Chunked prefill (or a ring over devices) sees the keys of a long row a chunk at a time.
Each step selects the chunk's best k (top_k with global column numbers), and merge_topk
folds them into the running best k: after the last chunk it is, bit for bit, one top_k
call over the whole row (ties by the lower global column, lengths respected), and so is
its gradient through the values.
Runs on the CPU or the GPU:  python examples/running_top_k.py
"""

import jax
import jax.numpy as jnp
import numpy as np

import jax_topk

ROWS, CHUNKS, CHUNK, K = 6, 8, 512, 64


@jax.jit
def running_top_k(scores, lengths):
    """scores [ROWS, CHUNKS * CHUNK] -> (values, indices) [ROWS, K], one chunk a step."""
    chunks = scores.reshape(ROWS, CHUNKS, CHUNK).transpose(1, 0, 2)  # [CHUNKS, ROWS, CHUNK]

    def step(best, chunk_and_start):
        chunk, start = chunk_and_start
        # This chunk's share of each row, clamped before the subtraction: lengths - start
        # would wrap round for a length near the int32 minimum and take the chunk whole.
        chunk_lengths = jnp.clip(lengths, start, start + CHUNK) - start
        values, indices = jax_topk.top_k(chunk, K, lengths=chunk_lengths)
        columns = jnp.where(indices >= 0, indices + start, -1)  # global column numbers
        best_values, best_columns = best
        merged = jax_topk.merge_topk(
            jnp.concatenate([best_values, values], axis=1),
            jnp.concatenate([best_columns, columns], axis=1),
            K,
        )
        return merged, None

    empty = (jnp.full((ROWS, K), -jnp.inf, scores.dtype), jnp.full((ROWS, K), -1, jnp.int32))
    starts = jnp.arange(CHUNKS, dtype=jnp.int32) * CHUNK
    best, _ = jax.lax.scan(step, empty, (chunks, starts))
    return best


def main():
    rng = np.random.default_rng(0)
    # Few distinct values, so ties cross chunk boundaries.
    scores = jnp.asarray(rng.integers(-8, 8, size=(ROWS, CHUNKS * CHUNK)), jnp.bfloat16)
    # Lengths past both ends too: each row is clamped to [0, n], whatever its length says.
    lengths = jnp.asarray([CHUNKS * CHUNK, 1000, CHUNK, 37, -(2**31), 2**31 - 1], jnp.int32)
    values, indices = running_top_k(scores, lengths)
    want_values, want_indices = jax_topk.top_k(scores, K, lengths=lengths)
    np.testing.assert_array_equal(np.asarray(indices), np.asarray(want_indices))
    np.testing.assert_array_equal(
        np.asarray(values).view(np.uint16), np.asarray(want_values).view(np.uint16)
    )
    print(f"running top-{K} over {CHUNKS} chunks of {CHUNK} == one top_k over the row")
    print("row 3 (length 37):", np.asarray(indices)[3, :8], "...")

    # Gradients flow through the values, across the scan and every merge, as through one
    # top_k (distinct float32 scores, so that no tie decides which copy a gradient reaches).
    x = jnp.asarray(rng.permutation(scores.size).reshape(scores.shape) / 64.0, jnp.float32)
    weights = jnp.asarray(rng.standard_normal((ROWS, K)), jnp.float32)

    def loss(select):
        return lambda s: (weights * select(s)).sum()

    ours = jax.grad(loss(lambda s: running_top_k(s, lengths)[0]))(x)
    theirs = jax.grad(loss(lambda s: jax_topk.top_k(s, K, lengths=lengths)[0]))(x)
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
    print("and its gradient equals one top_k's")


if __name__ == "__main__":
    main()
