"""The cluster kernel (cuda/kernels/topk_f32_cluster.cu) at every cluster size from 4 to 16 on the
few-row float32 shapes it serves with 16 blocks a row (issue 16's decode rows, issue 13's
vocabulary row): fewer blocks a row mean more keys a thread but fewer SMs to wait for at each
exchange. Device time (JAX's profiler, benches/bench.py's method), the size forced through
JAX_TOPK_F32_CLUSTER_PARTS (read at each launch), bits checked equal to the default's.
    python -m benches.probes.cluster_sizes
Prints a table, us a call (median); '-' where that size cannot hold the row."""

import os

import jax
import jax.numpy as jnp
import numpy as np

from benches.bench import L2_BYTES, device_time_us
from benches.probes.f32_rows import call, label

SHAPES = [  # (op, rows, n, k, sorted)
    ("topk_filtered", 1, 32768, 2048, False),
    ("topk_filtered", 4, 32768, 2048, False),
    ("topk_filtered", 1, 16384, 2048, False),
    ("topk_filtered", 1, 131072, 2048, False),
    ("top_k", 1, 152064, 50, True),
]
SIZES = range(4, 17)


def main():
    os.environ["JAX_TOPK_F32_CLUSTER"] = "always"
    rows_out = []
    for op, rows, n, k, sorted_ in SHAPES:
        count = max(2, min(64, 3 * L2_BYTES // (rows * n * 4) + 2))
        sets = [
            (
                jax.random.normal(jax.random.key(i), (rows, n), jnp.float32),
                jnp.full((rows,), n, jnp.int32),
            )
            for i in range(count)
        ]
        fn = call(op, k, sorted_)
        reference = [np.asarray(x) for x in jax.tree.leaves(fn(*sets[0]))]
        cells = {}
        for parts in SIZES:
            if n > parts * 512 * 32:
                continue
            os.environ["JAX_TOPK_F32_CLUSTER_PARTS"] = str(parts)
            got = [np.asarray(x) for x in jax.tree.leaves(fn(*sets[0]))]
            same = all(np.array_equal(a, b) for a, b in zip(got, reference, strict=True))
            cells[parts] = f"{device_time_us(fn, sets, calls=60):.2f}" + ("" if same else " DIFF")
        del os.environ["JAX_TOPK_F32_CLUSTER_PARTS"]
        rows_out.append((label(op, rows, n, k, sorted_), cells))
    print(f"| shape | {' | '.join(str(p) for p in SIZES)} |")
    print(f"| --- | {' | '.join('---' for _ in SIZES)} |")
    for name, cells in rows_out:
        print(f"| {name} | {' | '.join(cells.get(p, '-') for p in SIZES)} |")


if __name__ == "__main__":
    main()
