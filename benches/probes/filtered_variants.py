"""Which part of the filtered kernel's cost comes from 16-bit rows and which from the values
output: device time of topk_filtered (indices; unsorted and sorted) and top_k (values and
indices, sorted) on float32 and bfloat16 rows of two shapes. Run on the GPU from the repo root:
python -m benches.probes.filtered_variants"""

import jax
import jax.numpy as jnp
import numpy as np

import jax_topk
from benches.bench import device_time_us

SHAPES = {"5536x131072 causal": (5536, 131072, True), "32x131072 full": (32, 131072, False)}


def main():
    print(
        "| shape | dtype | topk_filtered unsorted | topk_filtered sorted | top_k (values, sorted) |"
    )
    print("| --- | --- | --- | --- | --- |")
    for label, (rows, n, causal) in SHAPES.items():
        lengths = (n - (rows - 1 - np.arange(rows))) if causal else np.full(rows, n)
        lengths = jnp.asarray(lengths, jnp.int32)
        for dtype in (jnp.float32, jnp.bfloat16):
            sets = [
                (jax.random.normal(jax.random.key(i), (rows, n), dtype), lengths)
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
            print(
                f"| {label} | {jnp.dtype(dtype).name} | "
                + " | ".join(f"{t:.1f}" for t in times)
                + " |"
            )


if __name__ == "__main__":
    main()
