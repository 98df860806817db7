"""Run in its own process by tests/test_sharding.py (`python -m tests.checks.indexer_sharding`),
with 8 host devices: the lightning indexer with its query rows (and sequences, under vmap)
sharded equals the unsharded call, num_valid_rows included, and the compiled HLO never
all-gathers q (the keys, given replicated, stay so). Context parallelism: the keys split
over N on 2, 4 and 8 devices, and rows x keys on 2 x 4, equal the unsharded call bit for
bit (the CPU handler's logits do not depend on the device computing them) over adversarial
keys and lengths at each shard boundary; indexer_logits moves nothing between devices and
indexer_topk only the candidates (JAX_TOPK_COLUMN_MERGE=tree: the tree of merges). The
pure-JAX lowering's key-sharded logits meet the accuracy bound (its dot over a shard may sum
in another order)."""

import os

# The device count is fixed when JAX starts: set it before jax is imported.
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jax_topk  # noqa: E402
from jax_topk import _indexer_gradient, _lowering, _sharding  # noqa: E402
from tests.checks.column_sharding import (  # noqa: E402
    COLLECTIVES,
    PAGE_SIZE,
    ROWS,
    N,
    assert_only_candidates_move,
    boundary_lengths,
)
from tests.support.indexer import FP8, TOLERANCE, make_inputs, reference_logits  # noqa: E402
from tests.support.operators import permuted_page_table  # noqa: E402

INT32_MIN, INT32_MAX = np.iinfo(np.int32).min, np.iinfo(np.int32).max


def assert_no_gather(fn, args):
    hlo = fn.lower(*args).compile().as_text()
    gathered = [line for line in hlo.splitlines() if "all-gather(" in line]
    assert not gathered, "the partitioned call gathered:\n" + "\n".join(gathered)


# (mesh shape, axis names, q's row axis, the keys' N axis, axis type)
KEY_LAYOUTS = [
    ((2,), ("model",), None, "model", jax.sharding.AxisType.Explicit),
    ((4,), ("model",), None, "model", jax.sharding.AxisType.Auto),
    ((8,), ("model",), None, "model", jax.sharding.AxisType.Explicit),
    ((2, 4), ("data", "model"), "data", "model", jax.sharding.AxisType.Explicit),
    ((2, 4), ("data", "model"), "data", "model", jax.sharding.AxisType.Auto),
]
HEADS, HEAD_DIM = 2, 16


def winners_on_one_shard(rng):
    """Positive logits, the keys of one 125-key shard far above the rest (every row's top k
    there, and ties among its repeated keys)."""
    q, keys, weights = make_inputs(rng, ROWS, HEADS, HEAD_DIM, N, family="repeated_keys")
    q, weights = np.abs(q), np.abs(weights)
    keys = np.abs(keys.astype(np.float32))
    shard = rng.integers(0, 8)
    keys[shard * 125 : (shard + 1) * 125] *= 64.0
    return q, keys.astype(q.dtype), weights


def key_families(rng):
    """Ties across shards (repeated keys, zero heads), winners on one shard, random bit
    patterns (NaN and infinite logits), and float8 keys."""
    named = ("repeated_keys", "zero_heads", "random_bits")
    inputs = [make_inputs(rng, ROWS, HEADS, HEAD_DIM, N, family=f) for f in named]
    fp8 = make_inputs(rng, ROWS, HEADS, HEAD_DIM, N, family="repeated_keys", dtype=FP8)
    return [*inputs, winners_on_one_shard(rng), fp8]


def assert_nothing_moves(fn, args):
    hlo = fn.lower(*args).compile().as_text()
    moved = [line for line in hlo.splitlines() if any(f" {c}" in line for c in COLLECTIVES)]
    assert not moved, "the key-sharded logits crossed devices:\n" + "\n".join(moved)


