"""Run by tests/test_gpu_stress.py (`python -m tests.checks.graph_replay`) with XLA command
buffers on: the same jitted function replayed
with changing num_valid_rows, lengths and inputs must match the CPU handler every time, bit
for bit (top_k's and merge_topk's values too)."""

import jax
import numpy as np

import jax_topk
from tests.support.indexer import logits_then_topk, make_inputs


def main():
    gpu, cpu = jax.devices("gpu")[0], jax.devices("cpu")[0]
    rng = np.random.default_rng(50)
    fns = {
        "topk_filtered": lambda s, lens, v: jax_topk.topk_filtered(
            s, lens, k=512, num_valid_rows=v
        ),
        "topk_bf16": lambda s, lens, v: jax_topk.topk_bf16(
            s.astype(jax.numpy.bfloat16), lens, k=64, num_valid_rows=v
        ),
        # top_k's kernels (values too) and merge_topk's, lengths changing between replays.
        "top_k small rows": lambda s, lens, v: jax_topk.top_k(s[:, :256], 8, lengths=lens),
        "top_k register float16": lambda s, lens, v: jax_topk.top_k(
            s.astype(jax.numpy.float16), 300, lengths=lens
        ),
        "top_k filtered bfloat16": lambda s, lens, v: jax_topk.top_k(
            s.astype(jax.numpy.bfloat16), 2048, lengths=lens
        ),
        "merge_topk": lambda s, lens, v: jax_topk.merge_topk(
            *jax_topk.top_k(s, 600, lengths=lens), 100
        ),
    }
    for name, fn in fns.items():
        step = jax.jit(fn)
        for i, valid in enumerate((8, 2, 0, 8, 5, 100, -3, 8)):
            scores = rng.standard_normal((8, 50_000 if "filtered" in name else 9000), np.float32)
            lengths = rng.integers(0, scores.shape[1] + 1, size=8).astype(np.int32)
            args = (scores, lengths, np.int32(valid))
            got = step(*jax.device_put(args, gpu))
            want = step(*jax.device_put(args, cpu))
            for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
                a, b = np.asarray(a), np.asarray(b)
                np.testing.assert_array_equal(
                    a.view(f"u{a.itemsize}"), b.view(f"u{b.itemsize}"), err_msg=f"{name} {i}"
                )
    _indexer_replays(rng, gpu)
    print("graph replay: ok")


def _indexer_replays(rng, gpu):
    """indexer_topk replayed with changing inputs, lengths and num_valid_rows equals, every
    time, topk_filtered of indexer_logits replayed alike (both on the GPU: the backends'
    logits may round apart)."""
    fused = jax.jit(
        lambda q, keys, w, lens, v: jax_topk.indexer_topk(
            q, keys, w, lens, k=2048, num_valid_rows=v
        )
    )
    two_steps = jax.jit(
        lambda q, keys, w, lens, v: logits_then_topk(q, keys, w, lens, k=2048, num_valid_rows=v)
    )
    for i, valid in enumerate((8, 2, 0, 8, 5, 100, -3, 8)):
        q, keys, weights = make_inputs(rng, 8, 16, 64, 9000, family=("normal", "zero_heads")[i % 2])
        lengths = rng.integers(0, 9001, size=8).astype(np.int32)
        args = jax.device_put((q, keys, weights, lengths, np.int32(valid)), gpu)
        np.testing.assert_array_equal(
            np.asarray(fused(*args)), np.asarray(two_steps(*args)), err_msg=f"indexer {i}"
        )


if __name__ == "__main__":
    main()
