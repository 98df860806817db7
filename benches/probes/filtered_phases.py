"""Old against new in one probe build of the filtered kernel (CMake option JAX_TOPK_FILTERED_PROBE,
kernels/filtered/probe.cuh): device time of topk_filtered (unsorted, sorted) and top_k under each
set of switches in the environment variable JAX_TOPK_FILTERED_PROBE (1: the previous 16-bit
filtering tile, 4: the previous radix-only selection of crowded bins and tie groups, 8: the relative
bins' first and last never settling the k-th key, 16: rank-order buckets without dense key ranks,
32: every queue pass prefetched as before PassReads, 64: crowded one-key bins of bitmap winners
block-ranked as before, 128: a row's primary pass, then no selection, its result empty, 256:
k <= 64 of a few kept candidates by the radix route;
benches/NOTES.md "bf16-queue" and "the queue pass's reads" timed more, since removed), with --stamps
the per-phase times of one call of each (2: the kernel's last block prints them), and with --routes
the route counts of the test families built for those paths (tests/support/families.py).
PHASES_VARIANTS and PHASES_STAMPED (comma-separated names of VARIANTS) choose the timed and stamped
variants, PHASES_DTYPES the rows' dtypes (timed and stamped). Command buffers are off so that every
call's launch reads the switches. Run on the GPU from the repo root of a probe build: python -m
benches.probes.filtered_phases [--stamps] [--routes]"""

import ctypes
import os
import sys

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_gpu_enable_command_buffer="

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jax_topk  # noqa: E402
from benches import scores as scores_of
from benches.bench import copy_bandwidth_tbps, device_time_us  # noqa: E402
from benches.probes.filtered_variants import floor_us  # noqa: E402

VARIANTS = {
    "new": 0,
    "old bin edges": 8,
    "old buckets": 16,
    # Every queue pass prefetched as before PassReads (layout.cuh): "the queue pass's reads".
    "old pass reads": 32,
    # A crowded one-key bin of bitmap winners block-ranked as before: "one-key bins marked".
    "old marks": 64,
    # A row's primary pass, then no selection (its result empty; a split launch's settled rows
    # still select): the streaming phases' rate ("The selecting phases at 8 warps, measured").
    # Not a result to check.
    "stream only": 128,
    # k <= 64 of a few kept candidates by the radix route, as before few_winners.cuh.
    "old few winners": 256,
}
LIBC = ctypes.CDLL(None)
STAMPED = tuple(os.environ.get("PHASES_STAMPED", "new").split(","))
TIMED = tuple(os.environ.get("PHASES_VARIANTS", "new,old bin edges,old buckets").split(","))


def set_variant(flags: int):
    os.environ["JAX_TOPK_FILTERED_PROBE"] = str(flags)


def indexer_case(rows, n, causal, dtype):
    lengths = (n - (rows - 1 - np.arange(rows))) if causal else np.full(rows, n)
    lengths = jnp.asarray(lengths, jnp.int32)
    sets = [
        (scores_of.normal(jax.random.key(i), (rows, n), dtype), lengths)
        for i in range(4 if rows > 1000 else 32)
    ]
    calls = {
        "unsorted": jax.jit(lambda s, lens: jax_topk.topk_filtered(s, lens, k=2048)),
        "sorted": jax.jit(lambda s, lens: jax_topk.topk_filtered(s, lens, k=2048, sorted=True)),
        "top_k": jax.jit(lambda s, lens: jax_topk.top_k(s, 2048, lengths=lens)),
    }
    return sets, calls, lengths


def stamps(dtype):
    sets, calls, _ = indexer_case(5536, 131072, True, dtype)
    for variant, flags in VARIANTS.items():
        if variant not in STAMPED:
            continue
        for name, fn in calls.items():
            set_variant(0)
            jax.block_until_ready(fn(*sets[0]))  # compiled, warm
            set_variant(flags | 2)
            print(f"stamps {jnp.dtype(dtype).name} 5536x131072 {name} [{variant}]:", flush=True)
            jax.block_until_ready(fn(*sets[1]))
            LIBC.fflush(None)
    set_variant(0)


def routes():
    """Route counts (the probe's stamps line) of the families built for the new paths, queue
    rows (300) and split rows (4 or 6), so that a test's reach is seen, not assumed."""
    from tests.support import families

    rng = np.random.default_rng(7)
    for dtype in ("float32", "bfloat16", "float16"):
        for make, n, sorted_ in (
            (families.kth_key_at_the_cutoff, 65536, False),
            (families.kth_key_at_the_cutoff, 65536, True),  # GatherOneKeyBin's rows
            (families.few_keys_over_a_span, 131072, True),
        ):
            for rows in (300, 6):
                scores = jnp.asarray(make(rng, rows, n, 2048, dtype))
                lengths = jnp.full((rows,), n, jnp.int32)
                fn = jax.jit(
                    lambda s, lens, o=sorted_: jax_topk.topk_filtered(s, lens, k=2048, sorted=o)
                )
                set_variant(0)
                jax.block_until_ready(fn(scores, lengths))
                set_variant(2)
                print(f"routes {make.__name__} {dtype} {rows}x{n} sorted={sorted_}:", flush=True)
                jax.block_until_ready(fn(scores, lengths))
                LIBC.fflush(None)
    set_variant(0)


