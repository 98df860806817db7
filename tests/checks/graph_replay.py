"""Run by tests/test_gpu_stress.py (`python -m tests.checks.graph_replay`) with XLA command
buffers on: the same jitted function replayed
with changing num_valid_rows, lengths and inputs must match the CPU handler every time, bit
for bit (top_k's and merge_topk's values too)."""

import jax
import numpy as np

import jax_topk


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
    print("graph replay: ok")


if __name__ == "__main__":
    main()
