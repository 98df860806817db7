"""Run in its own process by tests/test_sharding.py (`python -m tests.checks.sharding`), with 8
host devices: row-sharded calls equal
the unsharded ones and the compiled HLO never all-gathers the scores."""

import os
import re

# The device count is fixed when JAX starts: set it before jax is imported.
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P

import jax_topk  # noqa: E402
from tests.support import families  # noqa: E402
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


def assert_scores_stay(fn, args, local_scores: int):
    """No collective in the compiled HLO moves an array of at least one device's share of the
    scores (`local_scores` elements): only candidates and small operands may move."""
    moved = []
    for line in fn.lower(*args).compile().as_text().splitlines():
        for op in ("all-gather(", "all-to-all(", "collective-permute(", "all-reduce("):
            if op not in line:
                continue
            result = line.split(op)[0].split("=")[-1]
            dims = re.findall(r"\[([0-9,]*)\]", result)
            elements = max(
                (np.prod([int(d) for d in ds.split(",") if d]) for ds in dims), default=0
            )
            if elements >= local_scores:
                moved.append(line.strip()[:200])
    assert not moved, "the call moved the scores:\n" + "\n".join(moved)


def check_vmap_layouts(axis_type, rng) -> int:
    """vmap over every layout of calls, rows and columns (Explicit sharding folds them by device,
    moving no scores): topk_filtered with lengths and per-call num_valid_rows (extremes
    included), top_k without lengths, and vmap of vmap (several num_valid_rows groups a call),
    with lengths passed unmapped and unsharded, and no mesh set; each equals unsharded calls."""
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(axis_type,) * 2)
    n, k = 384, 8
    checks = 0
    layouts = [  # (calls, rows, the scores' spec)
        (8, 8, P("data", "model")),  # two calls a calls-shard: a call-major merge would move them
        (12, 8, P("data", "model")),
        (6, 4, P("model", "data")),
        (4, 8, P(None, None, "model")),  # columns split: they stay split
        (4, 8, P(None, "data", "model")),
        (8, 4, P(("data", "model"), None)),
        (2, 16, P(None, ("data", "model"))),
    ]
    for calls, rows, spec in layouts:
        scores = families.make("heavy_ties", rng, (calls, rows, n), "float32")
        lengths = rng.integers(-3, n + 3, size=(calls, rows)).astype(np.int32)
        valid = rng.choice([INT32_MIN, -1, 0, 1, rows // 2, rows, INT32_MAX], size=calls)
        valid = valid.astype(np.int32)
        placed = jax.device_put(scores, NamedSharding(mesh, spec))
        row_spec = P(*tuple(spec)[:2])
        placed_lengths = jax.device_put(lengths, NamedSharding(mesh, row_spec))
        filtered = jax.jit(
            jax.vmap(lambda s, lens, v: jax_topk.topk_filtered(s, lens, k=k, num_valid_rows=v))
        )
        call_spec = P(tuple(spec)[0]) if len(spec) else P()
        placed_valid = jax.device_put(valid, NamedSharding(mesh, call_spec))
        got = filtered(placed, placed_lengths, placed_valid)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(filtered(scores, lengths, valid)))
        # Lengths unmapped (one row of lengths for every call) and not placed on the mesh.
        shared = jax.jit(jax.vmap(lambda s, lens: jax_topk.topk_filtered(s, lens, k=k), (0, None)))
        np.testing.assert_array_equal(
            np.asarray(shared(placed, lengths[0])), np.asarray(shared(scores, lengths[0]))
        )
        values = jax.jit(jax.vmap(lambda s: jax_topk.top_k(s, k)))
        for got, want in zip(values(placed), values(scores)):
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        if axis_type == jax.sharding.AxisType.Explicit:
            local = scores.size // np.prod([mesh.shape[a] for a in jax.tree.leaves(tuple(spec))])
            assert_scores_stay(filtered, (placed, placed_lengths, placed_valid), local)
            assert_scores_stay(values, (placed,), local)
        checks += 3
        # vmap of vmap: the inner calls' num_valid_rows are groups of each outer call.
        call_parts = np.prod([mesh.shape[a] for a in jax.tree.leaves(tuple(call_spec))])
        if calls % (2 * call_parts) == 0:
            nested = jax.jit(
                jax.vmap(
                    jax.vmap(
                        lambda s, lens, v: jax_topk.topk_filtered(s, lens, k=k, num_valid_rows=v)
                    )
                )
            )
            inner = (2, calls // 2, rows)
            args = (
                scores.reshape(*inner, n),
                lengths.reshape(inner),
                valid.reshape(inner[:2]),
            )
            want = nested(*args)
            got = nested(
                jax.device_put(args[0], NamedSharding(mesh, P(None, *spec))),
                jax.device_put(args[1], NamedSharding(mesh, P(None, *row_spec))),
                jax.device_put(args[2], NamedSharding(mesh, P(None, *call_spec))),
            )
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
            checks += 1
    return checks


def check_vmap_with_values(axis_type, rng) -> int:
    """vmap of top_k (values, indices, and the gradient through the values) and of merge_topk
    over calls split over the mesh, or each call's rows split, or both: the kernels (k = 16)
    and the exact paths past the kernels' k (k = 2100: top_k's rounds take the kernels'
    results apart) equal unsharded calls."""
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(axis_type,) * 2)
    batched = families.make("normal", rng, (4, 8, 3000), "float32")
    columns = np.stack([rng.permutation(3000) for _ in range(32)]).astype(np.int32)
    columns = columns.reshape(4, 8, 3000)
    checks = 0
    for spec in (P("data", None, None), P(None, ("data", "model"), None), P("data", "model")):
        placed = jax.device_put(batched, NamedSharding(mesh, spec))
        placed_columns = jax.device_put(columns, NamedSharding(mesh, spec))
        for k in (16, 2100):
            fn = jax.jit(jax.vmap(lambda x, k=k: jax_topk.top_k(x, k)))
            for got, want in zip(fn(placed), fn(batched)):
                np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
            grad = jax.jit(jax.vmap(jax.grad(lambda x, k=k: jax_topk.top_k(x, k)[0].sum())))
            np.testing.assert_array_equal(np.asarray(grad(placed)), np.asarray(grad(batched)))
            merge = jax.jit(jax.vmap(lambda v, c, k=k: jax_topk.merge_topk(v, c, k)))
            for got, want in zip(merge(placed, placed_columns), merge(batched, columns)):
                np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
            checks += 3
    return checks


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
            # Rows of one call split over all 8 devices with the calls unsplit: still equal.
            # Auto: vmap folds calls into rows, so XLA regathers this layout first. Explicit:
            # the rows fold row-major (no regather), num_valid_rows become lengths of 0.
            all_axes = ("data", "model")
            sharded = (
                put(batched[0], P(None, all_axes, None)),
                put(batched[1], P(None, all_axes)),
            )
            for valid in ((2, 7, INT32_MIN, 6), (8, INT32_MAX, 0, 1)):
                valid = np.array(valid, np.int32)
                got = fn(*sharded, valid)
                np.testing.assert_array_equal(np.asarray(got), np.asarray(fn(*batched, valid)))
                checks += 1
            if axis_type == jax.sharding.AxisType.Explicit:
                assert tuple(got.sharding.spec)[:2] == (None, all_axes), got.sharding
                assert_no_gather_of_scores(fn, (*sharded, valid), hlo_dtype)
                # Per-call page tables with their own table_rows, scores rows split, the
                # lengths laid out otherwise (the calls split): folded in the scores' order.
                fn_tables = jax.jit(
                    jax.vmap(
                        lambda s, lens, t, tr, op=op: OPS[op](
                            s, lens, k=k, page_table=t, page_size=page_size, table_rows=tr
                        )
                    )
                )
                tables = np.stack([permuted_page_table(rng, 3, n // page_size + 1)] * 4)
                tables_rows = rng.integers(-2, 5, size=(4, 8)).astype(np.int32)
                args = (batched[0], batched[1], tables, tables_rows)
                placed = (
                    sharded[0],
                    put(batched[1], P(None, None)),
                    tables,
                    put(tables_rows, P(None, all_axes)),
                )
                np.testing.assert_array_equal(
                    np.asarray(fn_tables(*placed)), np.asarray(fn_tables(*args))
                )
                checks += 1
        checks += check_vmap_with_values(axis_type, rng)
        checks += check_vmap_layouts(axis_type, rng)
    print(f"sharding: {checks} sharded calls equal the unsharded ones, no all-gather of scores")


if __name__ == "__main__":
    main()
