"""The cluster kernel for few float32 rows (cuda/kernels/topk_f32_cluster.cu) against what served
those shapes before it (the filtered kernel, or topk_f32_rows), and jax.lax.top_k: device time
(JAX's profiler, benches/bench.py's method) of topk_filtered and top_k at 1 to 16 rows of 8192
to 262144 columns. The kernel is picked at launch by JAX_TOPK_F32_CLUSTER (off, always; unset:
the measured rule) and JAX_TOPK_F32_CLUSTER_PARTS (8, 16), one process a variant:
    JAX_TOPK_F32_CLUSTER=off python -m benches.probes.f32_cluster --label before --lax
    JAX_TOPK_F32_CLUSTER=always python -m benches.probes.f32_cluster --label cluster
Prints one JSON line of {shape label: us} a run; f32_cluster.sh runs the variants and tabulates."""

import argparse
import json

import jax
import jax.numpy as jnp

from benches.bench import L2_BYTES, device_time_us
from benches.probes.f32_rows import call, label

SHAPES = [  # (op, rows, n, k, sorted): the issues' shapes first
    ("topk_filtered", 1, 32768, 2048, False),
    ("topk_filtered", 4, 32768, 2048, False),
    ("topk_filtered", 1, 131072, 2048, False),
    ("topk_filtered", 8, 131072, 2048, False),
    ("top_k", 1, 152064, 50, True),
    ("top_k", 8, 152064, 50, True),
    ("topk_filtered", 1, 8192, 512, False),
    ("topk_filtered", 1, 16384, 2048, False),
    ("topk_filtered", 16, 32768, 2048, False),
    ("topk_filtered", 1, 262144, 2048, False),
    ("topk_filtered", 1, 32768, 2048, True),
    ("top_k", 1, 32768, 256, True),
]
LAX_SHAPES = SHAPES[:6]


def input_sets(rows, n):
    count = max(2, min(64, 3 * L2_BYTES // (rows * n * 4) + 2))
    return [
        (
            jax.random.normal(jax.random.key(i), (rows, n), jnp.float32),
            jnp.full((rows,), n, jnp.int32),
        )
        for i in range(count)
    ]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--label", required=True)
    parser.add_argument("--lax", action="store_true", help="also jax.lax.top_k (as 'lax ...')")
    args = parser.parse_args()
    times = {}
    for op, rows, n, k, sorted_ in SHAPES:
        sets = input_sets(rows, n)
        times[label(op, rows, n, k, sorted_)] = device_time_us(call(op, k, sorted_), sets, calls=40)
        if args.lax and (op, rows, n, k, sorted_) in LAX_SHAPES:
            lax = jax.jit(lambda x, lens, k=k: jax.lax.top_k(x, k))
            times["lax " + label(op, rows, n, k, sorted_)] = device_time_us(lax, sets, calls=20)
    print(json.dumps({"variant": args.label, "us": times}))


if __name__ == "__main__":
    main()
