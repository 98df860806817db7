"""The short-row kernel's sorted order (topk_bf16 sorted=True, top_k on 16-bit rows of <= 16384):
the counting rank over the winners' keys (the default where k <= 512 and their keys span < 1024
values) against the block radix sort for every row (JAX_TOPK_BF16_SORT=radix, read at each
launch): device time of the same calls on the same inputs both ways, alternated twice, each
result equal both ways (benches/NOTES.md "topk_bf16: sorted rows ranked by key counts"). Run on
the GPU from the repo root: python -m benches.probes.bf16_sorted_rank"""

import os

import jax
import jax.numpy as jnp
import numpy as np

import jax_topk
from benches import scores as scores_of
from benches.bench import copy_bandwidth_tbps, device_time_us

PAGE = 64
# (call, dtype, rows, n, k, valid length, sorted); topk_bf16 page-transformed.
SHAPES = [
    ("topk_bf16", "bfloat16", 1, 16384, 512, 16384, True),
    ("topk_bf16", "bfloat16", 128, 16384, 512, 16384, True),
    ("topk_bf16", "bfloat16", 512, 16384, 512, 16384, True),
    ("topk_bf16", "bfloat16", 2048, 16384, 512, 16384, True),
    ("topk_bf16", "bfloat16", 2048, 16384, 512, 4096, True),
    ("topk_bf16", "bfloat16", 2048, 16384, 512, 16384, False),  # unsorted: the control
    ("top_k", "bfloat16", 2048, 16384, 512, 16384, True),
    ("top_k", "bfloat16", 2048, 16384, 50, 16384, True),
    ("top_k", "bfloat16", 8192, 4096, 64, 4096, True),
    ("top_k", "float16", 2048, 16384, 512, 16384, True),
    ("top_k", "float16", 2048, 16384, 50, 16384, True),
]
MODES = ("count", "radix")


def call_of(call, n, k, sorted_):
    if call == "top_k":
        return jax.jit(lambda s, lengths, table: jax_topk.top_k(s, k))
    return jax.jit(
        lambda s, lengths, table: jax_topk.topk_bf16(
            s, lengths, k=k, page_table=table, page_size=PAGE, sorted=sorted_
        )
    )


def set_mode(mode):
    if mode == "radix":
        os.environ["JAX_TOPK_BF16_SORT"] = "radix"
    else:
        os.environ.pop("JAX_TOPK_BF16_SORT", None)


def main():
    tbps = copy_bandwidth_tbps()
    print(f"copy bandwidth {tbps:.2f} TB/s (read + write)")
    table_rows = []
    for call, dtype, rows, n, k, valid, sorted_ in SHAPES:
        lengths = jnp.full((rows,), valid, jnp.int32)
        pages = -(-n // PAGE)
        sets = []
        for i in range(3):
            key = jax.random.key(rows * 31 + n + valid + i)
            scores = scores_of.normal(key, (rows, n), dtype)
            table = jax.random.permutation(jax.random.fold_in(key, 7), pages * rows)
            sets.append((scores, lengths, table.reshape(rows, pages).astype(jnp.int32)))
        fn = call_of(call, n, k, sorted_)
        times = {mode: [] for mode in MODES}
        results = {}
        for repeat in range(2):
            for mode in MODES:
                set_mode(mode)
                times[mode].append(device_time_us(fn, sets, 12))
                if repeat == 0:
                    results[mode] = jax.tree.map(np.asarray, fn(*sets[0]))
        leaves = [jax.tree.leaves(results[mode]) for mode in MODES]
        same = all(
            np.array_equal(a.view(f"u{a.itemsize}"), b.view(f"u{b.itemsize}"))
            for a, b in zip(*leaves, strict=True)
        )
        count, radix = min(times["count"]), min(times["radix"])
        floor = rows * valid * jnp.dtype(dtype).itemsize / (tbps * 1e12) * 1e6
        label = f"{call} {dtype} {rows}x{n} k={k} valid={valid} sorted={sorted_}"
        table_rows.append(
            f"| {label} | {count:.1f} | {radix:.1f} | {count / radix:.3f} | {floor:.1f} | {same} |"
        )
        print(table_rows[-1], flush=True)
    set_mode("count")
    print("\n| shape | by key counts (us) | radix sort (us) | ratio | read floor (us) | equal |")
    print("| --- | --- | --- | --- | --- | --- |")
    print("\n".join(table_rows))


if __name__ == "__main__":
    main()
