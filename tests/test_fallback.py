"""docs/contract.md section 10: the pure-JAX lowering for platforms without our handlers.

Every contract test runs on it already (the `fallback` backend of tests/conftest.py: the
CPU with the pure-JAX lowering forced). Here: the fallback against the CPU handler bit for
bit, its keys over every 16-bit pattern, and exports for platforms that have no handler."""

from __future__ import annotations

import warnings
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_topk import _fallback, _lowering
from jax_topk._contract import Operands, Params
from tests.support import families
from tests.support.families import edge_lengths
from tests.support.operators import OPS, SCORE_DTYPES, permuted_page_table, run_op
from tests.support.processes import run_python
from tests.support.reference import ordered_keys as reference_ordered_keys


@pytest.fixture(autouse=True)
def fallback_forced():
    with _lowering.forced_fallback():
        yield


def jitted(op, **kwargs):
    return jax.jit(lambda scores, lengths: OPS[op](scores, lengths, **kwargs))


def our_custom_calls(module_text):
    """The lines of a StableHLO module that call one of our FFI targets."""
    return [line for line in module_text.splitlines() if "custom_call @jax_topk" in line]


def test_forced_fallback_lowers_without_custom_call(op):
    scores = jnp.zeros((4, 64), SCORE_DTYPES[op])
    lengths = jnp.zeros((4,), jnp.int32)
    assert not our_custom_calls(jitted(op, k=8).lower(scores, lengths).as_text())
    with _lowering.forced_fallback(False):
        assert our_custom_calls(jitted(op, k=8).lower(scores, lengths).as_text())