def check_key_layout(shape, names, row_axis, key_axis, axis_type, rng):
    """Keys (and key_scales) split over `key_axis`, q's rows over `row_axis`."""
    mesh = jax.make_mesh(shape, names, axis_types=(axis_type,) * len(names))
    local_n = N // mesh.shape[key_axis]

    def put(x, spec):
        return jax.device_put(x, NamedSharding(mesh, spec))

    lengths = boundary_lengths(rng)
    scales = rng.uniform(0.5, 2.0, size=N).astype(np.float32)
    table = permuted_page_table(rng, ROWS, N // PAGE_SIZE + 1)
    shared = permuted_page_table(rng, 3, N // PAGE_SIZE + 1)
    table_rows = rng.integers(-2, 5, size=ROWS).astype(np.int32)
    logits = jax.jit(lambda a, b, c, d, s: jax_topk.indexer_logits(a, b, c, d, key_scales=s))
    every_key = jax.jit(lambda a, b, c, s: jax_topk.indexer_logits(a, b, c, key_scales=s))
    whole = np.full(ROWS, N, np.int32)
    per_row = jax.jit(
        lambda a, b, c, d, s, t, v: jax_topk.indexer_topk(
            a, b, c, d, k=40, key_scales=s, page_table=t, page_size=PAGE_SIZE, num_valid_rows=v
        )
    )
    shared_table = jax.jit(
        lambda a, b, c, d, t, tr: jax_topk.indexer_topk(
            a, b, c, d, k=150, page_table=t, page_size=PAGE_SIZE, table_rows=tr, sorted=True
        )
    )
    checks = gathers = 0
    for index, (q, keys, weights) in enumerate(key_families(rng)):
        sharded = (
            put(q, P(row_axis, None, None)),
            put(keys, P(key_axis, None)),
            put(weights, P(row_axis, None)),
            put(lengths, P(row_axis)),
        )
        plain = (q, keys, weights, lengths)
        sharded_scales = put(scales, P(key_axis))
        got = logits(*sharded, sharded_scales)
        want = logits(*plain, scales)
        np.testing.assert_array_equal(
            np.asarray(got).view(np.uint32), np.asarray(want).view(np.uint32), f"logits {index}"
        )
        assert got.sharding.spec[1] == key_axis, got.sharding
        got = every_key(*sharded[:3], sharded_scales)  # no lengths: each shard scores all
        want = logits(*plain[:3], whole, scales)
        np.testing.assert_array_equal(
            np.asarray(got).view(np.uint32), np.asarray(want).view(np.uint32), f"whole {index}"
        )
        valid = (ROWS, 0, 13, -1, INT32_MAX)[index]
        got = per_row(*sharded, sharded_scales, put(table, P(row_axis, None)), np.int32(valid))
        want = per_row(*plain, scales, table, np.int32(valid))
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want), f"topk {index}")
        got = shared_table(*sharded, shared, put(table_rows, P(row_axis)))
        want = shared_table(*plain, shared, table_rows)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want), f"shared {index}")
        checks += 4
    assert_nothing_moves(logits, (*sharded, sharded_scales))
    assert_nothing_moves(every_key, (*sharded[:3], sharded_scales))
    args = (*sharded, shared, put(table_rows, P(row_axis)))
    gathers += assert_only_candidates_move(shared_table, args, local_n)
    assert gathers > 0, "no candidates crossed devices: the keys were not split"
    return checks


