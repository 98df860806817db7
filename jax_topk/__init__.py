"""jax_topk: exact row-wise top-k for JAX, as XLA FFI custom calls: the sparse-attention
indexer operators, the lightning indexer (`indexer_logits`, `indexer_topk`),
`top_k`, the drop-in for `jax.lax.top_k`, and `merge_topk`, the exact
merge of candidate lists."""

from ._build_check import require_jaxlib_of_build

require_jaxlib_of_build()  # before _api registers any handler

from ._api import topk_bf16, topk_filtered  # noqa: E402 (after the jaxlib check)
from ._export import export_disabled_checks  # noqa: E402
from ._indexer import indexer_logits, indexer_topk  # noqa: E402
from ._merge import merge_topk  # noqa: E402
from ._top_k import top_k  # noqa: E402

__all__ = [
    "export_disabled_checks",
    "indexer_logits",
    "indexer_topk",
    "merge_topk",
    "top_k",
    "topk_bf16",
    "topk_filtered",
]
__version__ = "0.1.0"
