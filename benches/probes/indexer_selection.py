"""Where issue 15's selection goes at the indexer's few-row shapes: topk_filtered of float32 rows
(128 x 65536 and 32 x 131072, k = 2048, full lengths) timed split (the default plan) and with a
block a row (JAX_TOPK_FILTERED_SPLIT=off, read at each launch), then stamped once each way
(JAX_TOPK_FILTERED_PROBE=2: the kernel's last block prints its phases; a split launch's means
are per part, its "claim" the cluster's exchange and rank search, or the merge into part 0).
Indexer_topk at 128 x 65536 must select in <= 21.4 us inside the op (benches/NOTES.md "Where
indexer_topk's time goes").
Run on the GPU from the repo root of a probe build (CMake option JAX_TOPK_FILTERED_PROBE):
python -m benches.probes.indexer_selection"""

import ctypes
import os

# Command buffers off: every call's launch reads the plan and probe switches again.
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_gpu_enable_command_buffer="

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jax_topk  # noqa: E402
from benches import scores as scores_of  # noqa: E402
from benches.bench import device_time_us  # noqa: E402

LIBC = ctypes.CDLL(None)  # the kernel's printf goes through C stdio: flushed before Python prints
SHAPES = ((128, 65536), (32, 131072))
PLANS = {"split (default)": None, "a block a row": "off"}


def set_plan(split, probe=0):
    """The launch's plan (split None: the default) and probe flags; the caller's own settings of
    the two variables are not kept (a probe's run)."""
    os.environ["JAX_TOPK_FILTERED_PROBE"] = str(probe)
    os.environ.pop("JAX_TOPK_FILTERED_SPLIT", None)
    if split is not None:
        os.environ["JAX_TOPK_FILTERED_SPLIT"] = split


def main():
    print("| rows x n | plan | device time (us) |")
    print("| --- | --- | --- |")
    stamped = []
    for rows, n in SHAPES:
        lengths = jnp.full((rows,), n, jnp.int32)
        sets = [
            (scores_of.normal(jax.random.key(i), (rows, n), jnp.float32), lengths)
            for i in range(16)
        ]
        fn = jax.jit(lambda s, lens: jax_topk.topk_filtered(s, lens, k=2048))
        for name, split in PLANS.items():
            set_plan(split)
            print(f"| {rows} x {n} | {name} | {device_time_us(fn, sets, 8):.1f} |", flush=True)
        stamped.append((rows, n, fn, sets[0]))
    for rows, n, fn, inputs in stamped:
        for name, split in PLANS.items():
            set_plan(split, probe=2)
            print(f"stamps float32 {rows} x {n} [{name}]:", flush=True)
            jax.block_until_ready(fn(*inputs))
            LIBC.fflush(None)
    set_plan(None)


if __name__ == "__main__":
    main()