def check_key_sharded_sequences(rng):
    """vmap over 4 sequences of 8 queries: sequences over "data", each sequence's keys over
    "model", one limit per sequence."""
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    q, keys, weights = make_inputs(rng, ROWS, HEADS, HEAD_DIM, 4 * N, family="repeated_keys")
    batched = (
        q.reshape(4, 8, HEADS, HEAD_DIM),
        keys.reshape(4, N, HEAD_DIM),
        weights.reshape(4, 8, HEADS),
        boundary_lengths(rng).reshape(4, 8),
    )
    specs = (P("data"), P("data", "model"), P("data"), P("data"))
    sharded = [jax.device_put(x, NamedSharding(mesh, s)) for x, s in zip(batched, specs)]
    fn = jax.jit(
        jax.vmap(lambda a, b, c, d, v: jax_topk.indexer_topk(a, b, c, d, k=40, num_valid_rows=v))
    )
    valid = np.array([3, 8, 0, 5], np.int32)
    got = fn(*sharded, valid)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(fn(*batched, valid)))
    assert assert_only_candidates_move(fn, (*sharded, valid), N // 4) > 0
    return 1


def check_fallback_key_sharding(rng):
    """The pure-JAX lowering with the keys over 4 devices: XLA's dot over a shard may sum
    in another order, so the logits meet the accuracy bound (not the unsharded bits); with
    exact sums (small integers) indexer_topk equals the unsharded call bit for bit."""
    mesh = jax.make_mesh((4,), ("model",), axis_types=(jax.sharding.AxisType.Explicit,))
    split = NamedSharding(mesh, P("model", None))
    lengths = boundary_lengths(rng)
    with _lowering.forced_fallback():
        q, keys, weights = make_inputs(rng, ROWS, HEADS, HEAD_DIM, N)
        got = jax.jit(jax_topk.indexer_logits)(q, jax.device_put(keys, split), weights, lengths)
        got, (want, scale) = np.asarray(got), reference_logits(q, keys, weights, lengths)
        past = np.isinf(want)
        np.testing.assert_array_equal(got[past], want[past])
        assert np.all(np.abs(got[~past] - want[~past]) <= TOLERANCE[q.dtype] * scale[~past])
        got = np.asarray(jax.jit(jax_topk.indexer_logits)(q, jax.device_put(keys, split), weights))
        want, scale = reference_logits(q, keys, weights)  # without lengths: every key
        assert np.isfinite(got).all() and np.all(np.abs(got - want) <= TOLERANCE[q.dtype] * scale)
        q, keys, weights = make_inputs(rng, ROWS, HEADS, HEAD_DIM, N, family="integers")
        fn = jax.jit(lambda a, b, c, d: jax_topk.indexer_topk(a, b, c, d, k=40, sorted=True))
        sharded = (q, jax.device_put(keys, split), weights, lengths)
        got = fn(*sharded)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(fn(q, keys, weights, lengths)))
        assert assert_only_candidates_move(fn, sharded, N // 4) > 0
    return 2


def check_under_set_mesh(rng):
    """Both ops inside jax.set_mesh (Explicit and Auto axes), the queries, the keys or both
    split, with num_valid_rows: the same bits as unsharded, and with the keys split only the
    candidates cross devices (jax 0.12 failed to compile these under Explicit axes before the
    partition bodies were traced without the mesh)."""
    q, keys, weights = make_inputs(rng, ROWS, HEADS, HEAD_DIM, N, family="repeated_keys")
    lengths = boundary_lengths(rng)
    topk = jax.jit(lambda a, b, c, d, v: jax_topk.indexer_topk(a, b, c, d, k=40, num_valid_rows=v))
    logits = jax.jit(jax_topk.indexer_logits)
    plain = (q, keys, weights, lengths)
    want_topk, want_logits = topk(*plain, np.int32(13)), logits(*plain)
    want_every_key = logits(*plain[:3])  # without lengths
    checks = 0
    for axis_type in (jax.sharding.AxisType.Explicit, jax.sharding.AxisType.Auto):
        mesh = jax.make_mesh((2, 4), ("x", "y"), axis_types=(axis_type,) * 2)
        for row_axis, key_axis in (("x", None), (None, "y"), ("x", "y")):
            with jax.set_mesh(mesh):
                specs = (P(row_axis, None, None), P(key_axis, None), P(row_axis, None), P(row_axis))
                sharded = [jax.device_put(x, NamedSharding(mesh, s)) for x, s in zip(plain, specs)]
                got = topk(*sharded, np.int32(13))
                np.testing.assert_array_equal(np.asarray(got), np.asarray(want_topk), "topk")
                got = logits(*sharded)
                np.testing.assert_array_equal(
                    np.asarray(got).view(np.uint32), np.asarray(want_logits).view(np.uint32)
                )
                got = logits(*sharded[:3])
                np.testing.assert_array_equal(
                    np.asarray(got).view(np.uint32), np.asarray(want_every_key).view(np.uint32)
                )
                if key_axis is not None:
                    moved = assert_only_candidates_move(topk, (*sharded, np.int32(13)), N // 4)
                    assert moved > 0, "no candidates crossed devices: the keys were not split"
            checks += 3
    return checks


def check_gradient_with_keys_split(rng):
    """jax.grad through indexer_logits with the keys split over 4 devices (and the rows over
    2 or not), its tangent forced into 8 strided spans of 128 keys, under Explicit and Auto
    axes: the gradients equal the unsharded ones within float32 reassociation, the keys'
    gradient comes out split as the keys, and nothing is all-gathered (each device forms
    its own keys' products)."""
    n = 1024
    q, keys, weights = (
        np.asarray(x, np.float32) for x in make_inputs(rng, ROWS, HEADS, HEAD_DIM, n)
    )
    lengths = rng.integers(-2, n + 3, size=ROWS).astype(np.int32)

    def loss(q, keys, weights):
        bf16 = jnp.bfloat16
        logits = jax_topk.indexer_logits(q.astype(bf16), keys.astype(bf16), weights, lengths)
        return jnp.sum(jnp.where(jnp.isfinite(logits), logits, 0.0) ** 2)

    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    saved = _indexer_gradient.SPAN_ELEMENTS, _indexer_gradient.MIN_SPAN_KEYS
    _indexer_gradient.SPAN_ELEMENTS, _indexer_gradient.MIN_SPAN_KEYS = ROWS * HEADS * 128, 1
    checks = 0
    try:
        assert _indexer_gradient.span_count(1, ROWS, HEADS, n, 4) == 8
        want = grad(q, keys, weights)
        for axis_type in (jax.sharding.AxisType.Explicit, jax.sharding.AxisType.Auto):
            mesh = jax.make_mesh((2, 4), ("x", "y"), axis_types=(axis_type,) * 2)
            for row_axis in (None, "x"):
                sharded = [
                    jax.device_put(x, NamedSharding(mesh, spec))
                    for x, spec in ((q, P(row_axis)), (keys, P("y")), (weights, P(row_axis)))
                ]
                got = grad(*sharded)
                for name, a, b in zip(("q", "keys", "weights"), got, want):
                    scale = np.abs(np.asarray(b)).max()
                    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6 * scale, err_msg=name)
                assert got[1].sharding.spec[0] == "y", got[1].sharding
                assert_no_gather(grad, sharded)
                checks += 1
    finally:
        _indexer_gradient.SPAN_ELEMENTS, _indexer_gradient.MIN_SPAN_KEYS = saved
    return checks


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
    print(f"indexer sharding: {checks} row-sharded calls equal the unsharded ones, no all-gather")
    checks = sum(check_key_layout(*layout, rng) for layout in KEY_LAYOUTS)
    checks += check_key_sharded_sequences(rng)
    checks += check_fallback_key_sharding(rng)
    checks += check_under_set_mesh(rng)
    checks += check_gradient_with_keys_split(rng)
    print(
        f"indexer context parallelism ({_sharding.COLUMN_MERGE}): {checks} key-sharded calls "
        "equal the unsharded ones, only the candidates cross devices"
    )


if __name__ == "__main__":
    main()
