"""Run in its own process by tests/test_sharding.py (`python -m tests.checks.column_sharding`),
with 8 host devices: every operator with the scores' columns sharded over 2, 4 and 8 devices,
and rows x columns on 2 x 4, equals the unsharded call bit for bit over adversarial rows,
and the compiled HLO moves only the candidates between devices, never the scores. With
JAX_TOPK_COLUMN_MERGE=tree in the environment the same checks cover the tree of pairwise
merges (collective-permutes in place of the all-gather)."""

import os
import re

# The device count is fixed when JAX starts: set it before jax is imported.
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jax_topk  # noqa: E402
from jax_topk import _sharding  # noqa: E402
from tests.support import families  # noqa: E402
from tests.support.bits import assert_same_bits  # noqa: E402
from tests.support.operators import OPS, SCORE_DTYPES, permuted_page_table  # noqa: E402

INT32_MIN, INT32_MAX = np.iinfo(np.int32).min, np.iinfo(np.int32).max
ROWS, N, PAGE_SIZE = 32, 1000, 8  # N / 8 = 125: every split below is even
# (mesh shape, axis names, the scores' spec); the last two split rows and columns at once.
LAYOUTS = [
    ((2,), ("model",), P(None, "model"), jax.sharding.AxisType.Explicit),
    ((4,), ("model",), P(None, "model"), jax.sharding.AxisType.Explicit),
    ((8,), ("model",), P(None, "model"), jax.sharding.AxisType.Auto),
    ((2, 4), ("data", "model"), P("data", "model"), jax.sharding.AxisType.Explicit),
    ((2, 4), ("data", "model"), P("data", "model"), jax.sharding.AxisType.Auto),
]
COLLECTIVES = ("all-gather", "all-to-all", "collective-permute")


def winners_on_one_shard(rng, shape, dtype):
    """Ties everywhere, and every row's best values inside one 125-column shard."""
    values = rng.integers(-2, 3, size=shape).astype(np.float32)
    for row, shard in enumerate(rng.integers(0, 8, size=shape[0])):
        values[row, shard * 125 : (shard + 1) * 125] += 8.0
    return values.astype(dtype)


def adversarial_rows(rng, dtype):
    """Rows of ties on every shard (heavy_ties, constant), winners on one shard, signed
    zeros, NaN and raw bit patterns."""
    named = ["heavy_ties", "constant", "signed_zeros", "nan_mix", "random_bits"]
    rows = [families.make(f, rng, (ROWS, N), dtype) for f in named]
    return [*rows, winners_on_one_shard(rng, (ROWS, N), np.dtype(dtype))]


def boundary_lengths(rng):
    """Lengths ending just before, at and just after each 125-column shard boundary (so
    some shards hold a few columns, fewer than k), and the extremes."""
    boundaries = np.arange(0, N + 1, 125)
    special = np.concatenate([boundaries - 1, boundaries, boundaries + 3])
    special = np.concatenate([special, [INT32_MIN, INT32_MAX, -5]])[:ROWS]
    lengths = rng.integers(0, N + 1, size=ROWS)
    lengths[: len(special)] = special
    return rng.permutation(lengths).astype(np.int32)


def assert_only_candidates_move(fn, args, local_n):
    """No collective in the compiled HLO has a shape with a dimension of n or the local n:
    only the [rows, devices * k] candidates cross devices. Returns the count of the
    collectives that carry them (all-gathers, or collective-permutes for the tree)."""
    hlo = fn.lower(*args).compile().as_text()
    moved = []
    for line in hlo.splitlines():
        op = next((c for c in COLLECTIVES if f" {c}(" in line or f" {c}-start(" in line), None)
        if op is None:
            continue
        result = line.split(f" {op}")[0]
        dims = {
            int(d) for shape in re.findall(r"\[([\d,]*)\]", result) for d in shape.split(",") if d
        }
        if dims & {N, local_n}:
            moved.append(line.strip()[:160])
    assert not moved, "the scores crossed devices:\n" + "\n".join(moved)
    carrier = " collective-permute" if _sharding.COLUMN_MERGE == "tree" else " all-gather"
    return sum(1 for line in hlo.splitlines() if carrier in line)


