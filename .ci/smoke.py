"""CI's smoke test of an installed jax_topk (.ci/run): every operator on the CPU against
jax.lax.top_k, and what the build recorded.

    python .ci/smoke.py [--cuda]

--cuda: the CUDA extension must be built and hand JAX a handler for every target the CPU
module has (no GPU needed).
Run from outside the source tree, so that the installed package is the one imported.
"""

from __future__ import annotations

import argparse
import importlib

import jax
import jax.numpy as jnp
import jaxlib.version
import numpy as np

import jax_topk
from jax_topk import _build_info, _jax_topk_cpu


def check_cuda_extension() -> None:
    assert _build_info.CUDA_TOOLKIT, f"no CUDA extension: {_build_info.CUDA_SKIPPED_BECAUSE}"
    module = importlib.import_module("jax_topk._jax_topk_cuda")
    registrations = module.registrations()
    targets = set(_jax_topk_cpu.registrations())
    assert set(registrations) == targets, (sorted(registrations), sorted(targets))
    toolkit = _build_info.CUDA_TOOLKIT
    print(f"CUDA extension built with {toolkit}; registers {sorted(registrations)}")


def check_operators() -> None:
    rows, n, k = 8, 3000, 64
    key_bf16, key_f32 = jax.random.split(jax.random.key(0))
    cases = {
        "topk_bf16": (jax_topk.topk_bf16, jax.random.normal(key_bf16, (rows, n), jnp.bfloat16)),
        "topk_filtered": (jax_topk.topk_filtered, jax.random.normal(key_f32, (rows, n))),
    }
    lengths = jnp.full((rows,), n, jnp.int32)
    for name, (op, scores) in cases.items():
        ours = jax.jit(lambda s, op=op: op(s, lengths, k=k, sorted=True))(scores)
        _, expected = jax.lax.top_k(scores, k)
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(expected), err_msg=name)
        print(f"{name}: {rows} x {n}, k = {k}, equal to jax.lax.top_k")
    for n, k in ((256, 8), (3000, 64), (20000, 64)):  # top_k's three kernels' routes
        scores = jax.random.normal(key_bf16, (rows, n), jnp.bfloat16)
        values, indices = jax.jit(lambda s: jax_topk.top_k(s, k))(scores)
        expected_values, expected = jax.lax.top_k(scores, k)
        np.testing.assert_array_equal(np.asarray(indices), np.asarray(expected))
        np.testing.assert_array_equal(np.asarray(values), np.asarray(expected_values))
        merged = jax_topk.merge_topk(values, indices, k // 2)
        np.testing.assert_array_equal(np.asarray(merged[1]), np.asarray(expected[:, : k // 2]))
        print(f"top_k and merge_topk: {rows} x {n}, k = {k}, equal to jax.lax.top_k")
    q = jax.random.normal(key_bf16, (rows, 4, 32), jnp.bfloat16)
    keys = jax.random.normal(key_f32, (3000, 32), jnp.bfloat16)
    weights = jnp.ones((rows, 4), jnp.float32)
    lengths = jnp.full((rows,), 2500, jnp.int32)
    picked = jax.jit(lambda *a: jax_topk.indexer_topk(*a, k=64))(q, keys, weights, lengths)
    logits = jax.jit(jax_topk.indexer_logits)(q, keys, weights, lengths)
    expected = jax_topk.topk_filtered(logits, lengths, k=64)
    np.testing.assert_array_equal(np.asarray(picked), np.asarray(expected))
    print(f"indexer_topk: {rows} x 3000, k = 64, equal to topk_filtered of indexer_logits")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cuda", action="store_true", help="require the CUDA extension")
    args = parser.parse_args()
    print(
        f"jax {jax.__version__}, jaxlib {jaxlib.version.__version__}; jax_topk built against "
        f"jaxlib {_build_info.JAXLIB_VERSION}, from {jax_topk.__file__}"
    )
    if args.cuda:
        check_cuda_extension()
    check_operators()


if __name__ == "__main__":
    main()
