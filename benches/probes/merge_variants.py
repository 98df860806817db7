"""merge_topk's kernel variants at issue 14's shape (benches/probes/merge_rows.py's inputs),
chosen by JAX_TOPK_MERGE_VARIANT (read at each launch; a fresh jit a variant): `old` (one
block a row, 8-bit passes on a 64-bit key) or `<blocks per SM>,<rows prefetched>,<skip sort>`
for the row-in-registers kernel (blocks per SM 0: one block a row). Run on the GPU from the
repo root: python -m benches.probes.merge_variants [VARIANT ...]"""

import os
import sys

import jax
import jax.numpy as jnp

import jax_topk
from benches.bench import copy_bandwidth_tbps, device_time_us
from benches.probes.merge_rows import ROWS, SHARDS, K, candidate_sets


def main():
    variants = sys.argv[1:] or ["1,1,0"]
    tbps = copy_bandwidth_tbps()
    print(f"copy bandwidth {tbps:.2f} TB/s")
    for dtype in (jnp.float32, jnp.bfloat16):
        sets = candidate_sets(4, dtype)
        floor_us = ROWS * SHARDS * K * (jnp.dtype(dtype).itemsize + 4) / (tbps * 1e6)
        for variant in variants:  # the first in both orders, the others sorted
            os.environ["JAX_TOPK_MERGE_VARIANT"] = variant
            for sorted_ in (True, False) if variant == variants[0] else (True,):
                fn = jax.jit(lambda v, i, o=sorted_: jax_topk.merge_topk(v, i, K, sorted=o))
                t = device_time_us(fn, sets, 12)
                print(
                    f"{variant:>8} {jnp.dtype(dtype).name} {ROWS} x {SHARDS}x{K} "
                    f"sorted={sorted_}: {t:.1f} us, floor {floor_us:.1f} us, {t / floor_us:.2f}x",
                    flush=True,
                )
        del sets


if __name__ == "__main__":
    main()
