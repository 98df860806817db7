"""Run in its own process by tests/test_sharding.py (`python -m tests.checks.shard_map_merge`),
with 8 host devices: context parallelism written by hand inside `jax.shard_map`, as a user who
splits the keys themselves writes it (docs/contract.md section 8). Each device takes top_k of
its own columns (its lengths clamped to its range, its columns made global), then the
candidates either travel in one all_gather and merge once, or go round a ring (ppermute) with
a merge_topk at every step; both equal top_k of the whole rows bit for bit, over rows split
too (a 2 x 4 mesh) and adversarial rows. jax.grad through the all_gather form equals the
unsharded gradient."""

import os

# The device count is fixed when JAX starts: set it before jax is imported.
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jax_topk  # noqa: E402
from tests.checks.column_sharding import ROWS, N, adversarial_rows, boundary_lengths  # noqa: E402
from tests.support.bits import assert_same_bits  # noqa: E402

SHARDS = 4  # the "keys" axis of the 2 x 4 mesh: 250 columns a device
LOCAL_N = N // SHARDS


def local_candidates(scores, lengths, k):
    """This device's top k among its own columns: global columns, -1 / -inf where it has
    fewer than k candidates."""
    first = jax.lax.axis_index("keys") * LOCAL_N
    # Clamped before the subtraction: lengths - first would wrap for lengths near INT32_MIN.
    local_lengths = jnp.clip(lengths, first, first + LOCAL_N) - first
    values, columns = jax_topk.top_k(scores, k, lengths=local_lengths)
    return values, jnp.where(columns >= 0, columns + first, -1)


def gathered_then_merged(k):
    def body(scores, lengths):
        values, columns = local_candidates(scores, lengths, k)
        values = jax.lax.all_gather(values, "keys", axis=1, tiled=True)
        columns = jax.lax.all_gather(columns, "keys", axis=1, tiled=True)
        return jax_topk.merge_topk(values, columns, k)

    return body


def merged_round_a_ring(k):
    """Each step passes the candidates one device on and merges what arrived into the
    running top k: after SHARDS - 1 steps every device has merged every device's."""

    def body(scores, lengths):
        values, columns = local_candidates(scores, lengths, k)
        running = (values, columns)
        passing = (values, columns)
        ring = [(d, (d + 1) % SHARDS) for d in range(SHARDS)]
        for _ in range(SHARDS - 1):
            passing = tuple(jax.lax.ppermute(x, "keys", ring) for x in passing)
            running = jax_topk.merge_topk(
                jnp.concatenate([running[0], passing[0]], axis=1),
                jnp.concatenate([running[1], passing[1]], axis=1),
                k,
            )
        return running

    return body


def in_shard_map(body, mesh):
    return jax.jit(
        jax.shard_map(
            body,
            mesh=mesh,
            in_specs=(P("rows", "keys"), P("rows")),
            out_specs=P("rows", None),
            check_vma=False,  # the merged result is the same on every device of "keys"
        )
    )


def main():
    assert len(jax.devices()) == 8, jax.devices()
    rng = np.random.default_rng(37)
    mesh = jax.make_mesh((2, SHARDS), ("rows", "keys"))
    lengths = boundary_lengths(rng)
    put_lengths = jax.device_put(lengths, NamedSharding(mesh, P("rows")))
    checks = 0
    for dtype in ("float32", "bfloat16", "float16"):
        for index, scores in enumerate(adversarial_rows(rng, dtype)):
            put = jax.device_put(scores, NamedSharding(mesh, P("rows", "keys")))
            for k in (1, 40, LOCAL_N):  # LOCAL_N: every column of a shard is a candidate
                want = jax_topk.top_k(scores, k, lengths=lengths)
                for form in (gathered_then_merged, merged_round_a_ring):
                    got = in_shard_map(form(k), mesh)(put, put_lengths)
                    for g, w in zip(got, want):
                        assert_same_bits(g, w, f"{form.__name__} {dtype} rows {index} k={k}")
                    checks += 1
    weights = rng.standard_normal((ROWS, 40)).astype(np.float32)
    scores = adversarial_rows(rng, "float32")[0]

    def loss_by_hand(x):
        values, _ = jax.shard_map(
            gathered_then_merged(40),
            mesh=mesh,
            in_specs=(P("rows", "keys"), P("rows")),
            out_specs=P("rows", None),
            check_vma=False,
        )(x, put_lengths)
        return jnp.sum(weights * values)

    got = jax.jit(jax.grad(loss_by_hand))(
        jax.device_put(scores, NamedSharding(mesh, P("rows", "keys")))
    )
    want = jax.grad(lambda x: jnp.sum(weights * jax_topk.top_k(x, 40, lengths=lengths)[0]))(scores)
    assert_same_bits(got, want, "grad through the shard_map merge")
    assert np.count_nonzero(np.asarray(got)), "the gradient reached no score"
    checks += 1
    print(f"shard_map merge: {checks} hand-written context-parallel calls equal top_k")


if __name__ == "__main__":
    main()
