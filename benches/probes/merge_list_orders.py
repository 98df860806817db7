"""merge_topk on lists in no order against lists in rank order (as top_k(sorted=False) and
top_k(sorted=True) return them) at list counts besides the bench's 8 x 2048, and on the few
lists of a running top-k or a 2- to 4-way split: the register kernel's rotated chunks
(merge_in_registers.cuh kRotation) should make the two orders cost the same wherever the row
fits it (m <= 16384), and the per-row time should not grow as rows get narrower. Device time
(the bench's method), float32 (MERGE_DTYPE), 5536 rows (MERGE_ROWS). Rows of m <= 8192 are
timed on the narrow instances (the default) and on the wide one (JAX_TOPK_MERGE_NARROW=off, a
fresh jit each). Run from the repo root on a GPU: python -m benches.probes.merge_list_orders"""

import os

import jax

from benches import merge
from benches.bench import Shape, device_time_us

ROWS = int(os.environ.get("MERGE_ROWS", "5536"))
DTYPE = os.environ.get("MERGE_DTYPE", "float32")
NARROW_WIDTH = 8192  # merge_in_registers.cuh kWidthOf<kMidChunks>
# (lists, each list's length, k): the bench's 8 x 2048, more and shorter lists, and the few
# lists of a running top-k ([running k, chunk's k]), a 2- or 4-way split or shard.
SHAPES = [
    (8, 2048, 2048),
    (16, 1024, 1024),
    (32, 512, 512),
    (4, 4096, 2048),
    (4, 2048, 2048),
    (3, 1999, 1500),
    (2, 2048, 2048),
    (2, 1024, 1024),
    (4, 1024, 512),
]


def timed(sets, k, narrow: str) -> float:
    """Device time of a fresh jit (compiled under the switch, read at each launch)."""
    before = os.environ.get("JAX_TOPK_MERGE_NARROW")
    os.environ["JAX_TOPK_MERGE_NARROW"] = narrow
    try:
        return device_time_us(jax.jit(merge.ours_call(k)), sets, 6)
    finally:
        if before is None:
            del os.environ["JAX_TOPK_MERGE_NARROW"]
        else:
            os.environ["JAX_TOPK_MERGE_NARROW"] = before


def main():
    print(f"merge_topk, {DTYPE}, {ROWS} rows, on {jax.devices()[0].device_kind}")
    print(
        "| lists x length | k | no order (us) | rank order (us) | rank / no "
        "| no order, wide instance | rank order, wide instance |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for lists, per_list, k in SHAPES:
        times, wide = [], []
        for order in ("full", "sorted"):
            shape = Shape(merge.OP, DTYPE, ROWS, lists * per_list, per_list, order)
            sets = merge.make_inputs(shape, 3, seed=lists)
            times.append(timed(sets, k, "on"))
            if lists * per_list <= NARROW_WIDTH:
                wide.append(f"{timed(sets, k, 'off'):.1f}")
        wide = wide or ["-", "-"]
        print(
            f"| {lists} x {per_list} | {k} | {times[0]:.1f} | {times[1]:.1f} | "
            f"{times[1] / times[0]:.2f} | {wide[0]} | {wide[1]} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
