// The f16 copies of fp8 q and keys that indexer_logits' tensor-core kernel reads when a call has
// enough queries: each query tile reads every key, so widening them once (one pass over q and
// the keys) costs less than widening each key tile in shared memory for every query tile, which
// is on the kernel's critical path (benches/NOTES.md "indexer_logits fp8: widened once"). A pure
// function of the shapes: compiled into the CPU module (the JAX lowering sizes the workspace
// with it) and into the kernels, which lay the copies out by it.
#pragma once

#include <cstdint>

namespace jax_topk {

// From this many queries a sequence (16 query tiles of 4) the copies pay (measured: NOTES).
constexpr int64_t kIndexerWidenedMinQueries = 64;

// Bytes of the copies (q [B, M, H, D] then keys [B, N, D], 2 bytes an element; the keys start
// at a multiple of 256 bytes), or 0 where the kernel widens in shared memory instead: bf16
// inputs, fewer queries, or a shape the tensor-core kernel does not take (H = 64, D = 128,
// N < 2^25). (A GPU other than sm_90 gets the workspace and leaves it unread.)
constexpr int64_t IndexerWidenedBytes(bool fp8, int64_t batch, int64_t queries, int64_t heads,
                                      int64_t head_dim, int64_t keys_count) {
  constexpr int64_t kMostKeys = 0x7FFFFFFF / 64;  // the kernel's limit (IndexerLogitsWgmmaSupports)
  if (!fp8 || queries < kIndexerWidenedMinQueries || heads != 64 || head_dim != 128 ||
      keys_count > kMostKeys || queries > 0x7FFFFFFF)
    return 0;
  return 2 * batch * (queries * heads + keys_count) * head_dim;
}

// Where the copies start in indexer_topk's logits workspace: after the [rows][N] float32 logits
// of the unfused path, at a multiple of 256 bytes.
constexpr int64_t IndexerWidenedOffsetAfterLogits(int64_t rows, int64_t keys_count) {
  return (4 * rows * keys_count + 255) / 256 * 256;
}

// Where the widened keys start in the copies.
constexpr int64_t IndexerWidenedKeysOffset(int64_t batch, int64_t queries, int64_t heads,
                                           int64_t head_dim) {
  return 2 * batch * queries * heads * head_dim;
}

}  // namespace jax_topk
