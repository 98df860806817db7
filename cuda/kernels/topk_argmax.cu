// topk_argmax: exact top-1 (k = 1) of float32, bfloat16 or float16 rows of any width, one
// 256-thread block a row (docs/contract.md: the largest value, ties to the lowest column, NaN
// never selected, -1 and -inf for a row with none). Per row:
//  1. Each thread reads its columns in increasing order (16-byte loads, kUnroll in flight; element
//     loads before the row's first 16-byte boundary and past its last whole vector) and keeps the
//     first column of its largest ordered key: a strictly larger key replaces, so the lowest
//     column of a tie stays.
//  2. The block's winner is the largest (key << 32 | ~column) over its threads (warp shuffles,
//     then one warp over the warps' winners): larger key first, then lower column.
// The filtered and short-row kernels pay a sample, histograms and block scans for each row: at
// k = 1 on many short rows they ran 3-4x slower than jax.lax.top_k's argmax (benches/NOTES.md
// "top_k off the grid"). Here a row is one read and two reductions. Traffic: each score read
// once, one index (and value) written a row; no workspace.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "common/topk_common.h"
#include "kernels/topk_cuda.h"

namespace jax_topk {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kUnroll = 8;  // 16-byte loads in flight a thread: 32 KB a block

// A score type's raw bits as ordered keys; key 0 (below every real value's key) marks NaN, the
// only value that may not win.
template <ScoreType kType>
struct ArgmaxScores;
template <>
struct ArgmaxScores<ScoreType::kFloat32> {
  using Bits = uint32_t;
  __device__ static uint32_t Key(Bits bits) { return IsNanF32(bits) ? 0u : OrderedKeyF32(bits); }
  __device__ static void WriteValue(void* values, int64_t row, uint32_t key) {
    static_cast<uint32_t*>(values)[row] = key == 0 ? kNegInfF32Bits : BitsFromOrderedKeyF32(key);
  }
};
template <bool kBfloat16, uint16_t kNegInfBits>
struct SixteenBitArgmax {
  using Bits = uint16_t;
  __device__ static uint32_t Key(Bits bits) {
    const bool nan = kBfloat16 ? IsNanBf16(bits) : IsNanF16(bits);
    return nan ? 0u : OrderedKeyBf16(bits);
  }
  __device__ static void WriteValue(void* values, int64_t row, uint32_t key) {
    static_cast<uint16_t*>(values)[row] = key == 0 ? kNegInfBits : BitsFromOrderedKeyBf16(key);
  }
};
template <>
struct ArgmaxScores<ScoreType::kBfloat16> : SixteenBitArgmax<true, kNegInfBf16Bits> {};
template <>
struct ArgmaxScores<ScoreType::kFloat16> : SixteenBitArgmax<false, kNegInfF16Bits> {};

// A thread's best so far: its largest key and the first column that holds it.
struct Best {
  uint32_t key = 0;
  uint32_t column = 0;
  __device__ void Offer(uint32_t offered_key, uint32_t offered_column) {
    if (offered_key > key) {
      key = offered_key;
      column = offered_column;
    }
  }
};

// The 16-byte vector's elements, in column order.
template <typename Bits>
__device__ __forceinline__ Bits ElementOf(const uint4& vector, int e) {
  const uint32_t words[4] = {vector.x, vector.y, vector.z, vector.w};
  if constexpr (sizeof(Bits) == 4) {
    return words[e];
  } else {
    return static_cast<Bits>(words[e / 2] >> (16 * (e % 2)));
  }
}

template <ScoreType kType>
__global__ void __launch_bounds__(kThreads) TopkArgmaxKernel(const TopkProblem problem) {
  using Scores = ArgmaxScores<kType>;
  using Bits = typename Scores::Bits;
  constexpr int kPerVector = 16 / static_cast<int>(sizeof(Bits));
  __shared__ unsigned long long warp_best[kWarps];
  const int64_t row = blockIdx.x;
  const bool valid_row = RowIsValid(row, problem.num_valid_rows, problem.rows_per_group);
  const int64_t length =
      !valid_row ? 0
                 : (problem.lengths != nullptr ? ClampLength(problem.lengths[row], problem.width)
                                               : problem.width);
  const Bits* const row_scores = static_cast<const Bits*>(problem.scores) + row * problem.width;

  Best best;
  // A row need not start on 16 bytes (its width times the element size): its first `head`
  // elements, up to the first 16-byte boundary, are read one at a time, then whole vectors, then
  // the tail past the last whole vector. Each thread's columns still rise.
  const uintptr_t address = reinterpret_cast<uintptr_t>(row_scores);
  const int64_t head = min(length, static_cast<int64_t>((16 - address % 16) % 16 / sizeof(Bits)));
  if (threadIdx.x < head) {
    best.Offer(Scores::Key(row_scores[threadIdx.x]), static_cast<uint32_t>(threadIdx.x));
  }
  const int64_t vectors = (length - head) / kPerVector;
  const uint4* const row_vectors = reinterpret_cast<const uint4*>(row_scores + head);
  for (int64_t first = threadIdx.x; first < vectors; first += kThreads * kUnroll) {
    uint4 loaded[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = first + u * kThreads;
      loaded[u] = v < vectors ? __ldcs(row_vectors + v) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = first + u * kThreads;
      if (v >= vectors) break;
      // Columns fit 32 bits (width <= INT_MAX): 32-bit arithmetic, fewer instructions an element.
      const uint32_t first_column = static_cast<uint32_t>(head + v * kPerVector);
#pragma unroll
      for (int e = 0; e < kPerVector; ++e) {
        best.Offer(Scores::Key(ElementOf<Bits>(loaded[u], e)), first_column + e);
      }
    }
  }
  for (int64_t column = head + vectors * kPerVector + threadIdx.x; column < length;
       column += kThreads) {
    best.Offer(Scores::Key(row_scores[column]), static_cast<uint32_t>(column));
  }

  // Larger key first, then lower column; 0 (no candidate) below every real one.
  unsigned long long packed =
      best.key == 0 ? 0ull : (uint64_t{best.key} << 32) | (0xFFFFFFFFu - best.column);
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    packed = max(packed, __shfl_xor_sync(0xFFFFFFFFu, packed, offset));
  }
  const int lane = threadIdx.x % 32;
  if (lane == 0) warp_best[threadIdx.x / 32] = packed;
  __syncthreads();
  if (threadIdx.x >= 32) return;
  packed = lane < kWarps ? warp_best[lane] : 0ull;
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    packed = max(packed, __shfl_xor_sync(0xFFFFFFFFu, packed, offset));
  }
  if (lane != 0) return;
  const uint32_t key = static_cast<uint32_t>(packed >> 32);
  const int32_t column = static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(packed));
  problem.out[row] =
      key == 0 ? kEmptySlot
               : PageTransform(column, PageTableRow(problem, row), problem.log2_page_size);
  if (problem.values != nullptr) Scores::WriteValue(problem.values, row, key);
}

}  // namespace

