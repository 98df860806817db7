"""merge_topk's speed at issue 14's shape: 5536 rows of 8 x 2048 candidates (float32 values,
int32 global columns, as eight shards' top_k results would arrive), against reading its input
once. Run on the GPU from the repo root: python -m benches.probes.merge_rows"""

import jax
import jax.numpy as jnp

import jax_topk
from benches import scores as scores_of
from benches.bench import copy_bandwidth_tbps, device_time_us

ROWS, SHARDS, K = 5536, 8, 2048


def candidate_sets(count, dtype):
    sets = []
    for i in range(count):
        key = jax.random.key(i)
        values = scores_of.normal(key, (ROWS, SHARDS * K), dtype)
        shard_columns = jnp.sort(jax.random.randint(key, (ROWS, SHARDS, K), 0, 16384), axis=-1)
        columns = shard_columns + 16384 * jnp.arange(SHARDS)[None, :, None]
        sets.append((values, columns.reshape(ROWS, SHARDS * K).astype(jnp.int32)))
    return sets


def main():
    tbps = copy_bandwidth_tbps()
    print(f"copy bandwidth {tbps:.2f} TB/s")
    for dtype in (jnp.float32, jnp.bfloat16):
        sets = candidate_sets(4, dtype)
        bytes_read = ROWS * SHARDS * K * (jnp.dtype(dtype).itemsize + 4)
        floor_us = bytes_read / (tbps * 1e12) * 1e6  # the benchmark's floor: bytes / copy rate
        for sorted_ in (True, False):
            fn = jax.jit(lambda v, i, o=sorted_: jax_topk.merge_topk(v, i, K, sorted=o))
            t = device_time_us(fn, sets, 12)
            name = jnp.dtype(dtype).name
            print(
                f"merge_topk {name} {ROWS} x {SHARDS}x{K} sorted={sorted_}: {t:.1f} us, "
                f"read floor {floor_us:.1f} us, {t / floor_us:.2f}x"
            )


if __name__ == "__main__":
    main()
