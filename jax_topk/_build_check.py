"""The import-time check that the installed jaxlib can run this build's handlers.

The extensions are compiled against one jaxlib's XLA FFI headers (recorded by the build in
`_build_info.JAXLIB_VERSION`). A newer runtime accepts handlers built against older headers; an
older one rejects them, and once one rejected handler is registered every JAX operation fails,
`jnp.ones(3).sum()` included. So an older jaxlib stops `import jax_topk` here, before anything
is registered, and JAX stays usable.
"""

from __future__ import annotations

import os
import re

import jaxlib.version

try:
    from . import _build_info
except ImportError as error:  # a source tree, not an installed build
    raise ImportError(
        f"jax_topk at {os.path.dirname(__file__)} is not built (no _build_info.py): install it "
        f"(pip install -e .), or import it from outside its source tree"
    ) from error


def release(version: str) -> tuple[int, ...]:
    """The leading numeric release of a version string: "0.10.2.dev20260101" -> (0, 10, 2)."""
    match = re.match(r"\d+(\.\d+)*", version)
    return tuple(int(part) for part in match.group(0).split(".")) if match else ()


def require_jaxlib_of_build(installed: str = jaxlib.version.__version__) -> None:
    built = _build_info.JAXLIB_VERSION
    if release(installed) < release(built):
        raise ImportError(
            f"jax_topk was built against jaxlib {built}, but jaxlib {installed} is installed, "
            f"whose XLA FFI runtime would reject jax_topk's handlers (and then fail every JAX "
            f'operation). Either upgrade jaxlib: pip install "jaxlib>={built}"; or rebuild '
            f"jax_topk from its source against the installed jaxlib: pip install "
            f"--no-build-isolation --no-deps --force-reinstall PATH_TO_JAX_TOPK_SOURCE"
        )
