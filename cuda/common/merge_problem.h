// One merge_topk call as plain pointers and sizes: the contract between the FFI bindings
// (ffi/merge_ffi.h decodes XLA buffers into it) and the algorithms (cpu/merge_cpu.cc,
// kernels/merge_topk.cu), which know nothing of XLA.
//
// Each row holds `width` candidates (value, global column). A candidate counts iff its
// column is >= 0 (-1 marks an empty slot) and its value is not NaN. The k winners rank by
// (ordered key descending, column ascending); sorted == false writes them by (column
// ascending, key descending). Slots past the candidates hold column -1 and value -inf.
#pragma once

#include <cstdint>

#include "common/topk_common.h"
#include "common/topk_problem.h"

namespace jax_topk {

// The merge kernel's longest candidate list: 64 lists of kMaxK candidates a row.
constexpr int64_t kMaxMergeWidth = 64 * int64_t{kMaxK};

struct MergeProblem {
  const void* values = nullptr;      // [rows, width] of score_type
  const int32_t* indices = nullptr;  // [rows, width], global columns, -1 for none
  ScoreType score_type = ScoreType::kFloat32;
  int64_t rows = 0;
  int64_t width = 0;  // m, candidates a row
  int32_t k = 1;      // 1 <= k <= min(width, kMaxK) (checked at trace time)
  bool sorted = true;
  void* out_values = nullptr;      // [rows, k] of score_type
  int32_t* out_indices = nullptr;  // [rows, k]
};

// The order of two candidates given by their ordered keys and columns: true when a ranks
// before b. Equal in both means the same (value, column): either may be taken.
TOPK_HOST_DEVICE bool RanksBefore(uint32_t key_a, int32_t column_a, uint32_t key_b,
                                  int32_t column_b) {
  return key_a != key_b ? key_a > key_b : column_a < column_b;
}

}  // namespace jax_topk
