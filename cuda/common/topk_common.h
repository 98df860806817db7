// The rules both backends share, so the CPU reference and the CUDA kernels cannot drift:
// the ordered key (IEEE total order as an unsigned compare), NaN detection, the clamping
// of runtime values, and the page transform. Header-only; compiled by g++ and nvcc alike.
#pragma once

#include <cstdint>

#include "common/topk_problem.h"

#if defined(__CUDACC__)
#define TOPK_HOST_DEVICE __host__ __device__ __forceinline__ constexpr
#else
#define TOPK_HOST_DEVICE inline constexpr
#endif

namespace jax_topk {

constexpr int kMaxK = 2048;                // both operators: 1 <= k <= kMaxK
constexpr int kMaxBf16Width = 16384;       // topk_bf16: a whole row fits one block's registers
constexpr int64_t kMaxWidth = 2147483647;  // int32 column indices
// The small-row kernel (top_k): a warp a row, the row in its registers, a few winners; past
// kSmallRowsMaxKByRounds winners it finds them by radix digits, which pay from hundreds of rows.
constexpr int kSmallRowsMaxWidth = 1024;
constexpr int kSmallRowsMaxK = 64;
constexpr int kSmallRowsMaxKByRounds = 32;
constexpr int32_t kEmptySlot = -1;  // output slots past the number of candidates

// Ordered keys: unsigned compare of the key == IEEE total order of the value
// (-NaN < -inf < ... < -0 < +0 < ... < +inf < +NaN). Negative values have all bits flipped
// (so larger magnitudes sort lower); non-negative values get the sign bit set (above all
// negatives). NaN never reaches a comparison: it is filtered out first.
TOPK_HOST_DEVICE uint32_t OrderedKeyF32(uint32_t bits) {
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}
TOPK_HOST_DEVICE uint32_t OrderedKeyBf16(uint16_t bits) {
  return (bits & 0x8000u) ? (~bits & 0xFFFFu) : (bits | 0x8000u);
}
// The inverse transforms (key -> raw bits), for kernels that turn a key boundary into a value.
TOPK_HOST_DEVICE uint32_t BitsFromOrderedKeyF32(uint32_t key) {
  return (key & 0x80000000u) ? (key & 0x7FFFFFFFu) : ~key;
}
TOPK_HOST_DEVICE uint16_t BitsFromOrderedKeyBf16(uint32_t key) {
  return static_cast<uint16_t>((key & 0x8000u) ? (key & 0x7FFFu) : (~key & 0xFFFFu));
}
TOPK_HOST_DEVICE bool IsNanF32(uint32_t bits) {
  return (bits & 0x7FFFFFFFu) > 0x7F800000u;
}
TOPK_HOST_DEVICE bool IsNanBf16(uint16_t bits) {
  return (bits & 0x7FFFu) > 0x7F80u;
}
// float16 orders by the same sign-magnitude transform as bfloat16 (OrderedKeyBf16 serves
// both); only its NaN differs: a 5-bit exponent, so NaN is above 0x7C00 (+inf).
TOPK_HOST_DEVICE bool IsNanF16(uint16_t bits) {
  return (bits & 0x7FFFu) > 0x7C00u;
}
// -inf's bits, written as the value of an empty (-1) slot.
constexpr uint32_t kNegInfF32Bits = 0xFF800000u;
constexpr uint16_t kNegInfBf16Bits = 0xFF80u;
constexpr uint16_t kNegInfF16Bits = 0xFC00u;

// Row r selects among columns [0, L_r), L_r = clamp(lengths[r], 0, width).
TOPK_HOST_DEVICE int64_t ClampLength(int32_t length, int64_t width) {
  return length < 0 ? 0 : (length > width ? width : static_cast<int64_t>(length));
}

// Rows come in equal groups of rows_per_group consecutive rows (one group in the plain case,
// one per vmapped call, finer pieces on a shard); row r is valid iff r % rows_per_group <
// clamp(num_valid_rows[group], 0, rows_per_group). A null num_valid_rows means every row is valid.
TOPK_HOST_DEVICE bool RowIsValid(int64_t row, const int32_t* num_valid_rows,
                                 int64_t rows_per_group) {
  if (num_valid_rows == nullptr) return true;
  const int64_t group = row / rows_per_group;
  const int64_t limit = num_valid_rows[group];
  return row - group * rows_per_group < limit;  // a negative limit validates nothing
}

// Which page-table row serves score row r: table_rows[r] clamped into [0, table_count),
// or r itself when there is no table_rows (the shape rule makes the table one row per row).
TOPK_HOST_DEVICE int64_t TableRowFor(int64_t row, const int32_t* table_rows, int64_t table_count) {
  if (table_rows == nullptr) return row;
  const int64_t t = table_rows[row];
  return t < 0 ? 0 : (t >= table_count ? table_count - 1 : t);
}

// The page-table row that serves score row `row` of `problem`, or nullptr without a table.
TOPK_HOST_DEVICE const int32_t* PageTableRow(const TopkProblem& problem, int64_t row) {
  return problem.page_table == nullptr
             ? nullptr
             : problem.page_table +
                   TableRowFor(row, problem.table_rows, problem.table_count) * problem.pages;
}

// Column j -> page_table_row[j >> log2_page_size] * page_size + (j & (page_size - 1)),
// computed in 64 bits and truncated to int32 like the CPU handler. The shape rule
// guarantees pages * page_size >= width, so j >> log2_page_size is always a valid page.
TOPK_HOST_DEVICE int32_t PageTransform(int32_t column, const int32_t* page_table_row,
                                       int32_t log2_page_size) {
  if (page_table_row == nullptr) return column;
  // Unsigned arithmetic: a negative (unmapped) page wraps the same way on every compiler.
  const uint64_t page =
      static_cast<uint64_t>(static_cast<int64_t>(page_table_row[column >> log2_page_size]));
  const uint64_t offset = static_cast<uint64_t>(column) & ((uint64_t{1} << log2_page_size) - 1);
  return static_cast<int32_t>(static_cast<uint32_t>((page << log2_page_size) + offset));
}

}  // namespace jax_topk