def stamps_vocab(dtype, rows=256, n=152064, k=50):
    """The phases of top_k over [256, 152064] (a block a row, one wave: no queue)."""
    fn = jax.jit(lambda x: jax_topk.top_k(x, k))
    sets = [(scores_of.normal(jax.random.key(i), (rows, n), dtype),) for i in range(2)]
    jax.block_until_ready(fn(*sets[0]))
    for variant in STAMPED:
        set_variant(VARIANTS[variant] | 2)
        print(f"stamps {jnp.dtype(dtype).name} [{rows}, {n}] top_k k={k} [{variant}]:", flush=True)
        jax.block_until_ready(fn(*sets[1]))
        LIBC.fflush(None)
    set_variant(0)


def timed(label, dtype, sets, calls, floor, variants):
    for variant in variants:
        set_variant(VARIANTS[variant])
        times = [device_time_us(fn, sets, 6) for fn in calls.values()]
        print(
            f"| {label} | {jnp.dtype(dtype).name} | {variant} | "
            + " | ".join(f"{t:.1f}" for t in times)
            + f" | {floor:.1f} | {times[-1] / floor:.2f} |",
            flush=True,
        )
    set_variant(0)


def wanted(dtype) -> bool:
    """Whether PHASES_DTYPES (e.g. "bfloat16,float16"; unset: every dtype) names `dtype`."""
    names = os.environ.get("PHASES_DTYPES")
    return not names or jnp.dtype(dtype).name in names.split(",")


def main():
    tbps = copy_bandwidth_tbps()
    print(f"copy bandwidth {tbps:.2f} TB/s (read + write)")
    if "--routes" in sys.argv:
        routes()
    if "--stamps" in sys.argv:
        for dtype in filter(wanted, (jnp.bfloat16, jnp.float16, jnp.float32)):
            stamps(dtype)
        for dtype in filter(wanted, (jnp.bfloat16, jnp.float32)):
            stamps_vocab(dtype)
    print(
        "| shape | dtype | variant | topk_filtered unsorted | sorted | top_k (values, sorted)"
        " | floor | top_k / floor |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    every = list(TIMED)
    baseline = ["new"] + [v for v in ("old pass reads", "old marks") if v in TIMED]
    indexer = [  # the most wanted rows first: a time limit cuts the tail
        ("5536x131072 causal", 5536, 131072, True, jnp.bfloat16, every),
        ("5536x131072 causal", 5536, 131072, True, jnp.float32, every),
        ("1536x196608 causal", 1536, 196608, True, jnp.float32, every),
        ("5536x131072 causal", 5536, 131072, True, jnp.float16, baseline),
        ("32x131072", 32, 131072, False, jnp.bfloat16, baseline),
    ]
    vocab = [(256, 152064, 50, jnp.bfloat16, every), (256, 152064, 50, jnp.float32, every)]
    if "old few winners" in TIMED:  # few_winners.cuh's other rows: split rows, other k
        vocab += [
            (rows, 152064, k, dtype, every)
            for rows, k in ((64, 50), (8, 50), (256, 8), (256, 64))
            for dtype in (jnp.bfloat16, jnp.float32)
        ]
    later = [("32x131072", 32, 131072, False, jnp.float32, ["new"])]
    indexer = [row for row in indexer if wanted(row[4])]
    vocab = [row for row in vocab if wanted(row[3])]
    later = [row for row in later if wanted(row[4])]
    for label, rows, n, causal, dtype, variants in indexer:
        sets, calls, lengths = indexer_case(rows, n, causal, dtype)
        timed(label, dtype, sets, calls, floor_us(lengths, dtype, tbps), variants)
        del sets
    for rows, n, k, dtype, variants in vocab:
        sets = [
            (scores_of.normal(jax.random.key(i), (rows, n), dtype),)
            for i in range(max(4, 300_000_000 // (rows * n * 4)))
        ]
        calls = {"top_k": jax.jit(lambda x: jax_topk.top_k(x, k))}
        floor = floor_us(np.full(rows, n), dtype, tbps)
        timed(f"[{rows}, {n}] k={k} top_k only", dtype, sets, calls, floor, variants)
        del sets
    for label, rows, n, causal, dtype, variants in later:
        sets, calls, lengths = indexer_case(rows, n, causal, dtype)
        timed(label, dtype, sets, calls, floor_us(lengths, dtype, tbps), variants)
        del sets


if __name__ == "__main__":
    main()
