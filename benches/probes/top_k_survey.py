"""top_k off the benchmark grid: shapes a JAX user meets (vocabularies of 32000 and 50257, short
rows, MoE routers, argmax-like k = 1) in every route top_k takes, against jax.lax.top_k and
torch.topk in the same run, so that a shape where ours loses is seen (benches/NOTES.md "top_k off
the grid"). Values and indices, sorted, no lengths; random normal rows; ours' values checked equal
to lax.top_k's. Run on the GPU from the repo root: python -m benches.probes.top_k_survey"""

import os

import jax
import jax.numpy as jnp
import numpy as np

import jax_topk
from benches import scores as scores_of
from benches.bench import device_time_us, torch_topk_us
from jax_topk._top_k import route

SHAPES = [  # (dtype, rows, n, k)
    ("float32", 32, 1000, 5),
    ("float32", 65536, 128, 2),
    ("float32", 100000, 64, 4),
    ("float32", 8192, 1024, 64),
    ("bfloat16", 8192, 1024, 64),
    ("float32", 4096, 2048, 16),
    ("bfloat16", 4096, 2048, 16),
    ("float32", 16384, 4096, 1),
    ("float32", 16384, 4096, 16),
    ("float32", 4096, 8192, 64),
    ("float32", 2048, 16384, 256),
    ("bfloat16", 16384, 4096, 1),
    ("float32", 2048, 16384, 64),
    ("float32", 2048, 32768, 8),
    ("bfloat16", 1024, 32000, 40),
    ("float32", 1024, 50257, 50),
    ("bfloat16", 64, 65536, 64),
    ("float32", 8, 262144, 2048),
]


def main():
    lines = []
    for dtype, rows, n, k in SHAPES:
        sets = [
            (scores_of.normal(jax.random.key(rows + n + i), (rows, n), dtype),) for i in range(3)
        ]
        ours = jax.jit(lambda x, k=k: jax_topk.top_k(x, k))
        lax = jax.jit(lambda x, k=k: jax.lax.top_k(x, k))
        same = bool(
            np.array_equal(
                np.asarray(ours(*sets[0])[0], np.float32), np.asarray(lax(*sets[0])[0], np.float32)
            )
        )
        ours_us = device_time_us(ours, sets, 8)
        # float32 rows of <= 32768: also the register kernel for few rows forced on every row.
        forced = "-"
        if dtype == "float32" and n <= 32768:
            os.environ["JAX_TOPK_F32_ROWS"] = "always"
            forced = f"{device_time_us(ours, sets, 8):.1f}"
            del os.environ["JAX_TOPK_F32_ROWS"]
        lax_us = device_time_us(lax, sets, 8)
        torch_result = torch_topk_us([s[0] for s in sets], k, 8)
        torch_us = f"{torch_result[0]:.1f}" if torch_result else "-"
        chosen = route(jnp.dtype(dtype), n, k, rows).value
        lines.append(
            f"| {dtype} [{rows}, {n}] k={k} | {chosen} | {ours_us:.1f} | {forced} | {lax_us:.1f} | "
            f"{torch_us} | {lax_us / ours_us:.1f}x | {same} |"
        )
        print(lines[-1], flush=True)
    print(
        "\n| shape | route | ours (us) | lax.top_k (us) | torch.topk (us) | vs lax | same values |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
