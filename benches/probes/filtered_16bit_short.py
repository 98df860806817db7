"""topk_filtered's 16-bit rows of at most 16384 columns (benches/NOTES.md "topk_filtered's short
16-bit rows"): the kernels topk_filtered picks for them on its own (the thread block cluster for
few rows, the 256-thread register block for many rows of <= 8192 columns, else the filtered
queue) against topk_bf16's kernel, which takes the same rows under the same contract. One
process, the same inputs; device time in us (benches/bench.py's method). Columns:
  own      topk_filtered with JAX_TOPK_SHORT_16BIT=own (its own kernels, whatever the rule says)
  default  topk_filtered as shipped (the rule)
  bf16     topk_bf16's primitive (its own routing: topk_argmax at k = 1, the register block where
           it wins; float16 rows too, which only top_k sends it through the public API)
Every column's indices are checked equal to topk_bf16's. From the repo root on the GPU:
    python -m benches.probes.filtered_16bit_short"""

import os

import jax
import jax.numpy as jnp
import numpy as np

import jax_topk
from benches import scores as scores_of
from benches.bench import device_time_us
from jax_topk._top_k import bind_rows

ROWS = (1, 8, 32, 132, 512, 2048)
SHAPES = [  # (dtype, rows, n, k, sorted, causal lengths)
    *(
        (dtype, rows, n, k, False, False)
        for dtype in ("bfloat16", "float16")
        for n in (8192, 16384)
        for k in (64, 512, 2048)
        for rows in ROWS
    ),
    *(("bfloat16", rows, 16384, 512, True, False) for rows in ROWS),
    *(("bfloat16", rows, 16384, 2048, True, False) for rows in (1, 132, 2048)),
    *(("float16", rows, 16384, 512, True, False) for rows in (1, 132, 2048)),
    *(("bfloat16", rows, 16384, 2048, False, True) for rows in (132, 2048)),
    *(("bfloat16", rows, 4096, 512, False, False) for rows in (1, 32, 132, 2048)),
]
VARIANTS = ("own", "default", "bf16")


def topk_bf16_kernel(scores, lengths, *, k, sorted):
    """topk_bf16's primitive, which takes float16 rows too (top_k binds it so; the public
    jax_topk.topk_bf16 accepts bfloat16 alone)."""
    (indices,) = bind_rows("topk_bf16", scores, lengths, k=k, sorted=sorted)
    return indices


def timed(variant, dtype, k, sorted_, sets):
    op = topk_bf16_kernel if variant == "bf16" else jax_topk.topk_filtered
    fn = jax.jit(lambda x, lens: (op(x, lens, k=k, sorted=sorted_),))
    if variant == "own":
        os.environ["JAX_TOPK_SHORT_16BIT"] = "own"
    try:
        indices = np.asarray(fn(*sets[0])[0])
        return indices, device_time_us(fn, sets, 8)
    finally:
        os.environ.pop("JAX_TOPK_SHORT_16BIT", None)


def main():
    lines = []
    header = "| dtype | rows x n | k | " + " | ".join(VARIANTS) + " | own / bf16 | same |"
    for dtype, rows, n, k, sorted_, causal in SHAPES:
        lengths = (
            jnp.arange(n - rows + 1, n + 1, dtype=jnp.int32)
            if causal
            else jnp.full((rows,), n, jnp.int32)
        )
        sets = [
            (scores_of.normal(jax.random.key(rows * 7 + n + k + i), (rows, n), dtype), lengths)
            for i in range(3)
        ]
        results = {variant: timed(variant, dtype, k, sorted_, sets) for variant in VARIANTS}
        same = all(np.array_equal(r[0], results["bf16"][0]) for r in results.values())
        times = [results[variant][1] for variant in VARIANTS]
        shape = f"{rows} x {n}{' causal' if causal else ''}"
        cells = " | ".join(f"{t:.1f}" for t in times)
        ratio = results["own"][1] / results["bf16"][1]
        label = f"{k}{' sorted' if sorted_ else ''}"
        lines.append(f"| {dtype} | {shape} | {label} | {cells} | {ratio:.2f} | {same} |")
        print(lines[-1], flush=True)
    print("\n" + header)
    print("|" + " --- |" * (len(VARIANTS) + 5))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
