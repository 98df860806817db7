"""The operators under test, the score dtype each takes, running one under jit on a backend
with its arrays placed there, and the kernels' dispatch switches set around a call."""

from __future__ import annotations

import contextlib
import os

import jax
import jax.numpy as jnp
import numpy as np

import jax_topk

from . import families

OPS = {"topk_bf16": jax_topk.topk_bf16, "topk_filtered": jax_topk.topk_filtered}
SCORE_DTYPES = {"topk_bf16": "bfloat16", "topk_filtered": "float32"}


def gpu_devices():
    try:
        return jax.devices("gpu")
    except RuntimeError:
        return []


def device_for(backend):
    """The device a backend runs on: `fallback` is the CPU with the pure-JAX lowering."""
    return gpu_devices()[0] if backend == "gpu" else jax.devices("cpu")[0]


def make_scores(op, rng, shape, family="normal"):
    """Scores of one value family in the dtype `op` takes."""
    return families.make(family, rng, shape, SCORE_DTYPES[op])


def run_op(op, backend, scores, lengths, **kwargs):
    """Runs an operator under jit on one backend (run_on), the arrays placed there; the page
    table, table rows and num_valid_rows traced, every other keyword static."""
    traced_names = ("page_table", "table_rows", "num_valid_rows")
    traced = {n: np.asarray(v) for n, v in kwargs.items() if n in traced_names and v is not None}
    static = {n: v for n, v in kwargs.items() if n not in traced}
    call = lambda s, lens, t: OPS[op](s, lens, **t, **static)  # noqa: E731
    return run_on(backend, call, scores, np.asarray(lengths), traced)


def run_on(backend, fn, *arrays):
    """fn(*arrays) under jit on one backend, its arrays placed there; the results as NumPy (a
    pytree like fn's)."""
    out = jax.jit(fn)(*jax.device_put(arrays, device_for(backend)))
    return jax.tree.map(np.asarray, out)


@contextlib.contextmanager
def kernel_switches(**values):
    """The CUDA handlers' switches (JAX_TOPK_*, read at each launch) set for a block, then
    restored."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def permuted_page_table(rng, table_rows, pages):
    """Each table row a random permutation of distinct physical pages."""
    return np.stack([rng.permutation(pages * 4)[:pages] for _ in range(table_rows)]).astype(
        np.int32
    )


# Trace-time errors of the arguments every selecting operator shares, as (overrides, error,
# words in the message) for calls of 4 score rows of n = 64: k's range and type, and the page
# table's checks (docs/contract.md section 5).
K_ERRORS = [
    (dict(k=0), ValueError, ["k=0", "2048"]),
    (dict(k=2049), ValueError, ["k=2049", "2048"]),
    (dict(k=3.0), TypeError, ["k"]),
]
PAGE_TABLE_ERRORS = [
    (
        dict(page_size=3, page_table=jnp.zeros((4, 64), jnp.int32)),
        ValueError,
        ["page_size=3", "power of two"],
    ),
    (
        dict(page_table=jnp.zeros((4, 3), jnp.int32), page_size=16),
        ValueError,
        ["page_table", "3 * 16", "n = 64"],
    ),
    (dict(page_table=jnp.zeros((5, 64), jnp.int32)), ValueError, ["page_table", "(5, 64)"]),
    (dict(table_rows=jnp.zeros((4,), jnp.int32)), ValueError, ["table_rows", "page_table"]),
    (dict(page_table=jnp.zeros((4, 64), jnp.float32)), TypeError, ["page_table", "int32"]),
]
