"""indexer_topk's fused CUDA path (cuda/kernels/indexer_topk.cu: sample, cutoffs, candidates
kept by the tensor-core kernel, their selection, and the exact route over recomputed logits)
against topk_filtered(indexer_logits) on the GPU, bit for bit, asked for through
JAX_TOPK_INDEXER_TOPK=fused (and, for the same inputs, the default unfused path). The inputs
drive each route: rows short enough to keep every value (count exactly k at length k), sampled
rows, and rows the sample cannot settle (every logit 0, a few distinct keys, a key order that
fools the sample both ways). The handler falls back to the unfused path without a word (a
build without sm_90a, workspaces traced without the switch, a shape the tensor-core kernel
does not take), so every call also checks the CUDA module's count of fused calls: it moved
on the fused path and did not on the unfused one. Run with XLA_PYTHON_CLIENT_PREALLOCATE=false
under xdist."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import jax_topk
from jax_topk import _lowering
from tests.support.families import edge_lengths
from tests.support.indexer import BF16, FP8, logits_then_topk, make_inputs, run
from tests.support.operators import gpu_devices, permuted_page_table

pytestmark = pytest.mark.gpu

HEADS, HEAD_DIM = 64, 128  # the tensor-core kernel's shape: the fused path needs it
CAPACITY = 8192  # rows up to this length keep every value (common/indexer_topk_workspace.h)
SAMPLE_TILE_STRIDE, KEY_TILE = 32, 64


@pytest.fixture(params=["fused", "unfused"])
def path(request, monkeypatch):
    if not gpu_devices():
        pytest.skip("no GPU")
    monkeypatch.setenv("JAX_TOPK_INDEXER_TOPK", request.param)
    return request.param


def _fused_launches():
    """indexer_topk's calls on the fused path so far in this process (none without the CUDA
    extension)."""
    module = _lowering._jax_topk_cuda
    return 0 if module is None else module.indexer_topk_fused_launches()


def _topk_on_path(path, topk):
    """topk() (indexer_topk calls on the GPU, blocking), failing unless they ran on `path`."""
    before = _fused_launches()
    got = topk()
    fused = _fused_launches() > before
    assert fused == (path == "fused"), f"asked for {path}, the fused path ran: {fused}"
    return got


def _assert_matches(path, q, keys, weights, lengths, **kwargs):
    got = _topk_on_path(
        path, lambda: run(jax_topk.indexer_topk, "gpu", q, keys, weights, lengths=lengths, **kwargs)
    )
    want = run(logits_then_topk, "gpu", q, keys, weights, lengths=lengths, **kwargs)
    np.testing.assert_array_equal(got, want)
    return got


@pytest.mark.parametrize(
    "family", ["normal", "all_negative", "repeated_keys", "zero_heads", "periodic", "random_bits"]
)
@pytest.mark.parametrize("k,n", [(1, 20000), (512, 9000), (2048, 20000)])
def test_routes_over_edge_lengths(path, family, k, n):
    """Lengths -5, 0, 1, k-1, k, k+1, n, beyond (rows kept whole, sampled rows, and, for the
    tied families, rows past the candidates' capacity); N not a multiple of 64, M of 4."""
    rng = np.random.default_rng(k + n)
    queries = 14
    q, keys, weights = make_inputs(rng, queries, HEADS, HEAD_DIM, n, family=family)
    lengths = edge_lengths(k, n, queries, rng)
    lengths[-4:] = n - rng.integers(0, 3 * KEY_TILE, size=4)  # more sampled rows
    for sorted_ in (False, True):
        got = _assert_matches(path, q, keys, weights, lengths, k=k, sorted=sorted_)
        if family == "all_negative":  # every logit 0: the lowest columns win
            for row in range(queries):
                taken = int(np.clip(lengths[row], 0, min(n, k)))
                np.testing.assert_array_equal(got[row, :taken], np.arange(taken))
                assert (got[row, taken:] == -1).all()


def test_kth_logit_shared_by_hundreds(path):
    """The k-th logit held by 600 candidates and nothing else in its relative bin (a gap below
    the 1800 logits above it): the crowded one-key bin whose winners are put as it settles
    (gathered for sorted results, marked for unsorted ones), which must be where PutWinners
    then looks (cuda/kernels/indexer_topk.cu passes the same `to` to both). Head 0 alone
    counts (q = e_0, weight 1; the rest weight 0), so a key's logit is relu of its first entry,
    exact in bfloat16: high keys in [4, 8), the tie at 2, the rest at most 1."""
    rng = np.random.default_rng(41)
    queries, n, k = 4, 20000, 2048
    first = np.concatenate(
        [
            rng.uniform(4.0, 8.0, size=1800),
            np.full(600, 2.0),
            rng.uniform(-4.0, 1.0, size=n - 2400),
        ]
    )
    keys = np.zeros((n, HEAD_DIM), np.float32)
    keys[:, 0] = rng.permutation(first)
    q = np.zeros((queries, HEADS, HEAD_DIM), np.float32)
    q[:, 0, 0] = 1.0
    weights = np.zeros((queries, HEADS), np.float32)
    weights[:, 0] = 1.0
    q, keys = q.astype(BF16), keys.astype(BF16)
    lengths = np.array([n, n - 3, n, 15000], np.int32)
    logits = np.maximum(np.asarray(keys[:, 0], np.float32), 0.0)
    for sorted_ in (False, True):
        got = _assert_matches(path, q, keys, weights, lengths, k=k, sorted=sorted_)
        for row in range(queries):  # and the winners are what the logits say
            valid = logits[: lengths[row]]
            order = np.lexsort((np.arange(len(valid)), -valid))[:k]
            want = order if sorted_ else np.sort(order)
            np.testing.assert_array_equal(got[row], want)


@pytest.mark.parametrize("where", ["sampled", "skipped"])
def test_sample_fooling_key_order(path, where):
    """The largest logits only in the key tiles the sample takes (it sets the cutoff among
    them: fewer than k candidates) or only in those it skips (a cutoff among the small ones:
    more than the capacity). Either way the row takes the exact route."""
    rng = np.random.default_rng(7)
    queries, n, k = 5, 65536 + 37, 2048
    q, keys, weights = make_inputs(rng, queries, HEADS, HEAD_DIM, n)
    q, weights = np.abs(q.astype(np.float32)), np.abs(weights)
    keys = 0.01 * keys.astype(np.float32)
    in_sample = (np.arange(n) // KEY_TILE) % SAMPLE_TILE_STRIDE == 0
    big = in_sample if where == "sampled" else ~in_sample
    keys[big] = np.abs(keys[big]) * 1000.0
    q, keys = q.astype(BF16), keys.astype(BF16)
    lengths = np.array([n, n - 1, n - 40, 2**31 - 1, 50000], np.int32)
    got = _assert_matches(path, q, keys, weights, lengths, k=k)
    assert big[got[0]].all()


def test_count_exactly_k_and_capacity(path):
    """Rows of length k, k+1, the capacity and one past it, and N = capacity + 1."""
    rng = np.random.default_rng(8)
    k, n = 2048, CAPACITY + 1
    q, keys, weights = make_inputs(rng, 6, HEADS, HEAD_DIM, n, family="integers")
    lengths = np.array([k, k + 1, CAPACITY, CAPACITY + 1, k - 1, n], np.int32)
    for sorted_ in (False, True):
        _assert_matches(path, q, keys, weights, lengths, k=k, sorted=sorted_)


@pytest.mark.parametrize("valid", [0, 3, 9])
def test_num_valid_rows_and_page_table(path, valid):
    rng = np.random.default_rng(valid)
    queries, n, k, page_size = 9, 9000, 128, 16
    q, keys, weights = make_inputs(rng, queries, HEADS, HEAD_DIM, n)
    lengths = edge_lengths(k, n, queries, rng)
    lengths[-3:] = n
    table = permuted_page_table(rng, queries, -(-n // page_size) + 1)
    for sorted_ in (False, True):
        got = _assert_matches(
            path,
            q,
            keys,
            weights,
            lengths,
            k=k,
            page_table=table,
            page_size=page_size,
            num_valid_rows=np.int32(valid),
            sorted=sorted_,
        )
        assert (got[valid:] == -1).all()


@pytest.mark.parametrize("valid", [0, 8])
def test_masked_rows_past_num_valid_rows(monkeypatch, valid):
    """Rows past num_valid_rows, long enough to be sampled, keep no candidates on the fused
    path (a NaN threshold) and are all -1; the rows before them are kept whole (lengths -5,
    0, 1, k-1, k, k+1) or sampled (n, n+7). Integer inputs make the logits exact on both
    backends (sums of small integers below 2^24), so fused, unfused and the CPU agree bit
    for bit."""
    if not gpu_devices():
        pytest.skip("no GPU")
    rng = np.random.default_rng(50 + valid)
    queries, n, k = 12, 20000, 2048
    q, keys, weights = make_inputs(rng, queries, HEADS, HEAD_DIM, n, family="integers")
    lengths = edge_lengths(k, n, queries, rng)
    lengths[valid:] = n  # masked rows that a -inf threshold would fill to the capacity
    for sorted_ in (False, True):
        kwargs = dict(lengths=lengths, k=k, num_valid_rows=np.int32(valid), sorted=sorted_)
        cpu = run(jax_topk.indexer_topk, "cpu", q, keys, weights, **kwargs)
        for path in ("fused", "unfused"):
            monkeypatch.setenv("JAX_TOPK_INDEXER_TOPK", path)
            got = _topk_on_path(
                path, lambda: run(jax_topk.indexer_topk, "gpu", q, keys, weights, **kwargs)
            )
            np.testing.assert_array_equal(got, cpu)  # fused = unfused = CPU
        assert (cpu[valid:] == -1).all()
        assert (cpu[:valid] >= 0).sum() == np.clip(lengths[:valid], 0, k).sum()


def test_fp8_with_key_scales(path):
    rng = np.random.default_rng(5)
    n = 20000
    q, keys, weights = make_inputs(rng, 6, HEADS, HEAD_DIM, n, dtype=FP8)
    key_scales = rng.uniform(0.01, 2.0, size=n).astype(np.float32)
    lengths = np.array([n, n - 100, 9000, 2048, 0, 12345], np.int32)
    _assert_matches(path, q, keys, weights, lengths, k=2048, key_scales=key_scales)


@pytest.mark.parametrize("n", [3000, 40000])
def test_one_query_row(path, n):
    """Decode: one query a sequence (tiles of one query)."""
    rng = np.random.default_rng(n)
    q, keys, weights = make_inputs(rng, 1, HEADS, HEAD_DIM, n)
    for length in (n, n - 5, 2047):
        _assert_matches(path, q, keys, weights, np.array([length], np.int32), k=2048)


def test_causal_prefill_chunk(path):
    rng = np.random.default_rng(3)
    queries, n = 13, 20000
    q, keys, weights = make_inputs(rng, queries, HEADS, HEAD_DIM, n)
    lengths = (n - queries + 1 + np.arange(queries)).astype(np.int32)
    _assert_matches(path, q, keys, weights, lengths, k=2048, sorted=True)


def test_vmap_over_sequences(path):
    rng = np.random.default_rng(9)
    batch, queries, n, k = 3, 5, 9000, 512
    parts = [make_inputs(rng, queries, HEADS, HEAD_DIM, n) for _ in range(batch)]
    q, keys, weights = (np.stack(p) for p in zip(*parts))
    keys[1] = keys[1][:1]  # a sequence of one key repeated: every row past the capacity
    lengths = rng.integers(-2, n + 3, size=(batch, queries)).astype(np.int32)
    lengths[:, 0] = n
    device = gpu_devices()[0]
    args = jax.device_put((q, keys, weights, lengths), device)
    topk = jax.jit(jax.vmap(lambda *a: jax_topk.indexer_topk(*a, k=k)))
    got = _topk_on_path(path, lambda: np.asarray(topk(*args)))
    want = jax.jit(jax.vmap(lambda *a: logits_then_topk(*a, k=k)))(*args)
    np.testing.assert_array_equal(got, np.asarray(want))
