"""jax_topk: exact row-wise top-k for sparse-attention indexers, as JAX operations."""

from ._build_check import require_jaxlib_of_build

require_jaxlib_of_build()  # before _api registers any handler

from ._api import topk_bf16, topk_filtered

__all__ = ["topk_bf16", "topk_filtered"]
__version__ = "0.1.0"
