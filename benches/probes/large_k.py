"""top_k past the kernels' k = 2048: the rounds route (2048 winners a kernel call, the earlier
winners masked out between calls) against the one-sort path it replaces, jax.lax.top_k and
torch.topk, on the same rows (device time, us; benches/NOTES.md "top_k past 2048: rounds").
The rounds' indices and values are checked bit for bit against the sort path's on the first
input set. The table says where the sort becomes the faster way (jax_topk._top_k.max_rounds).

Run on the GPU from the repo root: python -m benches.probes.large_k [--quick]"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np

from benches.bench import device_time_us, torch_topk_us
from jax_topk import _fallback, _top_k

# (dtype, rows, n, k): the row first, then more rounds, fewer and shorter rows.
CASES = [
    ("float32", 64, 131072, 4096),
    ("float32", 64, 131072, 8192),
    ("float32", 64, 131072, 16384),
    ("float32", 64, 131072, 32768),
    ("float32", 8, 131072, 4096),
    ("float32", 8, 131072, 16384),
    ("bfloat16", 64, 131072, 4096),
    ("bfloat16", 64, 131072, 16384),
    ("float32", 1024, 32768, 4096),
    ("float32", 64, 32768, 16384),
    ("float32", 4096, 8192, 4096),
]
QUICK = CASES[:2] + CASES[4:5] + CASES[6:7]


def input_sets(dtype, rows, n):
    """Distinct sets, together several times the 60 MB L2 (at least 4)."""
    count = max(4, min(16, 240_000_000 // (rows * n * jnp.dtype(dtype).itemsize)))
    return [
        (jax.random.normal(jax.random.key(i), (rows, n), jnp.float32).astype(dtype),)
        for i in range(count)
    ]


def main():
    cases = QUICK if "--quick" in sys.argv else CASES
    print(
        "| dtype | rows x n | k | rounds | rounds (us) | one sort (us) | lax.top_k (us) "
        "| torch.topk (us) | sort / rounds | same bits |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for dtype, rows, n, k in cases:
        sets = input_sets(dtype, rows, n)
        lengths = jnp.full((rows,), n, jnp.int32)
        by_rounds = jax.jit(lambda x, k=k: _top_k._select_in_rounds(x, lengths, k=k, sorted=True))
        by_sort = jax.jit(lambda x, k=k: _fallback.select_with_values(x, lengths, k=k, sorted=True))
        lax_top_k = jax.jit(lambda x, k=k: jax.lax.top_k(x, k))
        ours, theirs = by_rounds(*sets[0]), by_sort(*sets[0])
        same = all(
            np.array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))
            for a, b in zip(ours, theirs)
        )
        calls = 6
        t_rounds = device_time_us(by_rounds, sets, calls)
        t_sort = device_time_us(by_sort, sets, calls)
        t_lax = device_time_us(lax_top_k, sets, calls)
        torch = torch_topk_us([s[0] for s in sets], k, 10)
        t_torch = f"{torch[0]:.1f}" if torch else "-"
        print(
            f"| {dtype} | {rows}x{n} | {k} | {_top_k.rounds(k)} | {t_rounds:.1f} | {t_sort:.1f} "
            f"| {t_lax:.1f} | {t_torch} | {t_sort / t_rounds:.2f} | {'yes' if same else 'NO'} |",
            flush=True,
        )
        del sets


if __name__ == "__main__":
    main()
