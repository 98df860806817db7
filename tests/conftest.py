"""The fixtures every test file shares: the operator and the backend.

Every contract test runs on the CPU (its handlers), on the CPU again with the pure-JAX
lowering forced (`fallback`: what every platform without our handlers runs), and on the GPU
when JAX sees one (the `gpu` marker); without a GPU those runs are skipped, not failed.
Helpers live in tests/support."""

from __future__ import annotations

import os

# Each pytest-xdist worker is its own JAX process: with JAX's default (75 % of the GPU's memory
# taken at start) the second worker gets none and its tests never run.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import pytest  # noqa: E402

from jax_topk import _lowering  # noqa: E402
from tests.support.operators import OPS, gpu_devices  # noqa: E402

BACKENDS = [
    pytest.param("cpu", id="cpu"),
    pytest.param("fallback", id="fallback"),
    pytest.param(
        "gpu",
        id="gpu",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(not gpu_devices(), reason="no GPU visible to JAX"),
        ],
    ),
]


@pytest.fixture(params=BACKENDS)
def backend(request):
    if request.param == "fallback":
        with _lowering.forced_fallback():
            yield request.param
    else:
        yield request.param


@pytest.fixture(params=list(OPS))
def op(request):
    return request.param
