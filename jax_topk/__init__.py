"""jax_topk: exact row-wise top-k for sparse-attention indexers, as JAX operations."""

from ._api import topk_bf16, topk_filtered

__all__ = ["topk_bf16", "topk_filtered"]
__version__ = "0.1.0"
