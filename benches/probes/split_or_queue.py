"""Few rows of the filtered kernel split over a thread block cluster a row (its launch plan's
choice up to half the worker pool's rows) against one block a row (JAX_TOPK_FILTERED_SPLIT=off,
read at each launch): device time of the same calls on the same inputs both ways, with the read
floor (benches/NOTES.md "split or queue"). Run on the GPU from the repo root:
python -m benches.probes.split_or_queue"""

import os

import jax
import jax.numpy as jnp
import numpy as np

import jax_topk
from benches import scores as scores_of
from benches.bench import copy_bandwidth_tbps, device_time_us

# (call, dtype, rows, n, k, causal): the indexer's M = 128 selection first.
SHAPES = [
    ("topk_filtered", "float32", 128, 65536, 2048, True),
    ("topk_filtered", "bfloat16", 128, 65536, 2048, True),
    ("topk_filtered", "float32", 132, 131072, 2048, False),
    ("topk_filtered", "float32", 96, 100000, 2048, False),
    ("topk_filtered", "float32", 64, 131072, 2048, False),
    ("topk_filtered", "float32", 32, 131072, 2048, False),
    ("topk_filtered", "float32", 32, 32768, 2048, False),
    ("top_k", "bfloat16", 128, 152064, 50, False),
    ("top_k", "bfloat16", 64, 152064, 50, False),
    ("top_k", "float32", 128, 152064, 50, False),
    ("top_k", "float32", 64, 152064, 50, False),
    ("top_k", "bfloat16", 32, 131072, 2048, False),
]


def main():
    tbps = copy_bandwidth_tbps()
    print(f"copy bandwidth {tbps:.2f} TB/s (read + write)")
    print("| call | dtype | rows x n | k | split (the plan's) | a block a row | floor |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for call, dtype, rows, n, k, causal in SHAPES:
        lengths = (n - (rows - 1 - np.arange(rows))) if causal else np.full(rows, n)
        lens = jnp.asarray(lengths, jnp.int32)
        sets = [(scores_of.normal(jax.random.key(i), (rows, n), dtype), lens) for i in range(16)]
        if call == "top_k":
            fn = jax.jit(lambda x, ln, k=k: jax_topk.top_k(x, k, lengths=ln))
        else:
            fn = jax.jit(lambda x, ln, k=k: jax_topk.topk_filtered(x, ln, k=k))
        times = []
        for mode in ("on", "off"):
            os.environ["JAX_TOPK_FILTERED_SPLIT"] = mode
            times.append(device_time_us(fn, sets, 12))
        os.environ.pop("JAX_TOPK_FILTERED_SPLIT")
        floor = float(np.sum(lengths)) * jnp.dtype(dtype).itemsize / (tbps * 1e12) * 1e6
        label = f"{rows} x {n}" + (" causal" if causal else "")
        print(
            f"| {call} | {dtype} | {label} | {k} | {times[0]:.1f} | {times[1]:.1f} | {floor:.1f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