def check_layout(shape, names, spec, axis_type, rng):
    mesh = jax.make_mesh(shape, names, axis_types=(axis_type,) * len(names))
    row_axis = spec[0]
    local_n = N // mesh.shape["model"]

    def put(x, x_spec):
        return jax.device_put(x, NamedSharding(mesh, x_spec))

    checks = gathers = 0
    lengths = boundary_lengths(rng)
    sharded_lengths = put(lengths, P(row_axis))
    table = permuted_page_table(rng, ROWS, N // PAGE_SIZE + 1)
    shared_table = permuted_page_table(rng, 3, N // PAGE_SIZE + 1)
    table_rows = rng.integers(-2, 5, size=ROWS).astype(np.int32)
    for op in OPS:
        rows = adversarial_rows(rng, SCORE_DTYPES[op])
        # A per-row page table and a traced num_valid_rows, ascending columns.
        fn = jax.jit(
            lambda s, lens, t, v, op=op: OPS[op](
                s, lens, k=40, page_table=t, page_size=PAGE_SIZE, num_valid_rows=v
            )
        )
        sharded_table = put(table, P(row_axis, None))
        for index, scores in enumerate(rows):
            valid = (ROWS, 0, 13, 17, -1, INT32_MAX)[index]
            got = fn(put(scores, spec), sharded_lengths, sharded_table, np.int32(valid))
            want = fn(scores, lengths, table, np.int32(valid))
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want), f"{op} {index}")
            checks += 1
        args = (put(rows[0], spec), sharded_lengths, sharded_table, np.int32(5))
        gathers += assert_only_candidates_move(fn, args, local_n)
        # A shared page table with table_rows, rank order, k past the 125 columns of a
        # shard on 8 devices.
        fn = jax.jit(
            lambda s, lens, t, tr, op=op: OPS[op](
                s, lens, k=150, page_table=t, page_size=PAGE_SIZE, table_rows=tr, sorted=True
            )
        )
        for index, scores in enumerate(rows[:3]):
            got = fn(put(scores, spec), sharded_lengths, shared_table, put(table_rows, P(row_axis)))
            want = fn(scores, lengths, shared_table, table_rows)
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want), f"{op} {index}")
            checks += 1
    # top_k through each of its kernels: small rows (k = 16), the register kernel (16-bit,
    # k = 40), the filtered kernel (float32, k = 40); values too; with lengths and without
    # (no lengths operand at all: every shard's rows whole).
    for dtype, k in (("float32", 16), ("float32", 40), ("bfloat16", 40), ("float16", 40)):
        fn = jax.jit(lambda x, lens, k=k: jax_topk.top_k(x, k, lengths=lens))
        whole = jax.jit(lambda x, k=k: jax_topk.top_k(x, k))
        for index, operand in enumerate(adversarial_rows(rng, dtype)):
            got = fn(put(operand, spec), sharded_lengths)
            want = fn(operand, lengths)
            for g, w in zip(got, want):
                assert_same_bits(g, w, f"top_k {dtype} k={k} {index}")
            for g, w in zip(whole(put(operand, spec)), whole(operand)):
                assert_same_bits(g, w, f"top_k {dtype} k={k} {index} without lengths")
            checks += 1
        gathers += assert_only_candidates_move(fn, (put(operand, spec), sharded_lengths), local_n)
    assert gathers > 0, "no candidates were gathered: the columns were not split"
    return checks


def check_row_sharded_merge(rng):
    """merge_topk on candidates split by rows: each device merges its own rows."""
    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    rows = NamedSharding(mesh, P("data", None))
    values = families.make("heavy_ties", rng, (ROWS, 256), "float32")
    indices = np.stack([rng.permutation(N)[:256] for _ in range(ROWS)]).astype(np.int32)
    indices[:, ::5] = -1
    fn = jax.jit(lambda v, i: jax_topk.merge_topk(v, i, 40))
    sharded = (jax.device_put(values, rows), jax.device_put(indices, rows))
    got = fn(*sharded)
    for g, w in zip(got, fn(values, indices)):
        assert_same_bits(g, w, "row-sharded merge_topk")
    assert got[1].sharding.spec[0] == "data", got[1].sharding
    hlo = fn.lower(*sharded).compile().as_text()
    assert not [line for line in hlo.splitlines() if any(f" {c}" in line for c in COLLECTIVES)]
    return 1


