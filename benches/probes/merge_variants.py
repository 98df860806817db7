"""merge_topk's register-kernel variants at issue 14's shape (benches/probes/merge_rows.py's
inputs), chosen by JAX_TOPK_MERGE_VARIANT (read at each launch; a fresh jit a variant): `old`
(the radix select from the registers), `sampled` (the sampled cutoff, ranked by 11-bit
buckets), `staged` (that and the next row staged in shared memory by bulk copies),
`fine-unstaged` (the sampled cutoff ranked by fine buckets), `fine` (that and the staged row),
`default` (unset: fine). VARIANT@N (a probe build, -DJAX_TOPK_MERGE_PROBE=1) ends each row's
sampled path at phase N (merge_in_registers.cuh: 1 load, 2 cutoff, 3 filter, 4 fine placing)
to time the phases; its output is not the merge. Each variant's result on the first input set
is checked bit for bit against the CPU handler; a table comes last.
Run on the GPU from the repo root: python -m benches.probes.merge_variants [VARIANT ...]"""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jax_topk
from benches.bench import copy_bandwidth_tbps, device_time_us
from benches.probes.merge_rows import ROWS, SHARDS, K, candidate_sets


def merge_on(device, inputs, sorted_):
    call = jax.jit(lambda v, i: jax_topk.merge_topk(v, i, K, sorted=sorted_))
    return [np.asarray(o) for o in call(*jax.device_put(inputs, device))]


def same_bits(got, want):
    return all(
        np.array_equal(a.view(f"u{a.itemsize}"), b.view(f"u{b.itemsize}"))
        for a, b in zip(got, want)
    )


def main():
    variants = sys.argv[1:] or ["old", "staged", "fine"]
    gpu, cpu = jax.devices("gpu")[0], jax.devices("cpu")[0]
    tbps = copy_bandwidth_tbps()
    print(f"copy bandwidth {tbps:.2f} TB/s", flush=True)
    table = []
    for dtype in (jnp.float32, jnp.bfloat16):
        sets = candidate_sets(4, dtype)
        floor_us = ROWS * SHARDS * K * (jnp.dtype(dtype).itemsize + 4) / (tbps * 1e6)
        for sorted_ in (True, False):
            want = merge_on(cpu, sets[0], sorted_)
            for variant in variants:
                name, _, stop = variant.partition("@")
                os.environ["JAX_TOPK_MERGE_PROBE_STOP"] = stop or "0"
                if name == "default":
                    os.environ.pop("JAX_TOPK_MERGE_VARIANT", None)
                else:
                    os.environ["JAX_TOPK_MERGE_VARIANT"] = name
                exact = same_bits(merge_on(gpu, sets[0], sorted_), want)
                fn = jax.jit(lambda v, i, o=sorted_: jax_topk.merge_topk(v, i, K, sorted=o))
                t = device_time_us(fn, sets, 8)
                row = (variant, jnp.dtype(dtype).name, sorted_, t, floor_us, exact)
                print(row, flush=True)
                table.append(row)
        del sets
    print("\n| variant | dtype | sorted | us | floor us | x floor | exact vs CPU |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for variant, dtype, sorted_, t, floor_us, exact in table:
        print(
            f"| {variant} | {dtype} | {sorted_} | {t:.1f} | {floor_us:.1f} | "
            f"{t / floor_us:.2f} | {exact} |"
        )


if __name__ == "__main__":
    main()
