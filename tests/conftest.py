"""The fixtures every test file shares: the operator and the backend.

Every contract test runs on the CPU, and again on the GPU when JAX sees one (the `gpu`
marker); without a GPU those runs are skipped, not failed. Helpers live in tests/support."""

from __future__ import annotations

import pytest

from tests.support.operators import OPS, gpu_devices

BACKENDS = [
    pytest.param("cpu", id="cpu"),
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
    return request.param


@pytest.fixture(params=list(OPS))
def op(request):
    return request.param