def check_k_past_2048(shape, names, spec, axis_type, rng):
    """top_k and merge_topk past the kernels' k = 2048 on column-sharded rows: rounds
    (k = 2049) and the one-sort path (k = 6000, and integer rows at any k), values bit for
    bit (the sort path's gather of the values must not add the shards' float results: -0
    and subnormals would change). Under Explicit sharding the sort path gathers the columns
    first (lax.top_k and lax.sort refuse a sharded ranking axis there)."""
    mesh = jax.make_mesh(shape, names, axis_types=(axis_type,) * len(names))
    integers = rng.integers(-3, 4, size=(4, 8192)).astype(np.int32)
    cases = [
        (families.make(family, rng, (4, 8192), "float32"), k)
        for family in ("signed_zeros", "denormals", "random_bits")
        for k in (2049, 6000)
    ] + [(integers, 50), (integers.astype(np.int8), 3000)]
    with jax.enable_x64(True):  # float64 -0 beside +0: the gather of values keeps their bits
        cases.append((families.make("signed_zeros", rng, (4, 8192), "float64"), 3000))
    for operand, k in cases:
        with jax.enable_x64(operand.dtype == np.float64):
            fn = jax.jit(lambda x, k=k: jax_topk.top_k(x, k))
            got = fn(jax.device_put(operand, NamedSharding(mesh, spec)))
            want = fn(operand)
            for g, w in zip(got, want):
                assert_same_bits(g, w, f"top_k {operand.dtype} k={k}")
            # merge_topk's exact path (the same sort) over candidates sharded the same way.
            columns = np.broadcast_to(np.arange(operand.shape[1], dtype=np.int32), operand.shape)
            merge = jax.jit(lambda v, i, k=k: jax_topk.merge_topk(v, i, k))
            sharded = jax.device_put((operand, columns), NamedSharding(mesh, spec))
            for g, w in zip(merge(*sharded), merge(operand, columns)):
                assert_same_bits(g, w, f"merge_topk {operand.dtype} k={k}")
    return 2 * len(cases)


def check_gradient(shape, names, spec, axis_type, rng):
    """jax.grad through top_k's values on column-sharded rows (the kernels and the rounds): the
    same bits as unsharded. Under Explicit sharding the JVP's gather along the columns needs
    them whole first."""
    mesh = jax.make_mesh(shape, names, axis_types=(axis_type,) * len(names))
    checks = 0
    for dtype, k in (("float32", 8), ("bfloat16", 200), ("float32", 2100)):
        operand = families.make("normal", rng, (8, 8192), dtype)
        loss = jax.jit(jax.grad(lambda x, k=k: jax_topk.top_k(x, k)[0].astype("float32").sum()))
        got = loss(jax.device_put(operand, NamedSharding(mesh, spec)))
        assert_same_bits(got, loss(operand), f"grad {dtype} k={k}")
        checks += 1
    return checks


def check_merge_under_set_mesh(rng):
    """merge_topk (kernel and exact paths) and its gradient, and top_k (both paths), inside
    jax.set_mesh with Explicit axes, over rows, candidates or both split: the same bits as
    unsharded (lax.sort wants its operands sharded alike, the iotas included)."""
    mesh = jax.make_mesh((2, 4), ("x", "y"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)
    values = families.make("signed_zeros", rng, (8, 256), "float32")
    columns = np.stack([rng.permutation(N)[:256] for _ in range(8)]).astype(np.int32)
    columns[:, ::7] = -1
    weights = rng.standard_normal((8, 10)).astype(np.float32)
    checks = 0
    for operand, k in ((values, 10), (values, 256), ((values * 8).astype(np.int32), 10)):
        merge = jax.jit(lambda v, i, k=k: jax_topk.merge_topk(v, i, k))
        top_k = jax.jit(lambda x, k=k: jax_topk.top_k(x, k))
        want_merge, want_top_k = merge(operand, columns), top_k(operand)
        for spec in (P("x", None), P("x", "y"), P(("x", "y"), None), P(None, "y")):
            with jax.set_mesh(mesh):
                put = jax.device_put((operand, columns), NamedSharding(mesh, spec))
                for g, w in zip(merge(*put), want_merge):
                    assert_same_bits(g, w, f"merge_topk {operand.dtype} k={k} {spec}")
                checks += 1
                # The kernels' path too: before the partition bodies were traced without the
                # mesh, jax 0.12 failed to compile it with the columns split ("No registered
                # implementation for untyped custom call to Sharding").
                for g, w in zip(top_k(put[0]), want_top_k):
                    assert_same_bits(g, w, f"top_k {operand.dtype} k={k} {spec}")
                checks += 1
                if operand.dtype == np.float32 and k == 10:
                    loss = jax.jit(
                        jax.grad(lambda v, i: (weights * jax_topk.merge_topk(v, i, 10)[0]).sum())
                    )
                    assert_same_bits(loss(*put), loss(operand, columns), f"merge grad {spec}")
                    checks += 1
    return checks


def main():
    assert len(jax.devices()) == 8, jax.devices()
    rng = np.random.default_rng(31)
    checks = sum(check_layout(*layout, rng) for layout in LAYOUTS)
    checks += sum(check_k_past_2048(*layout, rng) for layout in LAYOUTS)
    checks += sum(check_gradient(*layout, rng) for layout in LAYOUTS)
    checks += check_row_sharded_merge(rng)
    checks += check_merge_under_set_mesh(rng)
    print(
        f"column sharding ({_sharding.COLUMN_MERGE}): {checks} sharded calls equal the "
        "unsharded ones, only the candidates cross devices"
    )


if __name__ == "__main__":
    main()
