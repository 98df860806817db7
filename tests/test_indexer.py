"""docs/contract.md section 9 on every backend: indexer_topk equals topk_filtered of
indexer_logits bit for bit over adversarial inputs, and indexer_logits is within the SPEC's
bound of a float64 reference, the same bits every run."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import jax_topk
from tests.support.families import edge_lengths
from tests.support.indexer import (
    BF16,
    FP8,
    TOLERANCE,
    logits_then_topk,
    make_inputs,
    ordered_logits,
    reference_logits,
    run,
)
from tests.support.operators import device_for, permuted_page_table

HEADS, HEAD_DIM = 4, 32
FAMILIES = [
    "normal",
    "repeated_keys",
    "zero_heads",
    "all_negative",
    "integers",
    "periodic",
    "random_bits",
]


def _assert_topk_matches(backend, q, keys, weights, lengths, **kwargs):
    got = run(jax_topk.indexer_topk, backend, q, keys, weights, lengths=lengths, **kwargs)
    want = run(logits_then_topk, backend, q, keys, weights, lengths=lengths, **kwargs)
    np.testing.assert_array_equal(got, want)
    return got


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("k,n", [(1, 1), (1, 100), (512, 777), (2048, 3001)])
def test_topk_equals_topk_filtered_of_logits(backend, family, k, n):
    rng = np.random.default_rng(k * 7 + n)
    q, keys, weights = make_inputs(rng, 12, HEADS, HEAD_DIM, n, family=family)
    lengths = edge_lengths(k, n, 12, rng)
    for sorted_ in (False, True):
        got = _assert_topk_matches(backend, q, keys, weights, lengths, k=k, sorted=sorted_)
        if family in ("all_negative", "zero_heads"):
            # Every logit of these rows is 0: the lowest columns win, in either order.
            for row in range(0, 12, 1 if family == "all_negative" else 2):
                taken = int(np.clip(lengths[row], 0, min(n, k)))
                np.testing.assert_array_equal(got[row, :taken], np.arange(taken))
                assert (got[row, taken:] == -1).all()


@pytest.mark.parametrize("family", ["all_negative", "zero_heads", "periodic", "random_bits"])
def test_topk_at_the_tensor_core_shape(backend, family):
    """The same at bf16, H = 64, D = 128 (the GPU's tensor-core kernel: tiles of 64 keys and 4
    queries, so N and M not multiples of either), relu ties at 0 included."""
    rng = np.random.default_rng(13)
    queries, n, k = 7, 701, 64
    q, keys, weights = make_inputs(rng, queries, 64, 128, n, family=family)
    lengths = edge_lengths(k, n, queries, rng)
    got = _assert_topk_matches(backend, q, keys, weights, lengths, k=k, sorted=True)
    if family in ("all_negative", "zero_heads"):
        for row in range(0, queries, 1 if family == "all_negative" else 2):
            taken = int(np.clip(lengths[row], 0, min(n, k)))
            np.testing.assert_array_equal(got[row, :taken], np.arange(taken))
            assert (got[row, taken:] == -1).all()


def test_causal_lengths(backend):
    rng = np.random.default_rng(3)
    queries, n = 16, 1500
    q, keys, weights = make_inputs(rng, queries, HEADS, HEAD_DIM, n)
    lengths = (n - queries + 1 + np.arange(queries)).astype(np.int32)  # a prefill chunk's tail
    _assert_topk_matches(backend, q, keys, weights, lengths, k=512)


@pytest.mark.parametrize("valid", [0, 5, 12, -1, 2**31 - 1])
def test_num_valid_rows(backend, valid):
    rng = np.random.default_rng(4)
    q, keys, weights = make_inputs(rng, 12, HEADS, HEAD_DIM, 600, family="repeated_keys")
    lengths = edge_lengths(64, 600, 12, rng)
    got = _assert_topk_matches(
        backend, q, keys, weights, lengths, k=64, num_valid_rows=np.int32(valid)
    )
    assert (got[int(np.clip(valid, 0, 12)) :] == -1).all()


@pytest.mark.parametrize("queries,valid", [(1, None), (1, 0), (2, 1), (3, None)])
def test_few_long_rows(backend, queries, valid):
    """Fewer rows than the host's threads: the CPU spreads spans of keys over the cores."""
    rng = np.random.default_rng(11)
    n = 5000  # several spans of keys, the last one partial
    q, keys, weights = make_inputs(rng, queries, HEADS, HEAD_DIM, n, dtype=FP8)
    key_scales = rng.uniform(0.01, 2.0, size=n).astype(np.float32)
    lengths = np.array([n, 3000, 1023][:queries], np.int32)
    valid_rows = None if valid is None else np.int32(valid)
    kwargs = dict(key_scales=key_scales)
    got = _assert_topk_matches(
        backend, q, keys, weights, lengths, k=2048, num_valid_rows=valid_rows, **kwargs
    )
    if valid is not None:
        assert (got[valid:] == -1).all()
    if backend == "cpu":
        logits = run(jax_topk.indexer_logits, backend, q, keys, weights, lengths=lengths, **kwargs)
        want = ordered_logits(q, keys, weights, lengths, key_scales)
        np.testing.assert_array_equal(logits.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("page_size", [1, 16])
def test_page_transform(backend, page_size):
    rng = np.random.default_rng(page_size)
    queries, n, k = 9, 1000, 128
    pages = -(-n // page_size) + 1
    q, keys, weights = make_inputs(rng, queries, HEADS, HEAD_DIM, n)
    lengths = edge_lengths(k, n, queries, rng)
    table = permuted_page_table(rng, queries, pages)
    for sorted_ in (False, True):
        _assert_topk_matches(
            backend,
            q,
            keys,
            weights,
            lengths,
            k=k,
            page_table=table,
            page_size=page_size,
            sorted=sorted_,
        )
    shared = permuted_page_table(rng, 3, pages)
    table_rows = rng.integers(-2, 5, size=queries).astype(np.int32)
    _assert_topk_matches(
        backend,
        q,
        keys,
        weights,
        lengths,
        k=k,
        page_table=shared,
        page_size=page_size,
        table_rows=table_rows,
    )


def test_fp8_with_key_scales(backend):
    rng = np.random.default_rng(5)
    q, keys, weights = make_inputs(rng, 12, HEADS, HEAD_DIM, 2500, dtype=FP8)
    key_scales = rng.uniform(0.01, 2.0, size=2500).astype(np.float32)
    lengths = edge_lengths(2048, 2500, 12, rng)
    _assert_topk_matches(backend, q, keys, weights, lengths, k=2048, key_scales=key_scales)


@pytest.mark.parametrize("dtype", [BF16, FP8], ids=["bfloat16", "float8_e4m3fn"])
@pytest.mark.parametrize("family", ["normal", "integers"])
def test_logits_within_bound_of_float64(backend, dtype, family):
    rng = np.random.default_rng(6)
    queries, heads, head_dim, n = 6, 8, 64, 300
    q, keys, weights = make_inputs(rng, queries, heads, head_dim, n, family=family, dtype=dtype)
    key_scales = rng.uniform(0.01, 2.0, size=n).astype(np.float32) if dtype == FP8 else None
    lengths = np.array([0, 1, 150, 299, 300, 1000], np.int32)
    got = run(
        jax_topk.indexer_logits, backend, q, keys, weights, lengths=lengths, key_scales=key_scales
    )
    want, scale = reference_logits(q, keys, weights, lengths, key_scales)
    assert got.dtype == np.float32 and got.shape == (queries, n)
    past = np.isinf(want)
    np.testing.assert_array_equal(got[past], want[past])
    error = np.abs(got[~past].astype(np.float64) - want[~past])
    assert (error <= TOLERANCE[dtype] * scale[~past]).all(), (error / scale[~past]).max()


@pytest.mark.parametrize("heads,head_dim", [(1, 512), (1, 1024), (512, 1), (130, 300)])
def test_logits_within_bound_when_every_rounding_errs_one_way(backend, heads, head_dim):
    """Terms whose float32 sums in order round the same way each time (1 + t + t + ...
    with t just above half an ulp of 1): D + H terms in order would err by ~(D + H) / 2^24
    of their magnitude, past the bound's 2e-5 from D + H ~ 335; the blocked sums stay
    within it (docs/contract.md section 9). Every term is a normal float32 and a bfloat16."""
    t = np.float32(2.0**-24 * (1 + 2.0**-7))
    q = np.full((2, heads, head_dim), t, np.float32)
    q[:, 0, 0] = 1.0
    keys = np.ones((3, head_dim), np.float32)
    weights = np.ones((2, heads), np.float32)
    q_float32 = q
    q, keys = q.astype(BF16), keys.astype(BF16)
    np.testing.assert_array_equal(q.astype(np.float32), q_float32)  # t is a bfloat16 value
    got = run(jax_topk.indexer_logits, backend, q, keys, weights)
    want, scale = reference_logits(q, keys, weights)
    error = np.abs(got.astype(np.float64) - want)
    assert (error <= TOLERANCE[BF16] * scale).all(), (error / scale).max()


def _raw_values(rng, shape, dtype):
    """Every bit pattern of the dtype: NaNs, infinities, subnormals, +-0 among them."""
    if dtype == BF16:
        return rng.integers(0, 1 << 16, size=shape, dtype=np.uint16).view(BF16)
    return rng.integers(0, 1 << 8, size=shape, dtype=np.uint8).view(FP8)


def _special_floats(rng, shape):
    """float32 normals mixed with 0, -0, subnormals, infinities, NaN and huge values."""
    values = rng.standard_normal(shape).astype(np.float32)
    specials = np.array([0.0, -0.0, 1e-40, -1e-40, np.inf, -np.inf, np.nan, 1e30], np.float32)
    picked = rng.random(shape) < 0.3
    values[picked] = rng.choice(specials, size=int(picked.sum()))
    return values


@pytest.mark.parametrize("dtype", [BF16, FP8], ids=["bfloat16", "float8_e4m3fn"])
@pytest.mark.parametrize(
    "heads,head_dim,n", [(1, 1, 1), (3, 7, 37), (64, 128, 261), (70, 300, 21), (129, 129, 9)]
)
@pytest.mark.parametrize("values", ["normal", "raw_bits"])
@pytest.mark.parametrize("scaled", [False, True], ids=["unscaled", "key_scales"])
def test_cpu_logits_in_the_stated_order(dtype, heads, head_dim, n, values, scaled):
    """The CPU handler's logits are the stated order's float32 sums bit for bit (a NaN may
    carry another payload or sign): blocking and vectorising over keys reorders no sum."""
    rng = np.random.default_rng(10)
    queries = 8
    q, keys, weights = make_inputs(rng, queries, heads, head_dim, n, dtype=dtype)
    if values == "raw_bits":
        q, keys = _raw_values(rng, q.shape, dtype), _raw_values(rng, keys.shape, dtype)
        weights = _special_floats(rng, weights.shape)
    key_scales = _special_floats(rng, (n,)) if scaled else None
    lengths = np.array([0, 1, n // 2, n - 1, n, n + 3, -2, n // 3 + 1], np.int32)
    got = run(
        jax_topk.indexer_logits, "cpu", q, keys, weights, lengths=lengths, key_scales=key_scales
    )
    want = ordered_logits(q, keys, weights, lengths, key_scales)
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


def test_logits_without_lengths_cover_every_key(backend):
    """Without lengths every key is scored: within the bound of the reference, and the same
    bits as lengths of N and beyond (the handlers' null-lengths route against the clamp)."""
    rng = np.random.default_rng(7)
    q, keys, weights = make_inputs(rng, 3, 2, 16, 130)
    got = run(jax_topk.indexer_logits, backend, q, keys, weights)
    want, scale = reference_logits(q, keys, weights)
    assert np.isfinite(got).all()
    assert (np.abs(got - want) <= TOLERANCE[BF16] * scale).all()
    whole = np.array([130, 131, np.iinfo(np.int32).max], np.int32)
    given = run(jax_topk.indexer_logits, backend, q, keys, weights, lengths=whole)
    np.testing.assert_array_equal(got.view(np.uint32), given.view(np.uint32))


def test_logits_without_lengths_pass_no_lengths_array():
    """indexer_logits without lengths hands the handlers the empty placeholder and
    has_lengths = false (an [M] array of N built inside jit is a fill kernel on every call);
    with lengths, its [1, M] array and has_lengths = true; indexer_topk always has both."""
    rng = np.random.default_rng(13)
    q, keys, weights = make_inputs(rng, 37, 2, 16, 300)
    lengths = np.full(37, 300, np.int32)

    def custom_calls(fn, *args):
        text = jax.jit(fn).lower(*args).as_text()
        return text, [line for line in text.splitlines() if "custom_call @jax_topk_indexer" in line]

    text, calls = custom_calls(jax_topk.indexer_logits, q, keys, weights)
    assert len(calls) == 1 and "has_lengths = false" in calls[0]
    assert "37xi32>" not in text
    for fn in (jax_topk.indexer_logits, lambda *a: jax_topk.indexer_topk(*a, k=8)):
        _, calls = custom_calls(fn, q, keys, weights, lengths)
        assert len(calls) == 1 and "has_lengths = true" in calls[0]
        assert "tensor<1x37xi32>" in calls[0]


def test_logit_of_no_positive_head_is_plus_zero(backend):
    """A key that no head scores above 0 has logit +0 on every backend, negative weights
    included (each term is then -0): the sum starts at +0, as the stated order says, so
    the selection's order between -0 and +0 never tells the backends apart."""
    rng = np.random.default_rng(12)
    q, keys, weights = make_inputs(rng, 6, HEADS, HEAD_DIM, 200, family="all_negative")
    # Negative weights, all or some (positive ones alone make +0 terms: nothing to test).
    for signed in (-weights, weights * np.where(rng.random(weights.shape) < 0.5, -1, 1)):
        got = run(jax_topk.indexer_logits, backend, q, keys, signed.astype(np.float32))
        np.testing.assert_array_equal(got.view(np.uint32), np.zeros(got.shape, np.uint32))


def test_deterministic_run_to_run(backend):
    rng = np.random.default_rng(8)
    q, keys, weights = make_inputs(rng, 64, HEADS, HEAD_DIM, 2000)
    lengths = rng.integers(0, 2001, size=64).astype(np.int32)
    first = run(jax_topk.indexer_logits, backend, q, keys, weights, lengths=lengths)
    first_topk = run(jax_topk.indexer_topk, backend, q, keys, weights, lengths=lengths, k=512)
    for _ in range(2):
        again = run(jax_topk.indexer_logits, backend, q, keys, weights, lengths=lengths)
        np.testing.assert_array_equal(again.view(np.uint32), first.view(np.uint32))
        np.testing.assert_array_equal(
            run(jax_topk.indexer_topk, backend, q, keys, weights, lengths=lengths, k=512),
            first_topk,
        )


@pytest.mark.parametrize("dtype", [BF16, FP8], ids=["bfloat16", "float8_e4m3fn"])
def test_every_input_value_decodes_exactly(backend, dtype):
    """H = D = 1, q = 1, weight 1: each logit is relu(key) exactly, so every fp8 code and
    bfloat16's specials (subnormals, +-0, +-inf, NaN, the extremes) decode as ml_dtypes does.
    Except: XLA's CPU runtime runs with subnormals flushed to zero (its own ops and our custom
    calls alike), so there a bfloat16 subnormal key gives 0 (fp8's subnormals are normal in
    float32)."""
    bits = np.dtype(f"u{dtype.itemsize}")
    if dtype.itemsize == 1:
        codes = np.arange(256, dtype=bits)
    else:
        edges = [0x0000, 0x8000, 0x0001, 0x8001, 0x007F, 0x0080, 0x7F7F, 0xFF7F, 0x7F80, 0xFF80]
        codes = np.r_[edges, 0x7FC0, 0xFFC1, np.arange(0, 1 << 16, 257)].astype(bits)
    keys = codes.view(dtype)[:, None]
    q = np.ones((1, 1, 1), dtype)
    got = run(jax_topk.indexer_logits, backend, q, keys, np.ones((1, 1), np.float32))[0]
    want = np.maximum(keys[:, 0].astype(np.float32), 0.0)
    if backend != "gpu":
        want[np.abs(want) < np.finfo(np.float32).tiny] = 0.0
    np.testing.assert_array_equal(got, want)  # NaN where the key is NaN; 0 equals -0


@pytest.mark.parametrize("heads,head_dim", [(HEADS, HEAD_DIM), (64, 128)])
def test_nan_inputs_give_nan_logits(backend, heads, head_dim):
    """relu keeps NaN (jnp.maximum's, the CPU's): a NaN in q[t, h] makes row t's visible
    logits NaN, a NaN in keys[s] makes column s NaN, and indexer_topk never selects them.
    H = 64, D = 128 is the tensor-core kernel's shape on the GPU."""
    rng = np.random.default_rng(12)
    queries, n = 6, 300
    q, keys, weights = make_inputs(rng, queries, heads, head_dim, n)
    q[1, heads - 1, 3] = np.nan
    keys[[7, 130, 299], [0, head_dim - 1, 5]] = np.nan
    lengths = np.array([n, n, 0, 131, 200, 1000], np.int32)
    got = run(jax_topk.indexer_logits, backend, q, keys, weights, lengths=lengths)
    visible = np.arange(n)[None, :] < np.clip(lengths, 0, n)[:, None]
    nan = np.zeros((queries, n), bool)
    nan[1] = True
    nan[:, [7, 130, 299]] = True
    np.testing.assert_array_equal(np.isnan(got), nan & visible)
    assert (got[~visible] == -np.inf).all()
    picked = _assert_topk_matches(backend, q, keys, weights, lengths, k=512)
    assert (picked[1] == -1).all()
    assert not np.isin(picked, [7, 130, 299]).any()


@pytest.mark.parametrize(
    "heads,head_dim,dtype", [(HEADS, HEAD_DIM, FP8), (64, 128, BF16)], ids=["fp8", "bf16-64x128"]
)
def test_vmap_over_sequences_matches_each(backend, heads, head_dim, dtype):
    """A batch of sequences (each its own keys, key scales and lengths) equals one call per
    sequence on this backend: the kernels' per-sequence offsets (H = 64, D = 128 bf16 is the
    tensor-core kernel's shape on the GPU)."""
    rng = np.random.default_rng(10)
    batch, queries, n = 3, 5, 700
    parts = [make_inputs(rng, queries, heads, head_dim, n, dtype=dtype) for _ in range(batch)]
    q, keys, weights = (np.stack(p) for p in zip(*parts))
    key_scales = rng.uniform(0.01, 2.0, size=(batch, n)).astype(np.float32)
    lengths = np.stack([edge_lengths(64, n, queries, rng) for _ in range(batch)])

    def both(q, keys, weights, lengths, key_scales):
        logits = jax_topk.indexer_logits(q, keys, weights, lengths, key_scales=key_scales)
        topk = jax_topk.indexer_topk(q, keys, weights, lengths, k=64, key_scales=key_scales)
        return logits, topk

    device = device_for(backend)
    args = jax.device_put((q, keys, weights, lengths, key_scales), device)
    logits, topk = jax.jit(jax.vmap(both))(*args)
    for b in range(batch):
        one_logits, one_topk = jax.jit(both)(*(a[b] for a in args))
        np.testing.assert_array_equal(
            np.asarray(logits[b]).view(np.uint32), np.asarray(one_logits).view(np.uint32)
        )
        np.testing.assert_array_equal(np.asarray(topk[b]), np.asarray(one_topk))


@pytest.mark.gpu
def test_gpu_more_key_tiles_than_grid_y():
    """N past 65535 tiles of 128 keys: the logits kernel's grid-stride over key tiles (grid.y
    is capped at 65535). H = D = 1 keeps it cheap; with one head and one term the GPU's and
    the CPU's rounding are the same, so the logits agree bit for bit."""
    from tests.support.operators import gpu_devices

    if not gpu_devices():
        pytest.skip("no GPU visible to JAX")
    rng = np.random.default_rng(11)
    n = 65535 * 128 + 300
    q = rng.standard_normal((2, 1, 1)).astype(BF16)
    keys = rng.standard_normal((n, 1)).astype(BF16)
    weights = np.abs(rng.standard_normal((2, 1))).astype(np.float32)
    lengths = np.array([n, n - 200], np.int32)
    gpu = run(jax_topk.indexer_logits, "gpu", q, keys, weights, lengths=lengths)
    cpu = run(jax_topk.indexer_logits, "cpu", q, keys, weights, lengths=lengths)
    np.testing.assert_array_equal(gpu.view(np.uint32), cpu.view(np.uint32))
    _assert_topk_matches("gpu", q, keys, weights, lengths, k=2048)


@pytest.mark.gpu
@pytest.mark.parametrize("heads,head_dim", [(70, 300), (129, 129), (512, 1), (1, 1024)])
def test_gpu_portable_kernel_sums_in_the_cpu_blocks(heads, head_dim):
    """Shapes off the tensor-core kernel's (H = 64, D = 128) run the portable CUDA kernel, which
    sums in the CPU handler's blocks (128 d, 64 heads): the same bits on normal inputs, and
    within the bound where every rounding errs one way."""
    from tests.support.operators import gpu_devices

    if not gpu_devices():
        pytest.skip("no GPU visible to JAX")
    rng = np.random.default_rng(12)
    q, keys, weights = make_inputs(rng, 3, heads, head_dim, 200)
    lengths = np.array([200, 77, 0], np.int32)
    gpu = run(jax_topk.indexer_logits, "gpu", q, keys, weights, lengths=lengths)
    cpu = run(jax_topk.indexer_logits, "cpu", q, keys, weights, lengths=lengths)
    np.testing.assert_array_equal(gpu.view(np.uint32), cpu.view(np.uint32))
    test_logits_within_bound_when_every_rounding_errs_one_way("gpu", heads, head_dim)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [BF16, FP8], ids=["bfloat16", "float8_e4m3fn"])
def test_gpu_logits_agree_with_cpu_within_bound(dtype):
    from tests.support.operators import gpu_devices

    if not gpu_devices():
        pytest.skip("no GPU visible to JAX")
    rng = np.random.default_rng(9)
    queries, heads, head_dim, n = 40, 64, 128, 4099
    q, keys, weights = make_inputs(rng, queries, heads, head_dim, n, dtype=dtype)
    key_scales = rng.uniform(0.01, 2.0, size=n).astype(np.float32)
    lengths = rng.integers(0, n + 2, size=queries).astype(np.int32)
    kwargs = dict(lengths=lengths, key_scales=key_scales)
    gpu = run(jax_topk.indexer_logits, "gpu", q, keys, weights, **kwargs)
    cpu = run(jax_topk.indexer_logits, "cpu", q, keys, weights, **kwargs)
    _, scale = reference_logits(q, keys, weights, lengths, key_scales)
    finite = np.isfinite(cpu)
    np.testing.assert_array_equal(np.isfinite(gpu), finite)
    assert (np.abs(gpu[finite] - cpu[finite]) <= 2 * TOLERANCE[dtype] * scale[finite]).all()
    _assert_topk_matches("gpu", q, keys, weights, lengths, k=2048, key_scales=key_scales)


@pytest.mark.gpu
def test_gpu_fp8_swamped_k_steps_within_bound():
    """fp8 at H = 64, D = 128 (the Hopper tensor-core kernel where it applies): each 32-wide
    k-step holds one 448 x 448 product and 31 of 5.5 x 5.5, the large ones cancelling across
    k-steps for even keys. e4m3 tensor cores keep 14 bits aligned to a k-step's largest
    product and would lose ~30 * 2^-13 of it, over the bound; the kernel must not."""
    from tests.support.operators import gpu_devices

    if not gpu_devices():
        pytest.skip("no GPU visible to JAX")
    queries, heads, head_dim, n = 5, 64, 128, 300
    d = np.arange(head_dim)
    q_row = np.where(d % 32 == 0, 448.0, 5.5)
    q = np.broadcast_to(q_row, (queries, heads, head_dim)).astype(FP8)
    s = np.arange(n)[:, None]
    sign = np.where((s % 2 == 0) & ((d[None, :] // 32) % 2 == 1), -1.0, 1.0)
    small = np.where(s % 3 == 0, -5.5, 5.5)
    keys = np.where(d[None, :] % 32 == 0, sign * 448.0, small).astype(FP8)
    weights = np.random.default_rng(5).uniform(-1.0, 1.0, (queries, heads)).astype(np.float32)
    got = run(jax_topk.indexer_logits, "gpu", q, keys, weights)
    want, scale = reference_logits(q, keys, weights)
    assert (np.abs(got.astype(np.float64) - want) <= TOLERANCE[FP8] * scale).all()


@pytest.mark.gpu
def test_gpu_fp8_key_scales_after_or_before_the_head_sum():
    """fp8 at H = 64, D = 128 on the tensor-core kernel: a finite key scale >= 0 (-0 too)
    multiplies the finished head sum, any other each product before its relu, and a query
    whose weights are too large for the unscaled sum (1e37: the head sum of weight x relu(dot)
    passes float32's largest where the scaled products' sum does not) keeps every product
    scaled. Every logit within the bound of the float64 reference, finite where that is, and
    indexer_topk equal to topk_filtered of the logits."""
    from tests.support.operators import gpu_devices

    if not gpu_devices():
        pytest.skip("no GPU visible to JAX")
    rng = np.random.default_rng(21)
    queries, heads, head_dim, n = 9, 64, 128, 1100
    q, keys, weights = make_inputs(rng, queries, heads, head_dim, n, dtype=FP8)
    q = np.abs(q.astype(np.float32)).astype(FP8)
    keys[: n // 2] = np.abs(keys[: n // 2].astype(np.float32)).astype(FP8)  # positive dots
    weights[4] = 1e37  # query 4: an unscaled head sum overflows
    weights[5, ::2] = -1e36  # query 5: large of both signs
    key_scales = rng.uniform(1e-9, 2.0, size=n).astype(np.float32)
    key_scales[:544:3] = 1e-6  # query 4: finite logits whose unscaled head sum overflows
    # The other kinds only from key 896 on: a warp reads 16 keys, and one key that needs
    # per-product scales sends its whole warp that way, so keys below 896 (positive scales)
    # would take the scales after the head sum but for the weights' guard.
    key_scales[896::5] = 0.0
    key_scales[897::5] = -0.0
    key_scales[898::5] = -rng.uniform(0.01, 2.0, size=len(key_scales[898::5]))
    key_scales[899::5] = 1e-20
    key_scales[900::5] = 3e20
    lengths = np.array([n, n, 0, 1, n, n, 700, n - 1, 64], np.int32)
    kwargs = dict(lengths=lengths, key_scales=key_scales)
    got = run(jax_topk.indexer_logits, "gpu", q, keys, weights, **kwargs).astype(np.float64)
    want, scale = reference_logits(q, keys, weights, lengths, key_scales)
    largest = np.finfo(np.float32).max
    finite = np.isfinite(want) & (np.abs(want) <= largest)
    # The case meant: query 4 has finite logits whose unscaled head sum is past float32.
    unscaled, _ = reference_logits(q[4:5], keys, weights[4:5])
    assert (finite[4] & (unscaled[0] > largest)).sum() > 10
    np.testing.assert_array_equal(np.isfinite(got), finite)
    assert (np.abs(got[finite] - want[finite]) <= TOLERANCE[FP8] * scale[finite]).all()
    _assert_topk_matches("gpu", q, keys, weights, lengths, k=512, key_scales=key_scales)


def test_widened_copies_only_where_they_pay():
    """The CUDA lowering's workspace for f16 copies of fp8 q and keys (common/indexer_widened.h):
    only fp8, from 64 queries, at the tensor-core shape (H = 64, D = 128)."""
    from jax_topk._lowering import indexer_widened_bytes, indexer_widened_offset_after_logits

    assert indexer_widened_bytes(True, 2, 64, 64, 128, 1000) == 2 * 2 * (64 * 64 + 1000) * 128
    assert indexer_widened_bytes(True, 1, 63, 64, 128, 1000) == 0
    assert indexer_widened_bytes(False, 1, 512, 64, 128, 1000) == 0
    assert indexer_widened_bytes(True, 1, 512, 4, 32, 1000) == 0
    assert indexer_widened_offset_after_logits(3, 5) == 256
    assert indexer_widened_offset_after_logits(64, 1024) == 4 * 64 * 1024


@pytest.mark.gpu
def test_gpu_fp8_widened_once_same_bits():
    """fp8 at H = 64, D = 128 from 64 queries: q and the keys widened to f16 once before the
    tensor-core kernel, the same f16 operands as widening them in shared memory (63 queries):
    the same bits; indexer_topk (its copies after the logits) equals topk_filtered of them."""
    from tests.support.operators import gpu_devices

    if not gpu_devices():
        pytest.skip("no GPU visible to JAX")
    rng = np.random.default_rng(22)
    queries, n = 64, 3001
    q, keys, weights = make_inputs(rng, queries, 64, 128, n, dtype=FP8)
    keys[5::101, 7] = np.nan  # NaN logits in some columns
    key_scales = rng.uniform(0.01, 2.0, size=n).astype(np.float32)
    key_scales[::97] = -0.5  # some warps the per-product way
    lengths = edge_lengths(512, n, queries, rng)
    kwargs = dict(key_scales=key_scales)
    widened = run(jax_topk.indexer_logits, "gpu", q, keys, weights, lengths=lengths, **kwargs)
    in_ring = run(
        jax_topk.indexer_logits, "gpu", q[:63], keys, weights[:63], lengths=lengths[:63], **kwargs
    )
    np.testing.assert_array_equal(widened[:63].view(np.uint32), in_ring.view(np.uint32))
    want, scale = reference_logits(q, keys, weights, lengths, key_scales)
    finite = np.isfinite(want)
    assert finite.sum() > 0.3 * finite.size
    assert np.isfinite(widened[finite]).all()
    assert (np.abs(widened[finite] - want[finite]) <= TOLERANCE[FP8] * scale[finite]).all()
    _assert_topk_matches("gpu", q, keys, weights, lengths, k=512, **kwargs)


@pytest.mark.gpu
def test_gpu_fp8_logit_bits_do_not_depend_on_neighbours():
    """fp8 with key scales on the tensor-core kernel: whether a key's scale multiplies the head
    sum or each product depends on that key's scale and that query's weights only, so a
    logit's bits do not change with the keys and queries that share its tile (what makes a
    key- or query-sharded call equal the unsharded one). Key 995's negative scale shares a
    warp with keys 992-1007 in the whole call, not in the call from key 1000; query 6's NaN
    weight shares a tile with queries 4-7, not in the call of queries 4-5."""
    from tests.support.operators import gpu_devices

    if not gpu_devices():
        pytest.skip("no GPU visible to JAX")
    rng = np.random.default_rng(23)
    queries, n = 12, 2000
    q, keys, weights = make_inputs(rng, queries, 64, 128, n, dtype=FP8)
    key_scales = rng.uniform(0.01, 2.0, size=n).astype(np.float32)
    key_scales[995] = -1.0
    key_scales[1500] = np.inf
    weights[6, 0] = np.nan
    weights[9, 3] = 1e-35  # a weight x dot that could be subnormal: per product
    whole = run(jax_topk.indexer_logits, "gpu", q, keys, weights, key_scales=key_scales)
    from_1000 = run(
        jax_topk.indexer_logits, "gpu", q, keys[1000:], weights, key_scales=key_scales[1000:]
    )
    np.testing.assert_array_equal(whole[:, 1000:].view(np.uint32), from_1000.view(np.uint32))
    two_queries = run(
        jax_topk.indexer_logits, "gpu", q[4:6], keys, weights[4:6], key_scales=key_scales
    )
    np.testing.assert_array_equal(whole[4:6].view(np.uint32), two_queries.view(np.uint32))
