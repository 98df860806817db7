"""indexer_topk's fused CUDA path against the unfused one (JAX_TOPK_INDEXER_TOPK, read at each
dispatch) and indexer_logits alone, in one process on one build: device time (the kernels of a
call summed, benches/bench.py's method), the latency of a call (wall time, launch gaps included),
each fused call's kernels, and whether the fused indices equal the unfused ones bit for bit.
H = 64, D = 128, k = 2048, causal lengths, the shapes of issue 15 (benches/NOTES.md, "fused
indexer"). Usage: python3 -m benches.probes.indexer_fused [--json PATH] [--shapes 32x131072,...]
"""

from __future__ import annotations

import argparse
import json
import os

import jax
import numpy as np

from benches import indexer
from benches.bench import Shape, traced_kernel_events, wall_time_us
from jax_topk import indexer_logits, indexer_topk

SHAPES = ["1x131072", "32x131072", "128x65536", "512x65536"]
# (name, JAX_TOPK_INDEXER_TOPK, JAX_TOPK_INDEXER_SAMPLE_STRIDE)
MODES = (
    ("unfused", "unfused", "32"),
    ("fused", "fused", "32"),
    ("fused64", "fused", "64"),
    ("default", "", "32"),
)
CALLS = 20


def per_call_kernels(fn, inputs) -> list[float]:
    """Median duration (us) of each kernel of one call, in launch order."""
    events = sorted(e for ev in traced_kernel_events(fn, inputs, CALLS).values() for e in ev)
    per_call = len(events) // CALLS
    if per_call == 0 or len(events) % CALLS:
        return [sum(d for _, d in events) / CALLS / 1e3]
    durations = np.array([d for _, d in events], np.float64).reshape(CALLS, per_call)
    return list(np.median(durations, axis=0) / 1e3)


def topk_call(k: int):
    # A fresh function for each mode: its own executable (and command buffer), captured with
    # the mode's dispatch.
    return jax.jit(
        lambda q, keys, weights, lengths, scales: indexer_topk(
            q, keys, weights, lengths, k=k, key_scales=scales
        )
    )


def bench(shape: Shape) -> dict:
    inputs = indexer.make_inputs(shape, 3, seed=shape.rows * 7 + shape.n)
    logits = jax.jit(
        lambda q, keys, weights, lengths, scales: indexer_logits(
            q, keys, weights, lengths, key_scales=scales
        )
    )
    record = {"shape": f"{shape.dtype} {shape.rows}x{shape.n}"}
    record["logits_us"] = float(sum(per_call_kernels(logits, inputs)))
    results = {}
    for mode, path, stride in MODES:
        os.environ["JAX_TOPK_INDEXER_TOPK"] = path
        os.environ["JAX_TOPK_INDEXER_SAMPLE_STRIDE"] = stride
        call = topk_call(shape.k)
        results[mode] = [np.asarray(call(*inputs_set)) for inputs_set in inputs]
        kernels = per_call_kernels(call, inputs)
        record[f"{mode}_us"] = float(sum(kernels))
        record[f"{mode}_kernels_us"] = [round(float(t), 2) for t in kernels]
        record[f"{mode}_wall_us"] = wall_time_us(call, inputs, 10)
    os.environ.pop("JAX_TOPK_INDEXER_TOPK")
    os.environ.pop("JAX_TOPK_INDEXER_SAMPLE_STRIDE")
    record["fused_equals_unfused"] = all(
        np.array_equal(a, b) and np.array_equal(c, b)
        for a, b, c in zip(results["fused"], results["unfused"], results["fused64"])
    )
    return record


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    records = []
    for text in args.shapes.split(","):
        rows, n = (int(x) for x in text.split("x"))
        shape = Shape("indexer_topk", args.dtype, rows, n, 2048, "causal", heads=64, head_dim=128)
        records.append(bench(shape))
        print(json.dumps(records[-1]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)
    print(
        f"{'shape':>22} {'logits':>8} {'unfused':>8} {'fused':>8} {'fused64':>8} {'default':>8} "
        f"{'wall unf':>9} {'wall fus':>9} {'wall f64':>9} exact"
    )
    for r in records:
        print(
            f"{r['shape']:>22} {r['logits_us']:8.1f} {r['unfused_us']:8.1f} {r['fused_us']:8.1f} "
            f"{r['fused64_us']:8.1f} {r['default_us']:8.1f} {r['unfused_wall_us']:9.1f} "
            f"{r['fused_wall_us']:9.1f} {r['fused64_wall_us']:9.1f} {r['fused_equals_unfused']}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
