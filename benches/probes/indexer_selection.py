"""Where issue 15's selection goes at the indexer's few-row shapes: topk_filtered of float32 rows
(128 x 65536 and 32 x 131072, k = 2048, full lengths) timed split (the default plan) and with a
block a row (JAX_TOPK_FILTERED_SPLIT=off, read at each launch), then stamped once each way
(JAX_TOPK_FILTERED_PROBE=2: the kernel's last block prints its phases and the SM clock; a split
launch's means are per part, its "claim" the cluster's exchange and rank search, or the merge
into part 0). Last, the selection stamped inside indexer_topk at 128 x 65536, right after the
logits kernel, and alone on the same logits: whether the op's slower selection ran at a lower
SM clock. Indexer_topk at 128 x 65536 must select in <= 21.4 us inside the op (benches/NOTES.md
"Where indexer_topk's time goes").
Run on the GPU from the repo root of a probe build (CMake option JAX_TOPK_FILTERED_PROBE):
python -m benches.probes.indexer_selection"""

import ctypes
import os
import tempfile

# Command buffers off: every call's launch reads the plan and probe switches again.
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_gpu_enable_command_buffer="

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jax_topk  # noqa: E402
from benches import indexer  # noqa: E402
from benches import scores as scores_of  # noqa: E402
from benches.bench import Shape, device_time_us  # noqa: E402

LIBC = ctypes.CDLL(None)  # the kernel's printf goes through C stdio: flushed before Python prints
SHAPES = ((128, 65536), (32, 131072))
PLANS = {"split (default)": None, "a block a row": "off"}
STAMPS = 2  # ProbeFlag kProbeStamps


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
            set_plan(split, STAMPS)
            print(f"stamps float32 {rows} x {n} [{name}]:", flush=True)
            jax.block_until_ready(fn(*inputs))
            LIBC.fflush(None)
    stamp_inside_the_op()  # leaves the plan and probe flags at their defaults


def stamp_inside_the_op():
    """The split selection stamped inside indexer_topk at 128 x 65536 (each call's logits, 32 MB,
    written just before it) and alone on logits of the same shape (four sets in turn, 128 MB: not
    held in L2 between calls), 30 calls queued back to back each (a stream of steps, whose clock
    a lone call may not see); the last call's lines are printed."""
    shape = Shape("indexer_topk", "bfloat16", 128, 65536, 2048, "causal", heads=64, head_dim=128)
    sets = indexer.make_inputs(shape, 4, seed=0)
    logits_fn = jax.jit(lambda q, k, w, lens, s: jax_topk.indexer_logits(q, k, w, lens))
    topk_fn = jax.jit(lambda q, k, w, lens, s: jax_topk.indexer_topk(q, k, w, lens, k=2048))
    select_fn = jax.jit(lambda logits, lens: jax_topk.topk_filtered(logits, lens, k=2048))
    set_plan(None)
    logits_sets = [(logits_fn(*inputs), inputs[3]) for inputs in sets]
    for name, fn, input_sets in (
        ("inside indexer_topk", topk_fn, sets),
        ("alone on logits", select_fn, logits_sets),
    ):
        jax.block_until_ready(fn(*input_sets[0]))  # compiled before the stamps
        set_plan(None, STAMPS)
        with tempfile.TemporaryFile("w+") as printed:
            saved = os.dup(1)
            os.dup2(printed.fileno(), 1)  # the kernel's printf, one pair of lines a call
            try:
                outs = [fn(*input_sets[i % len(input_sets)]) for i in range(30)]
                jax.block_until_ready(outs)
                LIBC.fflush(None)
            finally:
                os.dup2(saved, 1)
                os.close(saved)
            printed.seek(0)
            lines = [line for line in printed.read().splitlines() if line.startswith("probe")]
        set_plan(None)
        calls = len(lines) // 2
        print(f"stamps indexer 128 x 65536 selection [{name}], the last of {calls} calls:")
        print("\n".join(lines[-2:]), flush=True)


if __name__ == "__main__":
    main()
