"""Many float32 rows of at most 16384 columns (benches/NOTES.md "topk_f32_rows: many rows"): the
register kernel's 256-thread block (four an SM; rows of <= 8192 columns) against its 1024-thread
block and the filtered kernel, with jax.lax.top_k and torch.topk on the same data. One process:
the kernel is picked at each launch by JAX_TOPK_F32_ROWS (off: the filtered kernel; wide: the
1024-thread block forced; many: the 256-thread block forced where the row fits; default: the
rule). Device time in us (benches/bench.py's method); every variant's indices and values checked
equal to the default's, and top_k's values to lax.top_k's. From the repo root on the GPU:
    python -m benches.probes.f32_many_rows"""

import os

import jax
import jax.numpy as jnp
import numpy as np

import jax_topk
from benches import scores as scores_of
from benches.bench import device_time_us, torch_topk_us

SHAPES = [  # (op, rows, n, k, sorted)
    ("top_k", 8192, 1024, 64, True),
    ("top_k", 4096, 2048, 16, True),
    ("top_k", 16384, 4096, 16, True),
    ("top_k", 4096, 8192, 64, True),
    ("top_k", 1024, 4096, 64, True),
    ("top_k", 8192, 2000, 100, True),
    ("top_k", 528, 8192, 256, True),
    ("top_k", 264, 4096, 64, True),
    ("top_k", 132, 8192, 64, True),
    ("top_k", 200, 8192, 64, True),
    ("top_k", 2048, 16384, 64, True),
    ("top_k", 2048, 16384, 256, True),
    ("top_k", 1024, 12000, 50, True),
    ("top_k", 200, 16384, 64, True),
    ("topk_filtered", 4096, 4096, 512, False),
    ("topk_filtered", 4096, 4096, 512, True),
    ("topk_filtered", 2048, 8192, 2048, False),
    ("topk_filtered", 2048, 8192, 2048, True),
    ("topk_filtered", 200, 4096, 512, True),
    ("topk_filtered", 528, 8192, 1024, True),
    ("topk_filtered", 132, 4096, 512, False),
    ("topk_filtered", 200, 4096, 512, False),
    ("topk_filtered", 264, 16384, 2048, False),
    ("topk_filtered", 32, 8192, 512, False),
    ("top_k", 64, 16384, 256, True),
]
VARIANTS = {"filtered": "off", "wide": "wide", "many": "many", "default": None}


def call(op, k, sorted_):
    if op == "top_k":
        return jax.jit(lambda x, lens: jax_topk.top_k(x, k, sorted=sorted_))
    return jax.jit(lambda x, lens: (jax_topk.topk_filtered(x, lens, k=k, sorted=sorted_),))


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
    lines = []
    header = "| shape | " + " | ".join(VARIANTS) + " | lax.top_k | torch.topk | same |"
    for op, rows, n, k, sorted_ in SHAPES:
        sets = [
            (
                scores_of.normal(jax.random.key(rows + n + i), (rows, n), "float32"),
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
            same &= bool(np.array_equal(lax_values.view(np.uint32), reference[0].view(np.uint32)))
            lax_us = f"{device_time_us(lax, sets, 8):.1f}"
            torch_result = torch_topk_us([s[0] for s in sets], k, 8)
            torch_us = f"{torch_result[0]:.1f}" if torch_result else "-"
        label = f"{op} [{rows}, {n}] k={k}{' sorted' if sorted_ else ''}"
        cells = " | ".join(f"{t:.1f}" for t in times)
        lines.append(f"| {label} | {cells} | {lax_us} | {torch_us} | {same} |")
        print(lines[-1], flush=True)
    print("\n" + header)
    print("|" + " --- |" * (len(VARIANTS) + 5))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
