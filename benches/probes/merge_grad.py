"""merge_topk's gradient: where its winners sit among the candidates, found by the sort of
every candidate (`_fallback.merge_places`, the JVP rule before the twentieth session) or
from the merge's own winners (`_fallback.winner_places`: one pass over the candidates and a
sort of the k winners), each beside the forward merge and inside jax.grad through
merge_topk. Issue 14's shape (5536 rows of 8 x 2048 float32 candidates, lists in no order)
and fewer rows, both output orders. Device time, the benchmark's method (wall time on a
CPU); the places checked equal first.
Run from the repo root (GPU or CPU): python -m benches.probes.merge_grad"""

import collections

import jax
import jax.numpy as jnp
import numpy as np

import jax_topk
from benches import merge
from benches.bench import Shape, device_time_us, traced_kernel_events, wall_time_us
from jax_topk import _fallback

SHARDS, K = 8, 2048


def kernel_breakdown(fn, inputs, calls: int = 4, top: int = 8) -> list[tuple[str, float]]:
    """The `top` kernels of one call of fn by their summed device time (us a call)."""
    totals = collections.Counter()
    for events in traced_kernel_events(fn, [inputs], calls, with_names=True).values():
        for _, duration_ns, name in events:
            totals[name[:60]] += duration_ns / 1e3 / calls
    return totals.most_common(top)


def main():
    on_gpu = jax.default_backend() == "gpu"
    print("| rows | output | forward | merge_places | forward + winner_places | grad |")
    print("| --- | --- | --- | --- | --- | --- |")
    for rows in (5536, 256) if on_gpu else (64,):
        shape = Shape("merge_topk", "float32", rows, SHARDS * K, K, "full")
        sets = merge.make_inputs(shape, 2, seed=0)
        weights = jnp.ones((rows, K), jnp.float32)
        for sorted_ in (True, False):
            forward = jax.jit(lambda v, i, s=sorted_: jax_topk.merge_topk(v, i, K, sorted=s))
            by_sort = jax.jit(
                lambda v, i, s=sorted_: _fallback.merge_places(
                    v, i, k=K, sorted=s, earlier_first=True
                )
            )
            by_winners = jax.jit(
                lambda v, i, s=sorted_, f=forward: _fallback.winner_places(v, i, *f(v, i), sorted=s)
            )
            grad = jax.jit(
                jax.grad(
                    lambda v, i, s=sorted_: jnp.sum(
                        weights * jax_topk.merge_topk(v, i, K, sorted=s)[0]
                    )
                )
            )
            for values, indices in sets:
                np.testing.assert_array_equal(by_sort(values, indices), by_winners(values, indices))
            fns = (forward, by_sort, by_winners, grad)
            if on_gpu:
                times = [device_time_us(fn, sets, 6) for fn in fns]
            else:  # no device trace: wall time (CPU sorts, not the GPU's)
                times = [wall_time_us(fn, sets, 3) for fn in fns]
            order = "rank" if sorted_ else "columns"
            print(f"| {rows} | {order} | " + " | ".join(f"{t:.1f}" for t in times) + " |")
            if on_gpu and rows == 5536 and sorted_:
                breakdown = kernel_breakdown(grad, sets[0])
    if on_gpu:
        print("\nThe gradient's kernels at 5536 rows, rank order (us a call):")
        for name, us in breakdown:
            print(f"- {us:9.1f}  {name}")


if __name__ == "__main__":
    main()
