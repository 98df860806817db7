// One lightning-indexer call as plain pointers and sizes (docs/contract.md section 9): the
// contract between the FFI bindings and the algorithms (CPU in cpu/indexer_cpu.cc, CUDA in
// kernels/indexer_logits*.cu), which know nothing of XLA.
//
//   logits[b,t,s] = sum_h weights[b,t,h] * max(0, key_scales[b,s] * dot(q[b,t,h], keys[b,s]))
//
// for s < L_t = clamp(lengths[b, t], 0, n); -inf for s >= L_t. Products and sums in float32.
#pragma once

#include <cstddef>
#include <cstdint>

namespace jax_topk {

// q and keys share one element type.
enum class IndexerInput : int32_t { kBfloat16, kFloat8E4M3 };

struct IndexerProblem {
  IndexerInput input = IndexerInput::kBfloat16;
  int64_t batch = 1;       // independent sequences (vmap): every array has this leading dim
  int64_t queries = 0;     // M
  int64_t heads = 0;       // H
  int64_t head_dim = 0;    // D
  int64_t keys_count = 0;  // N, the logits' row length

  const void* q = nullptr;            // [batch, M, H, D], row-major, elements of `input`
  const void* keys = nullptr;         // [batch, N, D]
  const float* weights = nullptr;     // [batch, M, H]
  const float* key_scales = nullptr;  // [batch, N], or nullptr: every scale is 1
  const int32_t* lengths = nullptr;   // [batch, M], or nullptr: every L_t = N

  float* logits = nullptr;  // [batch, M, N]
  // Device memory the CUDA path may use for f16 copies of fp8 q and keys: it does where the
  // shape asks for them and they fit (IndexerWidenedBytes, common/indexer_widened.h), else it
  // widens them in shared memory.
  void* widened = nullptr;
  size_t widened_capacity = 0;  // bytes at `widened`
};

}  // namespace jax_topk
