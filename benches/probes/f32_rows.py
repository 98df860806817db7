"""The register kernel for few float32 rows (cuda/kernels/topk_f32_rows.cu) against the filtered
kernel on the same shapes: device time (JAX's profiler, benches/bench.py's method) of
topk_filtered and top_k at widths <= 32768 and 1 to 528 rows. The kernel is picked at launch by
JAX_TOPK_F32_ROWS (off, always; unset: the measured rule), one process a variant:
    JAX_TOPK_F32_ROWS=off python -m benches.probes.f32_rows --label filtered
    JAX_TOPK_F32_ROWS=always python -m benches.probes.f32_rows --label register
Prints one JSON line of {shape label: us} a run; f32_rows.sh runs both and tabulates."""

import argparse
import json

import jax
import jax.numpy as jnp

import jax_topk
from benches.bench import L2_BYTES, device_time_us

SHAPES = [  # (op, rows, n, k, sorted)
    *(("topk_filtered", rows, 32768, 2048, False) for rows in (1, 4, 32, 48, 64, 96, 132, 264)),
    *(("topk_filtered", rows, 16384, 2048, False) for rows in (1, 32, 132, 264)),
    ("topk_filtered", 32, 8192, 512, False),
    ("topk_filtered", 132, 4096, 512, False),
    ("topk_filtered", 1, 32768, 2048, True),
    *(("top_k", rows, 32000, 50, True) for rows in (1, 8, 64, 132, 256)),
    ("top_k", 64, 16384, 256, True),
    ("top_k", 4, 32768, 2048, True),
]


def label(op, rows, n, k, sorted_):
    return f"{op} {rows}x{n} k={k}{' sorted' if sorted_ else ''}"


def call(op, k, sorted_):
    if op == "top_k":
        return jax.jit(lambda x, lens: jax_topk.top_k(x, k, sorted=sorted_))
    return jax.jit(lambda x, lens: jax_topk.topk_filtered(x, lens, k=k, sorted=sorted_))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--label", required=True)
    args = parser.parse_args()
    times = {}
    for op, rows, n, k, sorted_ in SHAPES:
        sets = [
            (
                jax.random.normal(jax.random.key(i), (rows, n), jnp.float32),
                jnp.full((rows,), n, jnp.int32),
            )
            for i in range(max(2, min(64, 3 * L2_BYTES // (rows * n * 4) + 2)))
        ]
        fn = call(op, k, sorted_)
        times[label(op, rows, n, k, sorted_)] = device_time_us(fn, sets, calls=40)
    print(json.dumps({"variant": args.label, "us": times}))


if __name__ == "__main__":
    main()