def test_bit_identical_to_cpu_handler(op):
    """Every value family (a block of rows each, so one compilation serves them all) with
    edge lengths, num_valid_rows, the page transform with table_rows, and k past n."""
    rng = np.random.default_rng(zlib.crc32(f"handler/{op}".encode()))
    rows_per_family, n, k, page_size = 16, 777, 100, 16
    scores = np.concatenate(
        [
            families.make(family, rng, (rows_per_family, n), SCORE_DTYPES[op])
            for family in sorted(families.FAMILIES)
        ]
    )
    rows = scores.shape[0]
    lengths = np.concatenate([edge_lengths(k, n, rows_per_family, rng) for _ in families.FAMILIES])
    table = permuted_page_table(rng, 5, -(-n // page_size))
    table_rows = rng.integers(-2, 8, size=rows).astype(np.int32)
    cases = [
        dict(k=k),
        dict(k=k, num_valid_rows=np.int32(rows - 21)),
        dict(k=k, page_table=table, page_size=page_size, table_rows=table_rows),
        dict(k=1000),
        dict(k=1),
    ]
    for case in cases:
        for sorted_ in (False, True):
            fallback = run_op(op, "cpu", scores, lengths, sorted=sorted_, **case)
            with _lowering.forced_fallback(False):
                handler = run_op(op, "cpu", scores, lengths, sorted=sorted_, **case)
            np.testing.assert_array_equal(
                fallback, handler, err_msg=f"{sorted(case)} sorted={sorted_}"
            )


def test_num_valid_rows_groups():
    """Several num_valid_rows groups (as vmap and sharding bind them), limits past both
    ends included, against the handler."""
    rng = np.random.default_rng(40)
    rows, n, k, groups = 24, 50, 6, 4
    scores = families.make("heavy_ties", rng, (rows, n), "float32")
    lengths = jnp.full((rows,), n, jnp.int32)
    limits = jnp.array([-3, 2, 6, 99], jnp.int32)
    params = Params(
        op="topk_filtered",
        k=k,
        log2_page_size=0,
        sorted=True,
        has_page_table=False,
        has_table_rows=False,
        has_num_valid_rows=True,
    )

    def call_fn(s, v):
        operands = Operands(s, lengths, Operands.absent(2), Operands.absent(1), v)
        return _lowering.ffi_call_p.bind(*operands, params=params)[0]

    call = jax.jit(call_fn)
    out = np.asarray(call(scores, limits))
    with _lowering.forced_fallback(False):
        np.testing.assert_array_equal(out, np.asarray(call(scores, limits)))
    valid = np.arange(rows) % (rows // groups) < np.repeat(np.asarray(limits), rows // groups)
    assert (out[~valid] == -1).all() and (out[valid] >= 0).all()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_ordered_keys_total_order(dtype):
    """Keys order every bit pattern as IEEE total order; NaN of either sign is flagged."""
    width = np.dtype(dtype).itemsize * 8
    if width == 16:
        bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    else:
        bits = np.random.default_rng(41).integers(0, 1 << 32, size=1 << 16, dtype=np.uint32)
    values = bits.view(families.BF16 if dtype == "bfloat16" else np.dtype(dtype))
    keys, is_nan = jax.jit(_fallback.ordered_keys)(values)
    # float16 orders by bfloat16's transform of the same 16 bits; only its NaN differs.
    unsigned = reference_ordered_keys(bits.view(families.BF16) if width == 16 else values)
    np.testing.assert_array_equal(
        np.argsort(np.asarray(keys), kind="stable"), np.argsort(unsigned, kind="stable")
    )
    np.testing.assert_array_equal(is_nan, np.isnan(values.astype(np.float32)))


@pytest.mark.parametrize("platform", ["tpu", "rocm"])
def test_export_for_platform_without_handler(op, platform):
    rows, n = 8, 300
    args = (
        jax.ShapeDtypeStruct((rows, n), SCORE_DTYPES[op]),
        jax.ShapeDtypeStruct((rows,), jnp.int32),
        jax.ShapeDtypeStruct((rows, n // 4), jnp.int32),
        jax.ShapeDtypeStruct((rows,), jnp.int32),
        jax.ShapeDtypeStruct((), jnp.int32),
    )

    def both_forms(scores, lengths, page_table, table_rows, num_valid_rows):
        plain = OPS[op](scores, lengths, k=16, sorted=True)
        paged = OPS[op](
            scores,
            lengths,
            k=32,
            page_table=page_table,
            page_size=4,
            table_rows=table_rows,
            num_valid_rows=num_valid_rows,
        )
        return plain, paged

    with _lowering.forced_fallback(False):  # the real choice: no handler for this platform
        exported = jax.export.export(jax.jit(both_forms), platforms=[platform])(*args)
    assert not our_custom_calls(exported.mlir_module())


@pytest.mark.skipif(_lowering.HAS_CUDA_EXTENSION, reason="this build has the CUDA extension")
def test_cuda_without_extension_warns_once_and_falls_back(op, monkeypatch):
    monkeypatch.setitem(_lowering._fallback_state, "warned_no_cuda", False)
    scores = jax.ShapeDtypeStruct((4, 64), SCORE_DTYPES[op])
    lengths = jax.ShapeDtypeStruct((4,), jnp.int32)
    with _lowering.forced_fallback(False):
        with pytest.warns(UserWarning, match="no CUDA extension"):
            exported = jax.export.export(jitted(op, k=8), platforms=["cuda"])(scores, lengths)
        with warnings.catch_warnings(record=True) as later:
            warnings.simplefilter("always")
            jax.export.export(jitted(op, k=9), platforms=["cuda"])(scores, lengths)
    assert not [w for w in later if "no CUDA extension" in str(w.message)]
    assert not our_custom_calls(exported.mlir_module())


def test_row_sharding_with_the_fallback():
    """sharding_check.py (8 host devices, row-sharded calls equal the unsharded ones, no
    all-gather of the scores), run in its own process with the fallback forced."""
    script = (
        "import runpy, jax_topk._lowering as lowering\n"
        "with lowering.forced_fallback():\n"
        "    runpy.run_module('tests.checks.sharding', run_name='__main__')\n"
    )
    stdout = run_python(
        "-c", script, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=8"
    )
    assert "no all-gather of scores" in stdout
