"""One call for Nsight Compute (benches/probes/filtered_ncu.sh): the case named on the command
line is compiled, run once to warm, then once more (the profiled launch). The filtered kernel:
bf16_causal_top_k (5536 x 131072, k = 2048, values, sorted), f32_causal (topk_filtered unsorted,
same shape), bf16_vocab (top_k [256, 152064], k = 50). Others (the .sh's KERNEL names theirs):
bf16_rows (topk_bf16 2048 x 16384, k = 512, pages of 64: TopkBf16Kernel), moe_f32 (top_k
[65536, 256] f32, k = 8: TopkSmallRowsKernel), merge_f32_lists and merge_f32_ranked
(merge_topk of 5536 rows of 8 x 2048 float32 candidates, lists in no order or in rank order:
MergeInRegistersKernel). Run from the repo root on the GPU:
python -m benches.probes.filtered_ncu CASE"""

import sys

import jax
import jax.numpy as jnp
import numpy as np

import jax_topk
from benches import scores as scores_of


def case(name):
    if name == "bf16_vocab":
        x = scores_of.normal(jax.random.key(0), (256, 152064), jnp.bfloat16)
        return jax.jit(lambda s: jax_topk.top_k(s, 50)), (x,)
    if name == "moe_f32":
        x = scores_of.normal(jax.random.key(0), (65536, 256), jnp.float32)
        return jax.jit(lambda s: jax_topk.top_k(s, 8)), (x,)
    if name == "bf16_rows":
        rows, n, page = 2048, 16384, 64
        x = scores_of.normal(jax.random.key(0), (rows, n), jnp.bfloat16)
        lengths = jnp.full((rows,), n, jnp.int32)
        table = jnp.arange(rows * (n // page), dtype=jnp.int32).reshape(rows, n // page)
        call = jax.jit(
            lambda s, lens, t: jax_topk.topk_bf16(s, lens, k=512, page_table=t, page_size=page)
        )
        return call, (x, lengths, table)
    if name in ("merge_f32_lists", "merge_f32_ranked"):  # merge_topk, 5536 x 8 x 2048
        from benches import merge
        from benches.bench import Shape

        lists = "sorted" if name == "merge_f32_ranked" else "full"
        shape = Shape("merge_topk", "float32", 5536, 8 * 2048, 2048, lists)
        (values, columns) = merge.make_inputs(shape, 1, 0)[0]
        return jax.jit(lambda v, c: jax_topk.merge_topk(v, c, 2048)), (values, columns)
    rows, n = 5536, 131072
    lengths = jnp.asarray(n - (rows - 1 - np.arange(rows)), jnp.int32)
    if name == "bf16_causal_top_k":
        x = scores_of.normal(jax.random.key(0), (rows, n), jnp.bfloat16)
        return jax.jit(lambda s, lens: jax_topk.top_k(s, 2048, lengths=lens)), (x, lengths)
    if name == "f32_causal":
        x = scores_of.normal(jax.random.key(0), (rows, n), jnp.float32)
        return jax.jit(lambda s, lens: jax_topk.topk_filtered(s, lens, k=2048)), (x, lengths)
    raise SystemExit(f"unknown case {name!r}")


def main():
    fn, args = case(sys.argv[1])
    jax.block_until_ready(fn(*args))
    jax.block_until_ready(fn(*args))


if __name__ == "__main__":
    main()
