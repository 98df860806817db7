"""Run in its own process by tests/test_sharding.py (`python -m tests.checks.indexer_sharding`),
with 8 host devices: the lightning indexer with its query rows (and sequences, under vmap)
sharded equals the unsharded call, num_valid_rows included, and the compiled HLO never
all-gathers q (the keys, given replicated, stay so)."""

import os

# The device count is fixed when JAX starts: set it before jax is imported.
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jax_topk  # noqa: E402
from tests.support.indexer import make_inputs  # noqa: E402
from tests.support.operators import permuted_page_table  # noqa: E402

INT32_MIN, INT32_MAX = np.iinfo(np.int32).min, np.iinfo(np.int32).max


def assert_no_gather(fn, args):
    hlo = fn.lower(*args).compile().as_text()
    gathered = [line for line in hlo.splitlines() if "all-gather(" in line]
    assert not gathered, "the partitioned call gathered:\n" + "\n".join(gathered)


def main():
    assert len(jax.devices()) == 8, jax.devices()
    rng = np.random.default_rng(31)
    queries, heads, head_dim, n, k, page_size = 32, 2, 16, 700, 16, 8
    q, keys, weights = make_inputs(rng, queries, heads, head_dim, n, family="repeated_keys")
    lengths = rng.integers(-5, n + 5, size=queries).astype(np.int32)
    table = permuted_page_table(rng, queries, n // page_size + 1)
    checks = 0
    for axis_type in (jax.sharding.AxisType.Auto, jax.sharding.AxisType.Explicit):
        mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(axis_type,) * 2)

        def put(x, spec):
            return jax.device_put(x, NamedSharding(mesh, spec))

        for row_axes in ("data", ("data", "model")):
            fn = jax.jit(
                lambda a, b, c, d, t, v: jax_topk.indexer_topk(
                    a, b, c, d, k=k, page_table=t, page_size=page_size, num_valid_rows=v
                )
            )
            sharded = (
                put(q, P(row_axes, None, None)),
                put(keys, P()),
                put(weights, P(row_axes, None)),
                put(lengths, P(row_axes)),
                put(table, P(row_axes, None)),
            )
            plain = (q, keys, weights, lengths, table)
            for valid in (0, 5, 13, 32, 40, -1, INT32_MIN, INT32_MAX):
                got = fn(*sharded, np.int32(valid))
                np.testing.assert_array_equal(
                    np.asarray(got), np.asarray(fn(*plain, np.int32(valid)))
                )
                assert got.sharding.spec[0] is not None, got.sharding
                checks += 1
            assert_no_gather(fn, (*sharded, np.int32(7)))
            # A shared page table with table_rows.
            shared = permuted_page_table(rng, 3, n // page_size + 1)
            table_rows = rng.integers(-2, 5, size=queries).astype(np.int32)
            fn = jax.jit(
                lambda a, b, c, d, t, tr: jax_topk.indexer_topk(
                    a, b, c, d, k=k, page_table=t, page_size=page_size, table_rows=tr
                )
            )
            args = (*sharded[:4], shared, put(table_rows, P(row_axes)))
            got = fn(*args)
            np.testing.assert_array_equal(
                np.asarray(got), np.asarray(fn(*plain[:4], shared, table_rows))
            )
            assert_no_gather(fn, args)
            checks += 1
            logits = jax.jit(jax_topk.indexer_logits)
            got = logits(*sharded[:4])
            np.testing.assert_array_equal(np.asarray(got), np.asarray(logits(*plain[:4])))
            assert_no_gather(logits, sharded[:4])
            checks += 1

        # vmap over 4 sequences of 8 queries: sequences over "data", queries over "model",
        # so one sequence's limit serves rows on two devices.
        fn = jax.jit(
            jax.vmap(lambda a, b, c, d, v: jax_topk.indexer_topk(a, b, c, d, k=k, num_valid_rows=v))
        )
        batched = (
            q.reshape(4, 8, heads, head_dim),
            np.stack([keys] * 4),
            weights.reshape(4, 8, heads),
            lengths.reshape(4, 8),
        )
        sharded = (
            put(batched[0], P("data", "model", None, None)),
            put(batched[1], P("data", None, None)),
            put(batched[2], P("data", "model", None)),
            put(batched[3], P("data", "model")),
        )
        for valid in ((3, 8, 0, 5), (-4, 40, 1, 7), (INT32_MIN, INT32_MAX, 4, 9)):
            valid = np.array(valid, np.int32)
            got = fn(*sharded, put(valid, P("data")))
            np.testing.assert_array_equal(np.asarray(got), np.asarray(fn(*batched, valid)))
            checks += 1
        assert_no_gather(fn, (*sharded, put(np.array([3, 8, 0, 5], np.int32), P("data"))))
    print(f"indexer sharding: {checks} sharded calls equal the unsharded ones, no all-gather")


if __name__ == "__main__":
    main()
