"""top_k's rows of <= 1024 columns with 33 to 64 winners (benches/NOTES.md "small rows: k past 32
by digits"): the warp-a-row kernel's step 2 by 8-bit digits against the route those calls took
before (float32: topk_filtered's kernels, which give such rows the register block; 16-bit:
topk_bf16's kernel), and at k <= 32 against its own rounds of the warp max (digits forced by
JAX_TOPK_SMALL_ROWS=digits, read at each launch). jax.lax.top_k on the same data; device time in
us (benches/bench.py's method); every column's values and indices checked equal to top_k's
default. From the repo root on the GPU:
    python -m benches.probes.small_rows_digits [--set rules|ranking]"""

import argparse
import os

import jax
import jax.numpy as jnp
import numpy as np

import jax_topk
from benches import scores as scores_of
from benches.bench import device_time_us
from jax_topk._top_k import bind_rows

PAST_32 = [  # (dtype, rows, n, k): top_k now (digits) against the route before
    ("float32", 8192, 1024, 64),
    ("float32", 8192, 1024, 33),
    ("float32", 8192, 1000, 50),
    ("float32", 65536, 256, 64),
    ("float32", 4096, 512, 40),
    ("float32", 64, 1024, 64),
    ("float32", 1, 1000, 50),
    ("bfloat16", 8192, 1024, 64),
    ("bfloat16", 65536, 256, 64),
    ("bfloat16", 4, 1000, 50),
    ("float16", 8192, 1024, 64),
    ("float32", 8192, 1024, 64, False),  # unsorted: column order, no ranking
    ("bfloat16", 8192, 1024, 64, False),
]
UP_TO_32 = [  # (dtype, rows, n, k): rounds (the default) against digits forced
    ("float32", 65536, 256, 8),
    ("float32", 4096, 256, 8),
    ("float32", 8192, 1024, 16),
    ("float32", 8192, 1024, 32),
    ("bfloat16", 65536, 256, 32),
]

# `--set rules`: the row counts where k past 32 starts to pay (the route before wins on few rows),
# and 16-bit rows at k <= 32, where digits take two passes against float32's four.
RULE_SHAPES = [
    *(
        (dtype, rows, n, k)
        for dtype, n, k in (
            ("float32", 1024, 64),
            ("bfloat16", 1024, 64),
            ("float32", 256, 64),
            ("float16", 512, 40),
        )
        for rows in (128, 256, 512, 1024, 2048)
    ),
    ("bfloat16", 65536, 256, 16),
    ("bfloat16", 65536, 256, 24),
    ("float16", 65536, 256, 32),
    ("bfloat16", 8192, 1024, 32),
    ("bfloat16", 8192, 512, 24),
]


def before_route(dtype, k, sorted_):
    """top_k's call as its route sent it before: topk_filtered's primitive (float32) or
    topk_bf16's (16-bit), with values."""
    op = "topk_filtered" if dtype == "float32" else "topk_bf16"

    def call(x, lengths):
        indices, values = bind_rows(op, x, lengths, k=k, sorted=sorted_, with_values=True)
        return values, indices

    return jax.jit(call)


def timed(fn, sets, digits=False):
    if digits:
        os.environ["JAX_TOPK_SMALL_ROWS"] = "digits"
    try:
        out = [np.asarray(a) for a in fn(*sets[0])]
        return out, device_time_us(fn, sets, 8)
    finally:
        os.environ.pop("JAX_TOPK_SMALL_ROWS", None)


def inputs(dtype, rows, n):
    lengths = jnp.full((rows,), n, jnp.int32)
    return [
        (scores_of.normal(jax.random.key(rows + n + i), (rows, n), dtype), lengths)
        for i in range(3)
    ]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--set", choices=("main", "rules", "ranking"), default="main")
    shapes = {
        "main": PAST_32 + UP_TO_32,
        "rules": RULE_SHAPES,
        "ranking": [s for s in PAST_32 if s[1:4] == (8192, 1024, 64)],
    }[parser.parse_args().set]
    lines = []
    for dtype, rows, n, k, *order in shapes:
        sorted_ = order[0] if order else True
        sets = inputs(dtype, rows, n)
        top_k = jax.jit(lambda x, lens, k=k, o=sorted_: jax_topk.top_k(x, k, sorted=o))
        reference, ours = timed(top_k, sets)
        if k > 32:
            other, other_us = timed(before_route(dtype, k, sorted_), sets)
            label = "route before"
        else:
            other, other_us = timed(top_k, sets, digits=True)
            label = "digits forced"
        same = all(np.array_equal(a, b) for a, b in zip(other, reference))
        lax = jax.jit(lambda x, lens, k=k: jax.lax.top_k(x, k))
        lax_values = np.asarray(lax(*sets[0])[0])
        raw = np.uint32 if dtype == "float32" else np.uint16
        if sorted_:
            same &= bool(np.array_equal(lax_values.view(raw), reference[0].view(raw)))
        lax_us = device_time_us(lax, sets, 8)
        shape = f"{dtype} [{rows}, {n}] k={k}{'' if sorted_ else ' unsorted'}"
        lines.append(
            f"| {shape} | {ours:.1f} | {label} {other_us:.1f} "
            f"| {other_us / ours:.2f} | {lax_us:.1f} | {same} |"
        )
        print(lines[-1], flush=True)
    print("\n| shape | top_k now | other | other / now | lax.top_k | same |")
    print("| --- | --- | --- | --- | --- | --- |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
