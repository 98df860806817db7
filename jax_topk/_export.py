"""What `jax.export` needs to serialize a function that calls jax_topk's handlers.

JAX refuses to export a custom call whose target it does not know to be stable unless the
caller disables that check for the target by name. A jax_topk call lowered for the CPU or
CUDA is such a custom call (elsewhere it lowers to plain JAX and needs nothing). The
targets and their attributes are this release's: load an artifact with the same jax_topk
version installed (and imported, which registers the handlers)."""

from __future__ import annotations

import jax

from . import _jax_topk_cpu


def export_disabled_checks() -> list:
    """`disabled_checks` for `jax.export.export` covering every jax_topk handler:

    jax.export.export(jax.jit(fn), platforms=["cuda"],
                      disabled_checks=jax_topk.export_disabled_checks())
    """
    return [
        jax.export.DisabledSafetyCheck.custom_call(name)
        for name in sorted(_jax_topk_cpu.registrations())
    ]
