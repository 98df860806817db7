"""Run in its own process by tests/test_sharding.py (`python -m tests.checks.sharding`), with 8
host devices: row-sharded calls equal
the unsharded ones and the compiled HLO never all-gathers the scores."""

import os

# The device count is fixed when JAX starts: set it before jax is imported.
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P

from tests.support.operators import OPS, SCORE_DTYPES, make_scores, permuted_page_table  # noqa: E402

INT32_MIN, INT32_MAX = np.iinfo(np.int32).min, np.iinfo(np.int32).max
VALID_ROWS = (0, 5, 13, 31, 32, 40, -1, INT32_MIN, INT32_MIN + 3, INT32_MAX)


def assert_no_gather_of_scores(fn, args, dtype):
    hlo = fn.lower(*args).compile().as_text()
    gathered = [
        line
        for line in hlo.splitlines()
        if "all-gather(" in line and f"{dtype}[" in line.split("all-gather(")[0]
    ]
    assert not gathered, "the partitioned call gathered the scores:\n" + "\n".join(gathered)


def main():
    assert len(jax.devices()) == 8, jax.devices()
    rng = np.random.default_rng(30)
    rows, n, k, page_size = 32, 1000, 16, 8
    checks = 0
    for axis_type in (jax.sharding.AxisType.Auto, jax.sharding.AxisType.Explicit):
        mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(axis_type,) * 2)

        def put(x, spec):
            return jax.device_put(x, NamedSharding(mesh, spec))

        for op in OPS:
            hlo_dtype = "bf16" if SCORE_DTYPES[op] == "bfloat16" else "f32"
            scores = make_scores(op, rng, (rows, n), "heavy_ties")
            lengths = rng.integers(-5, n + 5, size=rows).astype(np.int32)
            table = permuted_page_table(rng, rows, n // page_size + 1)
            shared_table = permuted_page_table(rng, 3, n // page_size + 1)
            table_rows = rng.integers(-2, 5, size=rows).astype(np.int32)
            for row_axes in ("data", ("data", "model")):
                # One group of rows, a per-row page table, a traced num_valid_rows.
                fn = jax.jit(
                    lambda s, lens, t, v, op=op: OPS[op](
                        s, lens, k=k, page_table=t, page_size=page_size, num_valid_rows=v
                    )
                )
                sharded = (
                    put(scores, P(row_axes, None)),
                    put(lengths, P(row_axes)),
                    put(table, P(row_axes, None)),
                )
                for valid in VALID_ROWS:
                    got = fn(*sharded, np.int32(valid))
                    want = fn(scores, lengths, table, np.int32(valid))
                    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
                    assert got.sharding.spec[0] is not None, got.sharding
                    checks += 1
                assert_no_gather_of_scores(fn, (*sharded, np.int32(7)), hlo_dtype)

                # A shared page table with table_rows.
                fn = jax.jit(
                    lambda s, lens, t, tr, op=op: OPS[op](
                        s, lens, k=k, page_table=t, page_size=page_size, table_rows=tr
                    )
                )
                sharded = (
                    put(scores, P(row_axes, None)),
                    put(lengths, P(row_axes)),
                    shared_table,
                    put(table_rows, P(row_axes)),
                )
                got = fn(*sharded)
                np.testing.assert_array_equal(
                    np.asarray(got), np.asarray(fn(scores, lengths, shared_table, table_rows))
                )
                assert_no_gather_of_scores(fn, sharded, hlo_dtype)
                checks += 1

            # vmap over 4 calls of 8 rows: calls over "data", each call's rows over "model",
            # so one call's limit serves rows on two devices.
            fn = jax.jit(
                jax.vmap(lambda s, lens, v, op=op: OPS[op](s, lens, k=k, num_valid_rows=v))
            )
            batched = (scores.reshape(4, 8, n), lengths.reshape(4, 8))
            sharded = (
                put(batched[0], P("data", "model", None)),
                put(batched[1], P("data", "model")),
            )
            for valid in ((3, 8, 0, 5), (-4, 40, 1, 7), (INT32_MIN, INT32_MAX, 4, 9)):
                valid = np.array(valid, np.int32)
                got = fn(*sharded, put(valid, P("data")))
                np.testing.assert_array_equal(np.asarray(got), np.asarray(fn(*batched, valid)))
                checks += 1
            assert_no_gather_of_scores(
                fn, (*sharded, put(np.array([3, 8, 0, 5], np.int32), P("data"))), hlo_dtype
            )
            if axis_type == jax.sharding.AxisType.Explicit:
                continue  # the layout below cannot be folded into rows without a regather
            # Rows of one call split over all 8 devices with the calls unsplit: still equal
            # (vmap folds calls into rows, so XLA regathers this layout first).
            sharded = (
                put(batched[0], P(None, ("data", "model"), None)),
                put(batched[1], P(None, ("data", "model"))),
            )
            valid = np.array((2, 7, INT32_MIN, 6), np.int32)
            np.testing.assert_array_equal(
                np.asarray(fn(*sharded, valid)), np.asarray(fn(*batched, valid))
            )
            checks += 1
    print(f"sharding: {checks} sharded calls equal the unsharded ones, no all-gather of scores")


if __name__ == "__main__":
    main()
