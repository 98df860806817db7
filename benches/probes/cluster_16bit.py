"""The cluster kernel on few bfloat16 / float16 rows (cuda/kernels/topk_f32_cluster.cu, 16-bit
values widened to float32 keys) against the filtered kernel that served them before, in one
process: device time (JAX's profiler, benches/bench.py's method) of topk_filtered and top_k at 1 to
64 rows of 16384 to 196608 columns, and float32 rows that one wave of 8- or 9-block clusters
holds, with the cluster kernel forced on (JAX_TOPK_F32_CLUSTER=always), off, and the build's
default rule (unset), plus jax.lax.top_k on the issue's vocabulary rows; then a few rows forced
to each cluster size from 9 to 16. The switches are read at each launch, so one jitted function
serves every variant.
    python -m benches.probes.cluster_16bit [--json OUT]
Prints a table (us a call, median) and whether every variant's output equals the filtered
kernel's."""

import argparse
import json
import os

import jax
import jax.numpy as jnp
import numpy as np

from benches.bench import L2_BYTES, device_time_us
from benches.probes.f32_rows import call, label

SHAPES = [  # (op, dtype, rows, n, k, sorted): the vocabulary rows first
    ("top_k", "bfloat16", 1, 152064, 50, True),
    ("top_k", "float16", 1, 152064, 50, True),
    ("top_k", "bfloat16", 8, 152064, 50, True),
    ("top_k", "bfloat16", 1, 32768, 256, True),
    ("topk_filtered", "bfloat16", 1, 16384, 2048, False),
    ("topk_filtered", "bfloat16", 1, 32768, 2048, False),
    ("topk_filtered", "bfloat16", 4, 32768, 2048, False),
    ("topk_filtered", "bfloat16", 1, 65536, 2048, False),
    ("topk_filtered", "bfloat16", 1, 131072, 2048, False),
    ("topk_filtered", "float16", 1, 131072, 2048, False),
    ("topk_filtered", "bfloat16", 4, 131072, 2048, False),
    ("topk_filtered", "bfloat16", 8, 131072, 2048, False),
    ("topk_filtered", "bfloat16", 16, 65536, 2048, False),
    ("topk_filtered", "bfloat16", 1, 196608, 2048, False),
    ("topk_filtered", "bfloat16", 1, 131072, 2048, True),
    ("top_k", "bfloat16", 1, 131072, 2048, True),
    # Past one wave of 16-block clusters: two waves at 16 and 24 keys a thread, 8-block clusters.
    ("top_k", "float16", 8, 152064, 50, True),
    ("topk_filtered", "bfloat16", 16, 131072, 2048, False),
    ("topk_filtered", "bfloat16", 16, 98304, 2048, False),
    ("topk_filtered", "bfloat16", 32, 32768, 2048, False),
    ("topk_filtered", "bfloat16", 32, 65536, 2048, False),
    ("topk_filtered", "bfloat16", 32, 131072, 2048, False),
    ("top_k", "bfloat16", 32, 131072, 2048, True),
    ("topk_filtered", "bfloat16", 64, 32768, 2048, False),
    # float32 rows that one wave of 8- or 9-block clusters holds ("filtered": the cluster kernel
    # off, so topk_f32_rows or the filtered kernel, by their own rules).
    ("topk_filtered", "float32", 8, 32768, 2048, False),
    ("topk_filtered", "float32", 12, 32768, 2048, False),
    ("topk_filtered", "float32", 8, 65536, 2048, False),
    ("topk_filtered", "float32", 12, 65536, 2048, False),
    ("topk_filtered", "float32", 14, 98304, 2048, False),
    ("top_k", "float32", 8, 65536, 50, True),
]
LAX_SHAPES = SHAPES[:3]
# Rows that 16-block clusters take in two waves: the cluster kernel forced to each size from 9.
PARTS_SHAPES = [
    ("top_k", "float32", 8, 152064, 50, True),
    ("top_k", "bfloat16", 8, 152064, 50, True),
    ("topk_filtered", "float32", 8, 131072, 2048, False),
    ("topk_filtered", "bfloat16", 8, 131072, 2048, False),
]
PARTS = range(9, 17)
VARIANTS = {"filtered": "off", "cluster": "always", "default": None}


def input_sets(dtype, rows, n):
    count = max(2, min(64, 3 * L2_BYTES // (rows * n * 2) + 2))
    return [
        (
            jax.random.normal(jax.random.key(i), (rows, n), jnp.float32).astype(dtype),
            jnp.full((rows,), n, jnp.int32),
        )
        for i in range(count)
    ]


def set_variant(mode):
    if mode is None:
        os.environ.pop("JAX_TOPK_F32_CLUSTER", None)
    else:
        os.environ["JAX_TOPK_F32_CLUSTER"] = mode


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", help="write {shape: {variant: us}} here")
    args = parser.parse_args()
    table = {}
    for op, dtype, rows, n, k, sorted_ in SHAPES:
        sets = input_sets(dtype, rows, n)
        fn = call(op, k, sorted_)
        name = f"{dtype} {label(op, rows, n, k, sorted_)}"
        row = table[name] = {}
        outputs = {}
        for variant, mode in VARIANTS.items():
            set_variant(mode)
            row[variant] = device_time_us(fn, sets, calls=40)
            outputs[variant] = jax.tree.leaves(fn(*sets[0]))
        set_variant(None)
        reference = outputs["filtered"]
        row["same"] = all(
            all(
                np.array_equal(
                    np.asarray(a).view(f"u{a.dtype.itemsize}"),
                    np.asarray(b).view(f"u{b.dtype.itemsize}"),
                )
                for a, b in zip(out, reference, strict=True)
            )
            for out in outputs.values()
        )
        if (op, dtype, rows, n, k, sorted_) in LAX_SHAPES:
            lax = jax.jit(lambda x, lens, k=k: jax.lax.top_k(x, k))
            row["lax"] = device_time_us(lax, sets, calls=20)
    for op, dtype, rows, n, k, sorted_ in PARTS_SHAPES:
        sets = input_sets(dtype, rows, n)
        fn = call(op, k, sorted_)
        row = table.setdefault(f"{dtype} {label(op, rows, n, k, sorted_)}", {})
        for variant, mode in VARIANTS.items():
            if variant not in row:
                set_variant(mode)
                row[variant] = device_time_us(fn, sets, calls=40)
        reference = jax.tree.leaves(fn(*sets[0]))
        os.environ["JAX_TOPK_F32_CLUSTER"] = "always"
        for parts in PARTS:
            os.environ["JAX_TOPK_F32_CLUSTER_PARTS"] = str(parts)
            row[f"p={parts}"] = device_time_us(fn, sets, calls=40)
            same = all(
                np.array_equal(np.asarray(a), np.asarray(b))
                for a, b in zip(jax.tree.leaves(fn(*sets[0])), reference, strict=True)
            )
            row["same"] = row.get("same", True) and same
        del os.environ["JAX_TOPK_F32_CLUSTER_PARTS"]
        set_variant(None)
    columns = [*VARIANTS, "lax", *(f"p={parts}" for parts in PARTS)]
    print(f"| shape | {' | '.join(columns)} | cluster / filtered | same bits |")
    print(f"| --- | {' | '.join('---' for _ in columns)} | --- | --- |")
    for name, row in table.items():
        cells = [f"{row[c]:.1f}" if c in row else "-" for c in columns]
        ratio = row["cluster"] / row["filtered"]
        print(f"| {name} | {' | '.join(cells)} | {ratio:.2f} | {'yes' if row['same'] else 'NO'} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(table, f, indent=1)


if __name__ == "__main__":
    main()
