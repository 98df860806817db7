"""indexer_logits without lengths: device time and kernels a call without lengths (no lengths
array since branch indexer-no-lengths), with an [M] fill of N built inside jit (what a call
without lengths did before), and given lengths of N as an input; at the decode shapes
(H = 64, D = 128, bf16) and one prefill chunk; bits checked equal first.
Run from the repo root on a GPU: python -m benches.probes.indexer_no_lengths"""

import jax
import jax.numpy as jnp
import numpy as np

import jax_topk
from benches.bench import median_call_us, traced_kernel_events

HEADS, HEAD_DIM = 64, 128


def main():
    print("| M x N | without lengths | a fill inside jit | lengths given |")
    print("| --- | --- | --- | --- |")
    rng = np.random.default_rng(0)
    for queries, keys_count in ((1, 131072), (32, 131072), (128, 65536)):
        q = jnp.asarray(rng.standard_normal((queries, HEADS, HEAD_DIM)), jnp.bfloat16)
        keys = jnp.asarray(rng.standard_normal((keys_count, HEAD_DIM)), jnp.bfloat16)
        weights = jnp.asarray(rng.standard_normal((queries, HEADS)), jnp.float32)
        whole = jnp.full((queries,), keys_count, jnp.int32)
        without = jax.jit(lambda a, b, c, d: jax_topk.indexer_logits(a, b, c))
        filled = jax.jit(
            lambda a, b, c, d: jax_topk.indexer_logits(
                a, b, c, jnp.full((a.shape[0],), b.shape[0], jnp.int32)
            )
        )
        given = jax.jit(jax_topk.indexer_logits)
        fns = (without, filled, given)
        sets = [(q, keys, weights, whole)]
        want = np.asarray(given(*sets[0])).view(np.uint32)
        cells = []
        for fn in fns:
            np.testing.assert_array_equal(np.asarray(fn(*sets[0])).view(np.uint32), want)
            calls = 20
            events = traced_kernel_events(fn, sets, calls)
            events = sorted(e for device in events.values() for e in device)
            cells.append(f"{median_call_us(events, calls):.1f} us, {len(events) // calls} kernels")
        print(f"| {queries} x {keys_count} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
