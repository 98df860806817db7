"""merge_topk's speed at issue 14's shape: 5536 rows of 8 x 2048 candidates (float32 or
bfloat16 values, int32 global columns, as eight shards' top_k results would arrive; the lists
in no order or in rank order, as the bench makes them), both output orders, against reading its
input once. Run on the GPU from the repo root: python -m benches.probes.merge_rows"""

import jax
import jax.numpy as jnp

import jax_topk
from benches import merge
from benches.bench import Shape, copy_bandwidth_tbps, device_time_us

ROWS, SHARDS, K = 5536, 8, 2048


def candidate_sets(count, dtype, lists):
    """The bench's inputs (benches/merge.py): lists in no order ("full") or in rank order
    ("sorted")."""
    shape = Shape("merge_topk", jnp.dtype(dtype).name, ROWS, SHARDS * K, K, lists)
    return merge.make_inputs(shape, count, seed=0)


def main():
    tbps = copy_bandwidth_tbps()
    print(f"copy bandwidth {tbps:.2f} TB/s")
    print("| dtype | lists | output | us | x read floor |")
    print("| --- | --- | --- | --- | --- |")
    for dtype in (jnp.float32, jnp.bfloat16):
        bytes_read = ROWS * SHARDS * K * (jnp.dtype(dtype).itemsize + 4)
        floor_us = bytes_read / (tbps * 1e12) * 1e6  # the benchmark's floor: bytes / copy rate
        for lists in ("full", "sorted"):
            sets = candidate_sets(4, dtype, lists)
            for sorted_ in (True, False):
                fn = jax.jit(lambda v, i, o=sorted_: jax_topk.merge_topk(v, i, K, sorted=o))
                t = device_time_us(fn, sets, 12)
                order = "rank order" if lists == "sorted" else "no order"
                output = "sorted" if sorted_ else "unsorted"
                name = jnp.dtype(dtype).name
                print(f"| {name} | {order} | {output} | {t:.1f} | {t / floor_us:.2f} |")


if __name__ == "__main__":
    main()
