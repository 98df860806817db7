"""The FFI custom call: target registration and per-platform lowering.

`ffi_call_p` is the innermost primitive: it is bound only inside the (possibly
partitioned) lowering of the public primitives, on 2-D operands, and lowers to the
custom call `jax_topk_bf16` or `jax_topk_filtered`. On CUDA the filtered kernel also
needs a device workspace: the lowering adds it as a second result of the custom call
and drops it, so it never reaches the user and no host allocation happens per call.
"""

from __future__ import annotations

import importlib

import jax
import numpy as np
from jax.extend import core
from jax.interpreters import mlir

from . import _jax_topk_cpu
from ._checks import output_shape

TARGETS = {"topk_bf16": "jax_topk_bf16", "topk_filtered": "jax_topk_filtered"}


def _register(module, platform: str) -> None:
    for name, capsule in module.registrations().items():
        jax.ffi.register_ffi_target(name, capsule, platform=platform)


_register(_jax_topk_cpu, "cpu")

try:  # the CUDA extension is built only where a CUDA compiler was found
    _jax_topk_cuda = importlib.import_module("jax_topk._jax_topk_cuda")
except ImportError:
    _jax_topk_cuda = None
else:
    _register(_jax_topk_cuda, "CUDA")

HAS_CUDA_EXTENSION = _jax_topk_cuda is not None


def filtered_workspace_bytes(rows: int, width: int, k: int) -> int:
    return int(_jax_topk_cpu.filtered_workspace_bytes(rows, width, k))


ffi_call_p = core.Primitive("jax_topk_ffi_call")


ffi_call_p.def_abstract_eval(output_shape)


def _attributes(k, log2_page_size, sorted, has_page_table, has_table_rows, has_num_valid_rows):
    return dict(k=np.int32(k), log2_page_size=np.int32(log2_page_size), sorted=np.bool_(sorted),
                has_page_table=np.bool_(has_page_table), has_table_rows=np.bool_(has_table_rows),
                has_num_valid_rows=np.bool_(has_num_valid_rows))


def _lowering(ctx, *operands, op, with_workspace, **params):
    if with_workspace:
        rows, width = ctx.avals_in[0].shape
        workspace = jax.core.ShapedArray(
            (filtered_workspace_bytes(rows, width, params["k"]),), np.uint8)
        ctx = ctx.replace(avals_out=[*ctx.avals_out, workspace])
    results = jax.ffi.ffi_lowering(TARGETS[op])(ctx, *operands, **_attributes(**params))
    return results[:1]


def _cpu_lowering(ctx, *operands, op, **params):
    return _lowering(ctx, *operands, op=op, with_workspace=False, **params)


def _cuda_lowering(ctx, *operands, op, **params):
    if not HAS_CUDA_EXTENSION:
        raise RuntimeError(
            f"jax_topk.{op}: this build of jax_topk has no CUDA extension (no CUDA compiler was "
            "found when it was built); reinstall with nvcc on the PATH, or run on the CPU")
    return _lowering(ctx, *operands, op=op, with_workspace=op == "topk_filtered", **params)


mlir.register_lowering(ffi_call_p, _cpu_lowering, platform="cpu")
mlir.register_lowering(ffi_call_p, _cuda_lowering, platform="cuda")
