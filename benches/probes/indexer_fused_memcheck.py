"""Small cases of indexer_topk's fused CUDA path for compute-sanitizer (every route: rows kept
whole, sampled rows, rows recomputed for the exact route; bf16 and fp8, one query row and
several, a batch): each checked against topk_filtered(indexer_logits). Run as
`XLA_PYTHON_CLIENT_ALLOCATOR=platform compute-sanitizer --tool memcheck python3 -m
benches.probes.indexer_fused_memcheck` (one allocation a buffer, so that memcheck sees its end).
"""

from __future__ import annotations

import os

import numpy as np

os.environ["JAX_TOPK_INDEXER_TOPK"] = "fused"

import jax_topk  # noqa: E402
from tests.support.indexer import FP8, logits_then_topk, make_inputs, run  # noqa: E402

CASES = [  # (queries, n, k, family, dtype)
    (6, 9000, 2048, "normal", None),
    (6, 9000, 512, "all_negative", None),
    (1, 20000, 2048, "normal", None),
    (5, 20000, 64, "repeated_keys", FP8),
    (3, 700, 64, "periodic", None),
]


def main() -> int:
    rng = np.random.default_rng(0)
    for queries, n, k, family, dtype in CASES:
        q, keys, weights = make_inputs(
            rng, queries, 64, 128, n, family=family, **({"dtype": dtype} if dtype else {})
        )
        lengths = rng.integers(0, n + 1, size=queries).astype(np.int32)
        lengths[0] = n
        scales = rng.uniform(0.1, 2.0, size=n).astype(np.float32) if dtype else None
        kwargs = dict(lengths=lengths, k=k, key_scales=scales)
        got = run(jax_topk.indexer_topk, "gpu", q, keys, weights, **kwargs)
        want = run(logits_then_topk, "gpu", q, keys, weights, **kwargs)
        print(queries, n, k, family, "equal" if np.array_equal(got, want) else "DIFFERENT")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