bool TopkArgmaxServes(const TopkProblem& problem) {
  // One block a row: the grid holds at most INT_MAX rows (the filtered queue takes more).
  if (problem.k != 1 || problem.rows > INT_MAX) return false;
  // Benchmarks and tests: "off" or "always" (every k = 1 call), read at each launch.
  const char* mode = std::getenv("JAX_TOPK_ARGMAX");
  if (mode != nullptr && std::strcmp(mode, "off") == 0) return false;
  if (mode != nullptr && std::strcmp(mode, "always") == 0) return true;
  // Measured (benches/NOTES.md "top_k off the grid"): rows of <= 16384 columns are one read
  // whatever their number (3-9x faster than the other kernels); longer float32 rows when there
  // are enough of them to keep HBM busy 32 KB a block at a time; fewer long rows, and long 16-bit
  // rows (whose per-element instructions bind here), run faster on the kernels that spread a row
  // over several SMs or filter it by a sample.
  if (problem.width <= kArgmaxAnyRowsWidth) return true;
  return problem.score_type == ScoreType::kFloat32 && problem.rows >= kArgmaxMinRows;
}

cudaError_t LaunchTopkArgmax(const TopkProblem& problem, cudaStream_t stream) {
  if (problem.rows == 0) return cudaSuccess;
  if (problem.rows < 0 || problem.rows > INT_MAX || problem.width < 1 ||
      problem.width > kMaxWidth || problem.k != 1 ||
      (problem.num_valid_rows != nullptr && problem.rows_per_group < 1)) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid(static_cast<unsigned int>(problem.rows));
  switch (problem.score_type) {
    case ScoreType::kFloat32:
      TopkArgmaxKernel<ScoreType::kFloat32><<<grid, kThreads, 0, stream>>>(problem);
      break;
    case ScoreType::kBfloat16:
      TopkArgmaxKernel<ScoreType::kBfloat16><<<grid, kThreads, 0, stream>>>(problem);
      break;
    case ScoreType::kFloat16:
      TopkArgmaxKernel<ScoreType::kFloat16><<<grid, kThreads, 0, stream>>>(problem);
      break;
  }
  return cudaGetLastError();
}

}  // namespace jax_topk
