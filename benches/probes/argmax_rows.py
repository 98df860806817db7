"""top_k at k = 1: topk_argmax (a block a row, one read) forced on every call
(JAX_TOPK_ARGMAX=always), off (=off: the filtered, cluster, register or short-row kernel as
before), and the default rule (TopkArgmaxServes), against jax.lax.top_k and the read floor, on
the same inputs in one process; each mode's values and indices equal to the default's
(benches/NOTES.md "top_k off the grid"). Run on the GPU from the repo root:
python -m benches.probes.argmax_rows"""

import os

import jax
import numpy as np

import jax_topk
from benches import scores as scores_of
from benches.bench import copy_bandwidth_tbps, device_time_us

SHAPES = [  # (dtype, rows, n)
    ("float32", 16384, 4096),
    ("float32", 4096, 8192),
    ("float32", 2048, 32768),
    ("float32", 1024, 50257),
    ("float32", 264, 152064),
    ("float32", 256, 152064),
    ("float32", 128, 152064),
    ("float32", 64, 152064),
    ("float32", 8, 152064),
    ("float32", 1, 152064),
    ("float32", 32, 131072),
    ("float32", 1, 32768),
    ("float32", 1, 4096),
    ("bfloat16", 16384, 4096),
    ("bfloat16", 256, 152064),
    ("bfloat16", 64, 152064),
    ("bfloat16", 1, 152064),
]
MODES = ("default", "always", "off")


def set_mode(mode):
    if mode == "default":
        os.environ.pop("JAX_TOPK_ARGMAX", None)
    else:
        os.environ["JAX_TOPK_ARGMAX"] = mode


def main():
    tbps = copy_bandwidth_tbps()
    print(f"copy bandwidth {tbps:.2f} TB/s (read + write)")
    lines = []
    for dtype, rows, n in SHAPES:
        sets = [
            (scores_of.normal(jax.random.key(rows + n + i), (rows, n), dtype),) for i in range(4)
        ]
        ours = jax.jit(lambda x: jax_topk.top_k(x, 1))
        lax = jax.jit(lambda x: jax.lax.top_k(x, 1))
        times, results = {}, {}
        for mode in MODES:
            set_mode(mode)
            results[mode] = [np.asarray(o) for o in ours(*sets[0])]
            times[mode] = device_time_us(ours, sets, 10)
        set_mode("default")
        same = all(
            np.array_equal(a.view(f"u{a.itemsize}"), b.view(f"u{b.itemsize}"))
            for mode in MODES
            for a, b in zip(results[mode], results["default"], strict=True)
        )
        lax_us = device_time_us(lax, sets, 10)
        floor = rows * n * np.dtype(sets[0][0].dtype).itemsize / (tbps * 1e12) * 1e6
        lines.append(
            f"| {dtype} [{rows}, {n}] | {times['default']:.1f} | {times['always']:.1f} | "
            f"{times['off']:.1f} | {lax_us:.1f} | {floor:.1f} | {same} |"
        )
        print(lines[-1], flush=True)
    print(
        "\n| top_k k = 1 | default (us) | argmax always | argmax off | lax.top_k | read floor"
        " | equal |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
