// One top-k call as plain pointers and sizes: the contract between the FFI bindings (which
// decode XLA buffers into it) and the algorithms (CPU in cpu/topk_cpu.cc, CUDA in
// kernels/topk_*.cu), which know nothing of XLA.
#pragma once

#include <cstddef>
#include <cstdint>

namespace jax_topk {

// The scores' element type. Every algorithm compares ordered keys of the raw bits
// (common/topk_common.h); the 16-bit types share one key transform and differ in NaN.
enum class ScoreType : int32_t { kFloat32, kBfloat16, kFloat16 };

struct TopkProblem {
  const void* scores = nullptr;  // [rows, width], row-major, elements of score_type
  ScoreType score_type = ScoreType::kFloat32;
  int64_t rows = 0;
  int64_t width = 0;                 // n, the allocated row length
  const int32_t* lengths = nullptr;  // [rows], clamped with ClampLength; nullptr: rows whole
  int32_t k = 1;                     // 1 <= k <= kMaxK (checked at trace time)
  bool sorted = false;               // false: ascending columns; true: value desc, column asc

  // Page transform; page_table == nullptr means the identity.
  const int32_t* page_table = nullptr;  // [table_count, pages]
  int64_t table_count = 0;
  int64_t pages = 0;
  int32_t log2_page_size = 0;
  const int32_t* table_rows = nullptr;  // [rows] or nullptr (then table row = score row)

  // Valid rows; num_valid_rows == nullptr means all rows are valid (see RowIsValid).
  const int32_t* num_valid_rows = nullptr;  // [rows / rows_per_group]
  int64_t rows_per_group = 1;

  int32_t* out = nullptr;  // [rows, k]
  // [rows, k] in score_type: the value of each selected column (-inf in -1 slots), written
  // where the winners are written; nullptr when only the indices are wanted.
  void* values = nullptr;
};

}  // namespace jax_topk
