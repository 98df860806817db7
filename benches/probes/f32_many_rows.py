"""Many rows of at most 16384 columns (benches/NOTES.md "topk_f32_rows: many rows"): the register
kernel's 256-thread block (four an SM; rows of <= 8192 columns, float32 or 16-bit widened)
against its 1024-thread block and the kernels that serve the rows without it (the filtered kernel,
topk_bf16), with jax.lax.top_k and torch.topk on the same data. One process: the kernel is picked
at each launch by JAX_TOPK_F32_ROWS (off: not the register kernel; wide: the 1024-thread block
forced (float32 only); many: the 256-thread block forced where the row fits; default: the
rule). Device time in us (benches/bench.py's method); every variant's indices and values checked
equal to the default's, and top_k's values to lax.top_k's. From the repo root on the GPU:
    python -m benches.probes.f32_many_rows [--set rules]"""

import argparse
import os

import jax
import jax.numpy as jnp
import numpy as np

import jax_topk
from benches import scores as scores_of
from benches.bench import device_time_us, torch_topk_us

SHAPES = [  # (op, dtype, rows, n, k, sorted)
    ("top_k", "float32", 8192, 1024, 64, True),
    ("top_k", "float32", 4096, 2048, 16, True),
    ("top_k", "float32", 16384, 4096, 16, True),
    ("top_k", "float32", 4096, 8192, 64, True),
    ("top_k", "float32", 1024, 4096, 64, True),
    ("top_k", "float32", 8192, 2000, 100, True),
    ("top_k", "float32", 528, 8192, 256, True),
    ("top_k", "float32", 264, 4096, 64, True),
    ("top_k", "float32", 132, 8192, 64, True),
    ("top_k", "float32", 200, 8192, 64, True),
    ("top_k", "float32", 2048, 16384, 64, True),
    ("top_k", "float32", 2048, 16384, 256, True),
    ("top_k", "float32", 1024, 12000, 50, True),
    ("top_k", "float32", 200, 16384, 64, True),
    ("topk_filtered", "float32", 4096, 4096, 512, False),
    ("topk_filtered", "float32", 4096, 4096, 512, True),
    ("topk_filtered", "float32", 2048, 8192, 2048, False),
    ("topk_filtered", "float32", 2048, 8192, 2048, True),
    ("topk_filtered", "float32", 200, 4096, 512, True),
    ("topk_filtered", "float32", 528, 8192, 1024, True),
    ("topk_filtered", "float32", 132, 4096, 512, False),
    ("topk_filtered", "float32", 200, 4096, 512, False),
    ("topk_filtered", "float32", 264, 16384, 2048, False),
    ("topk_filtered", "float32", 32, 8192, 512, False),
    ("top_k", "float32", 64, 16384, 256, True),
    # 16-bit rows: "off" and "wide" are topk_bf16 (top_k) or the filtered kernel, "many" the
    # 256-thread block reading two bytes an element.
    ("top_k", "bfloat16", 8192, 1024, 64, True),
    ("top_k", "bfloat16", 4096, 2048, 16, True),
    ("top_k", "bfloat16", 16384, 4096, 16, True),
    ("top_k", "bfloat16", 4096, 8192, 64, True),
    ("top_k", "float16", 8192, 1024, 64, True),
    ("top_k", "float16", 4096, 2048, 16, True),
    ("top_k", "float16", 16384, 4096, 16, True),
    ("top_k", "float16", 4096, 8192, 64, True),
    ("top_k", "bfloat16", 264, 4096, 64, True),
    ("top_k", "bfloat16", 1024, 8192, 512, True),
    ("top_k", "bfloat16", 200, 8192, 64, True),
    ("topk_bf16", "bfloat16", 2048, 8192, 2048, False),
    ("topk_filtered", "bfloat16", 2048, 8192, 2048, False),
]
# `--set rules`: rows around the rule's row counts (kF32RowsManyMinRows for float32,
# kF32RowsNarrowMinRows, and TopkF32RowsBeatsTopkBf16 for top_k's 16-bit rows).
RULE_SHAPES = [
    *(("top_k", "float32", rows, 4096, 64, True) for rows in (48, 96, 132)),
    *(("top_k", "float32", rows, 2048, 64, True) for rows in (48, 96, 132)),
    ("topk_filtered", "float32", 96, 4096, 512, False),
    *(
        ("top_k", dtype, rows, n, 64, True)
        for dtype in ("bfloat16", "float16")
        for rows, n in ((512, 1024), (1024, 1024), (512, 4096), (1024, 4096))
    ),
]
VARIANTS = {"off": "off", "wide": "wide", "many": "many", "default": None}


def call(op, k, sorted_):
    if op == "top_k":
        return jax.jit(lambda x, lens: jax_topk.top_k(x, k, sorted=sorted_))
    operator = getattr(jax_topk, op)
    return jax.jit(lambda x, lens: (operator(x, lens, k=k, sorted=sorted_),))


def with_mode(mode, fn, *args):
    if mode is None:
        os.environ.pop("JAX_TOPK_F32_ROWS", None)
    else:
        os.environ["JAX_TOPK_F32_ROWS"] = mode
    try:
        return fn(*args)
    finally:
        os.environ.pop("JAX_TOPK_F32_ROWS", None)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--set", choices=("main", "rules"), default="main")
    shapes = SHAPES if parser.parse_args().set == "main" else RULE_SHAPES
    lines = []
    header = "| shape | " + " | ".join(VARIANTS) + " | lax.top_k | torch.topk | same |"
    for op, dtype, rows, n, k, sorted_ in shapes:
        sets = [
            (
                scores_of.normal(jax.random.key(rows + n + i), (rows, n), dtype),
                jnp.full((rows,), n, jnp.int32),
            )
            for i in range(3)
        ]
        fn = call(op, k, sorted_)
        reference = [np.asarray(a) for a in with_mode(None, fn, *sets[0])]
        same = True
        times = []
        for mode in VARIANTS.values():
            got = [np.asarray(a) for a in with_mode(mode, fn, *sets[0])]
            same &= all(np.array_equal(g, r) for g, r in zip(got, reference))
            times.append(with_mode(mode, device_time_us, fn, sets, 8))
        lax_us = torch_us = "-"
        if op == "top_k":
            lax = jax.jit(lambda x, lens, k=k: jax.lax.top_k(x, k))
            lax_values = np.asarray(lax(*sets[0])[0])
            raw = np.uint32 if dtype == "float32" else np.uint16
            same &= bool(np.array_equal(lax_values.view(raw), reference[0].view(raw)))
            lax_us = f"{device_time_us(lax, sets, 8):.1f}"
            torch_result = torch_topk_us([s[0] for s in sets], k, 8)
            torch_us = f"{torch_result[0]:.1f}" if torch_result else "-"
        label = f"{op} {dtype} [{rows}, {n}] k={k}{' sorted' if sorted_ else ''}"
        cells = " | ".join(f"{t:.1f}" for t in times)
        lines.append(f"| {label} | {cells} | {lax_us} | {torch_us} | {same} |")
        print(lines[-1], flush=True)
    print("\n" + header)
    print("|" + " --- |" * (len(VARIANTS) + 4))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
