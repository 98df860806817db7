"""Which part of the filtered kernel's cost comes from 16-bit rows and which from rank order
and the values output: device time of topk_filtered (indices; unsorted and sorted) and top_k
(values and indices, sorted) on float32, bfloat16 and float16 rows of the indexer shapes, then
top_k on the vocabulary shapes, each with its read floor (valid elements at the copy bandwidth).
Run on the GPU from the repo root: python -m benches.probes.filtered_variants [--vocab]"""

import sys

import jax
import jax.numpy as jnp
import numpy as np

import jax_topk
from benches import scores as scores_of
from benches.bench import copy_bandwidth_tbps, device_time_us

SHAPES = {"5536x131072 causal": (5536, 131072, True), "32x131072 full": (32, 131072, False)}
VOCAB = [(256, 152064, 50), (64, 152064, 50)]


def floor_us(lengths, dtype, tbps):
    return float(np.sum(np.asarray(lengths))) * jnp.dtype(dtype).itemsize / (tbps * 1e12) * 1e6


def indexer_rows(tbps):
    print(
        "| shape | dtype | topk_filtered unsorted | topk_filtered sorted | top_k (values, sorted)"
        " | floor | top_k / floor |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for label, (rows, n, causal) in SHAPES.items():
        lengths = (n - (rows - 1 - np.arange(rows))) if causal else np.full(rows, n)
        lengths = jnp.asarray(lengths, jnp.int32)
        for dtype in (jnp.float32, jnp.bfloat16, jnp.float16):
            sets = [
                (scores_of.normal(jax.random.key(i), (rows, n), dtype), lengths)
                for i in range(4 if rows > 1000 else 32)
            ]
            calls = {
                "unsorted": jax.jit(lambda s, lens: jax_topk.topk_filtered(s, lens, k=2048)),
                "sorted": jax.jit(
                    lambda s, lens: jax_topk.topk_filtered(s, lens, k=2048, sorted=True)
                ),
                "top_k": jax.jit(lambda s, lens: jax_topk.top_k(s, 2048, lengths=lens)),
            }
            times = [device_time_us(fn, sets, 12) for fn in calls.values()]
            floor = floor_us(lengths, dtype, tbps)
            print(
                f"| {label} | {jnp.dtype(dtype).name} | "
                + " | ".join(f"{t:.1f}" for t in times)
                + f" | {floor:.1f} | {times[-1] / floor:.2f} |",
                flush=True,
            )


def vocab_rows(tbps):
    print("| top_k [B, n], k | dtype | top_k (values, sorted) | floor | top_k / floor |")
    print("| --- | --- | --- | --- | --- |")
    for rows, n, k in VOCAB:
        for dtype in (jnp.bfloat16, jnp.float32):
            sets = [
                (scores_of.normal(jax.random.key(i), (rows, n), dtype),)
                for i in range(max(4, 300_000_000 // (rows * n * 4)))
            ]
            fn = jax.jit(lambda x: jax_topk.top_k(x, k))
            t = device_time_us(fn, sets, 20)
            floor = floor_us(np.full(rows, n), dtype, tbps)
            print(
                f"| [{rows}, {n}], {k} | {jnp.dtype(dtype).name} | {t:.1f} | {floor:.1f} |"
                f" {t / floor:.2f} |",
                flush=True,
            )


def main():
    tbps = copy_bandwidth_tbps()
    print(f"copy bandwidth {tbps:.2f} TB/s (read + write)")
    if "--vocab-only" not in sys.argv:
        indexer_rows(tbps)
    if "--vocab" in sys.argv or "--vocab-only" in sys.argv:
        vocab_rows(tbps)


if __name__ == "__main__":
    main()
