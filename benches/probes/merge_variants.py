"""merge_topk's register-kernel variants at issue 14's shape (benches/probes/merge_rows.py's
inputs). A variant is NAME[@STOP][,la=L][,nocopy][,sorted|,unsorted]:
NAME is JAX_TOPK_MERGE_VARIANT (read at each launch; a fresh jit a variant): `old` (the radix
select from the registers), `sampled` (the sampled cutoff, ranked by 11-bit buckets), `staged`
(that and the next row staged in shared memory by bulk copies), `fine-unstaged` (the sampled
cutoff ranked by fine buckets), `fine` (that and the staged row; unsorted winners placed twice),
`flag` (fine, unsorted winners flagged and placed once), `default` (unset).
The rest needs a probe build (-DJAX_TOPK_MERGE_PROBE=1): @STOP ends each row's sampled path at
phase STOP (merge_in_registers.cuh: 1 load, 2 cutoff, 3 filter, 4 fine placing) to time the
phases; la=L pulls L rows ahead into L2 (JAX_TOPK_MERGE_LOOKAHEAD); nocopy works on each
block's first row over and over (no copies: the work alone). Such outputs are not the merge:
only the others are checked bit for bit against the CPU handler on the first input set.
`sorted` / `unsorted` time one order only. A table comes last.
Run on the GPU from the repo root: python -m benches.probes.merge_variants [VARIANT ...];
`--env VARIANT` prints the variant's environment (for the tests) and exits."""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jax_topk
from benches.bench import copy_bandwidth_tbps, device_time_us
from benches.probes.merge_rows import ROWS, SHARDS, K, candidate_sets


def variant_env(spec):
    """(environment, orders, is the merge) of a variant spec."""
    head, *switches = spec.split(",")
    name, _, stop = head.partition("@")
    env = {
        "JAX_TOPK_MERGE_PROBE_STOP": stop or "0",
        "JAX_TOPK_MERGE_LOOKAHEAD": "",
        "JAX_TOPK_MERGE_PROBE_NO_COPY": "0",
    }
    if name != "default":
        env["JAX_TOPK_MERGE_VARIANT"] = name
    orders = (True, False)
    for switch in switches:
        if switch.startswith("la="):
            env["JAX_TOPK_MERGE_LOOKAHEAD"] = switch[3:]
        elif switch == "nocopy":
            env["JAX_TOPK_MERGE_PROBE_NO_COPY"] = "1"
        elif switch in ("sorted", "unsorted"):
            orders = (switch == "sorted",)
        else:
            raise SystemExit(f"unknown switch {switch!r} in {spec!r}")
    is_merge = not stop and env["JAX_TOPK_MERGE_PROBE_NO_COPY"] == "0"
    return env, orders, is_merge


def use_env(env):
    os.environ.pop("JAX_TOPK_MERGE_VARIANT", None)
    os.environ.update(env)


def merge_on(device, inputs, sorted_):
    call = jax.jit(lambda v, i: jax_topk.merge_topk(v, i, K, sorted=sorted_))
    return [np.asarray(o) for o in call(*jax.device_put(inputs, device))]


def same_bits(got, want):
    return all(
        np.array_equal(a.view(f"u{a.itemsize}"), b.view(f"u{b.itemsize}"))
        for a, b in zip(got, want)
    )


def main():
    if sys.argv[1:2] == ["--env"]:
        env, _, _ = variant_env(sys.argv[2])
        print(" ".join(f"{name}={value}" for name, value in env.items()))
        return
    variants = sys.argv[1:] or ["old", "staged", "fine"]
    gpu, cpu = jax.devices("gpu")[0], jax.devices("cpu")[0]
    tbps = copy_bandwidth_tbps()
    print(f"copy bandwidth {tbps:.2f} TB/s", flush=True)
    table = []
    for dtype in (jnp.float32, jnp.bfloat16):
        sets = candidate_sets(4, dtype, "full")
        floor_us = ROWS * SHARDS * K * (jnp.dtype(dtype).itemsize + 4) / (tbps * 1e6)
        for sorted_ in (True, False):
            want = None
            for variant in variants:
                env, orders, is_merge = variant_env(variant)
                if sorted_ not in orders:
                    continue
                use_env(env)
                exact = "-"
                if is_merge:
                    if want is None:
                        want = merge_on(cpu, sets[0], sorted_)
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
