"""The FFI custom call: target registration and per-platform lowering.

`ffi_call_p` is the innermost primitive: it is bound only inside the (possibly
partitioned) lowering of the public primitives, on the 2-D `Operands`, and lowers to the
custom call of the operator's FFI target (`_contract.OPERATORS`), with the attributes
`Params.ffi_attributes()` names. Every handler binds two results, the indices and the
values; a call that wants no values gets an empty placeholder in the second. On CUDA an
operator that `needs_workspace` (the filtered kernel) also gets a device workspace. The
lowering adds both as extra results of the custom call and drops them, so they never reach
the user and no host allocation happens per call.

Every other platform (TPU, ROCm, an export for one, CUDA on a build without the CUDA
extension, which warns once) lowers to the pure-JAX `_fallback.ffi_call`, the default
lowering. Tests force it on the CPU and CUDA too with the private context manager
`forced_fallback()`, which clears JAX's caches on entry and exit so that no executable
compiled on the other side of the switch is reused.
"""

from __future__ import annotations

import contextlib
import importlib
import warnings

import jax
import numpy as np
from jax.extend import core
from jax.interpreters import mlir

from . import _compat, _fallback, _jax_topk_cpu
from ._checks import shape_rule
from ._contract import Operands, Params


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


def indexer_topk_workspace_bytes(rows: int, width: int, k: int) -> tuple[int, int]:
    """indexer_topk's CUDA workspaces (logits, selection), in bytes."""
    logits, selection = _jax_topk_cpu.indexer_topk_workspace_bytes(rows, width, k)
    return int(logits), int(selection)


def indexer_widened_bytes(
    fp8: bool, batch: int, queries: int, heads: int, head_dim: int, keys_count: int
) -> int:
    """Bytes of the f16 copies of fp8 q and keys that the CUDA indexer kernel reads (0: it
    widens them in shared memory; cuda/common/indexer_widened.h)."""
    return int(
        _jax_topk_cpu.indexer_widened_bytes(fp8, batch, queries, heads, head_dim, keys_count)
    )


def indexer_widened_offset_after_logits(rows: int, keys_count: int) -> int:
    """Where those copies start in indexer_topk's logits workspace."""
    return int(_jax_topk_cpu.indexer_widened_offset_after_logits(rows, keys_count))


ffi_call_p = core.Primitive("jax_topk_ffi_call")
ffi_call_p.multiple_results = True
ffi_call_p.def_abstract_eval(shape_rule)


def _lowering(ctx, *operands, params: Params, with_workspace: bool):
    scores = Operands(*ctx.avals_in).scores
    extra = []
    if not params.with_values:  # the handlers always bind a values result: an empty one
        extra.append(jax.core.ShapedArray((0,), scores.dtype))
    if with_workspace:
        rows, width = scores.shape
        extra.append(
            jax.core.ShapedArray((filtered_workspace_bytes(rows, width, params.k),), np.uint8)
        )
    if extra:
        ctx = _compat.with_extra_results(ctx, extra)
    target = jax.ffi.ffi_lowering(params.operator.target)
    results = target(ctx, *operands, **params.ffi_attributes())
    return results[: len(params.results)]  # the placeholder and workspace are dropped


_fallback_lowering = mlir.lower_fun(_fallback.ffi_call, multiple_results=True)
_fallback_state = {"forced": False, "warned_no_cuda": False}


@contextlib.contextmanager
def forced_fallback(forced: bool = True):
    """Testing only: inside, the CPU and CUDA lowerings use the pure-JAX fallback (or, with
    forced=False, their handlers again); the previous choice comes back on exit."""
    previous = _fallback_state["forced"]
    jax.clear_caches()
    _fallback_state["forced"] = forced
    try:
        yield
    finally:
        _fallback_state["forced"] = previous
        jax.clear_caches()


def uses_fallback(platform: str, name: str) -> bool:
    """Whether a lowering for `platform` ("cpu" or "cuda") of jax_topk.<name> takes the
    pure-JAX path: forced (testing), or CUDA on a build without the CUDA extension (which
    warns once)."""
    no_cuda = platform == "cuda" and not HAS_CUDA_EXTENSION
    if no_cuda and not _fallback_state["warned_no_cuda"]:
        _fallback_state["warned_no_cuda"] = True
        warnings.warn(
            f"jax_topk.{name}: this build of jax_topk has no CUDA extension (no CUDA "
            "compiler was found when it was built), so it runs as plain JAX on the GPU, exact "
            "but slower; reinstall with a CUDA toolchain for the CUDA kernels",
            stacklevel=3,
        )
    return _fallback_state["forced"] or no_cuda


def _cpu_lowering(ctx, *operands, params: Params):
    if uses_fallback("cpu", params.op):
        return _fallback_lowering(ctx, *operands, params=params)
    return _lowering(ctx, *operands, params=params, with_workspace=False)


def _cuda_lowering(ctx, *operands, params: Params):
    if uses_fallback("cuda", params.op):
        return _fallback_lowering(ctx, *operands, params=params)
    return _lowering(ctx, *operands, params=params, with_workspace=params.operator.needs_workspace)


mlir.register_lowering(ffi_call_p, _fallback_lowering)  # every platform without a handler
mlir.register_lowering(ffi_call_p, _cpu_lowering, platform="cpu")
mlir.register_lowering(ffi_call_p, _cuda_lowering, platform="cuda")
