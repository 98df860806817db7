// topk_f32_rows: exact top-k of float32 rows of at most kF32RowsMaxWidth columns, one block a row
// (1024 threads; 256 when many rows share the SMs, which also takes bfloat16 and float16 rows,
// widened exactly to float32 bits), the row held in registers (topk_filtered's kernel for such
// rows: its sample, pass and selection are a chain of dependent global-memory phases, where here
// one load of the row feeds every phase from registers). Per row:
//  1. LoadRow: thread t keeps columns [t * E, (t + 1) * E) as ordered keys (common/topk_common.h);
//     NaNs and columns past the length become key 0, below every real key (-inf's is 0x007FFFFF).
//  2. A cutoff: every valid key when at most kCandidates are; else the 22-bit prefix of a sampled
//     rank (two keys a thread) a little past k's expected place in the sample.
//  3. The keys at or above the cutoff are gathered in shared memory; if there are k to
//     kCandidates of them, 11+11+10-bit radix digits over them give the k-th key and how many of
//     its ties to take. Otherwise (a fooled sample, crowded ties), and where a block's slices hold
//     no more than kCandidates keys, the same digits run over the registers: the sample only
//     ever decides the speed. A digit whose bin is taken whole (the rank is its last key) ends
//     the search: the pivot is the least key a winner may hold, with no ties to split.
//  4. TakeWinners: (greater, equal) masks against the k-th key and one block scan give each thread
//     its output slot and its share of the tie quota (lowest columns first); the winners are
//     staged in column order, then stored (sorted: a stable block radix sort first).
// Traffic: each score read once; k indices (and values) written a row. No workspace.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "common/topk_common.h"
#include "kernels/f32_rows/register_row.cuh"
#include "kernels/topk_cuda.h"
#include "kernels/topk_scan.cuh"

namespace jax_topk {
namespace {

// Two block shapes, one algorithm: kWideThreads threads for up to kF32RowsMaxWidth columns (few
// rows: the one block is the row's only reader), kManyRowsThreads for rows of at most
// kF32RowsManyMaxWidth columns when there are many of them (four blocks an SM, each row's chain
// of barriers overlapping the others').
constexpr int kWideThreads = 1024;
constexpr int kManyRowsThreads = 256;
static_assert(kF32RowsMaxWidth / kWideThreads == 32, "one bit per element in a 32-bit mask");
static_assert(kF32RowsManyMaxWidth / kManyRowsThreads == 32, "one bit per element, 32 a thread");
// The keys gathered for the exact digits: a row of at most this many valid keys needs no sample.
constexpr int kCandidates = 4096;

template <int kThreads>
struct Shared {
  static constexpr int kWarps = kThreads / 32;
  // Each phase's space is dead before the next phase writes it (a barrier between them).
  union {
    struct {
      uint32_t hist[kDigitBins];
      uint32_t keys[kCandidates];
    } select;
    StagedWinners staged;
    typename WinnerSort<kThreads>::TempStorage sort;
  };
  uint32_t warp_sums[kWarps];
  int gathered;        // keys appended to select.keys
  uint32_t bin;        // the bin search's answer: the bin holding the rank
  uint32_t above;      // the keys in the bins above it
  uint32_t bin_count;  // and in it
};

// One digit of a radix select: finds the bin (from the top) holding the rank-th key of
// hist[0, kDigitBins). Thread t owns the kOwned bins from 2047 - kOwned * t down, so thread order
// is descending bin order and one block scan finds it. Every thread calls it; two barriers.
template <int kThreads>
__device__ __forceinline__ void FindBin(Shared<kThreads>& s, uint32_t rank) {
  constexpr int kOwned = kDigitBins / kThreads;
  static_assert(kOwned * kThreads == kDigitBins, "every bin owned by one thread");
  const int high = kDigitBins - 1 - kOwned * static_cast<int>(threadIdx.x);
  uint32_t owned[kOwned];
  uint32_t owned_count = 0;
#pragma unroll
  for (int i = 0; i < kOwned; ++i) {
    owned[i] = s.select.hist[high - i];
    owned_count += owned[i];
  }
  uint32_t total;
  uint32_t before = BlockExclusiveSum(s.warp_sums, owned_count, total);
  if (before < rank && rank <= before + owned_count) {
#pragma unroll
    for (int i = 0; i < kOwned; ++i) {
      if (rank <= before + owned[i]) {
        s.bin = static_cast<uint32_t>(high - i);
        s.above = before;
        s.bin_count = owned[i];
        break;
      }
      before += owned[i];
    }
  }
  __syncthreads();
}

// The rank-th largest key (1 <= rank <= the keys' count) of the keys for_each_key visits, by
// kDigits radix digits; with fewer than 3 digits, the key's prefix of those digits (low bits 0).
// for_each_key(f) calls f(key) for this thread's share. Every thread calls it with the same rank.
// kStopWhenBinTaken (the pivot of k winners): once the rank is its bin's last key, every key of
// the bin is a winner and the pivot is the least key the winners may hold, minus one, with no
// ties to take; `least` is the least key that was visited (1: the row's zeros, which never win,
// stay in the first bins' prefix 0, where no early stop happens).
template <int kDigits, bool kStopWhenBinTaken, int kThreads, typename ForEachKey>
__device__ __forceinline__ Pivot SelectRank(Shared<kThreads>& s, uint32_t rank,
                                            const ForEachKey& for_each_key, uint32_t least = 1) {
  uint32_t prefix = 0;
  uint32_t prefix_mask = 0;
#pragma unroll
  for (int digit = 0; digit < kDigits; ++digit) {
#pragma unroll
    for (int bin = threadIdx.x; bin < kDigitBins; bin += kThreads) s.select.hist[bin] = 0;
    __syncthreads();
    const int shift = DigitShift(digit);
    const uint32_t mask = DigitMask(digit);
    for_each_key([&](uint32_t key) {
      if ((key & prefix_mask) == prefix) atomicAdd(&s.select.hist[(key >> shift) & mask], 1u);
    });
    __syncthreads();
    FindBin(s, rank);
    prefix |= s.bin << shift;
    prefix_mask |= mask << shift;
    rank -= s.above;
    if (kStopWhenBinTaken && digit + 1 < kDigits && rank == s.bin_count && prefix != 0) {
      return {max(prefix, least) - 1, 0};
    }
  }
  return {prefix, static_cast<int>(rank)};
}

// Phases 2-3: the k-th largest valid key and its tie quota, given `valid` > k valid keys of which
// `sampled` lie in the sample (key[0] and key[kElems / 2] of every thread).
template <int kThreads, int kElems>
__device__ __forceinline__ Pivot FindPivot(Shared<kThreads>& s, const RowKeys<kElems>& row, int k,
                                           int valid, int sampled) {
  const auto row_keys = [&](const auto& visit) {
#pragma unroll
    for (int i = 0; i < kElems; ++i) visit(row.key[i]);
  };
  // Slices no larger than the candidate buffer (so at most kCandidates valid keys): the digits
  // read the registers, as cheap as the gathered keys would be, without the gather.
  if constexpr (kElems * kThreads <= kCandidates) return SelectRank<3, true>(s, k, row_keys);
  uint32_t cutoff = 1;  // every valid key
  if (valid > kCandidates) {
    // The sample's rank for k, plus a slack of ~3 standard deviations (sqrt of the rank) and 16.
    const int expected = static_cast<int>((static_cast<int64_t>(k) * sampled + valid - 1) / valid);
    const int rank = expected + 16 + static_cast<int>(3.0f * sqrtf(static_cast<float>(expected)));
    if (rank >= sampled) return SelectRank<3, true>(s, k, row_keys);
    cutoff = SelectRank<2, false>(s, rank, [&](const auto& visit) {
               visit(row.key[0]);
               visit(row.key[kElems / 2]);
             }).key;
    cutoff = cutoff > 1 ? cutoff : 1;
  }
  // Gather the keys >= cutoff: a warp's share by one atomic (their order does not matter).
  if (threadIdx.x == 0) s.gathered = 0;
  __syncthreads();
  int mine = 0;
#pragma unroll
  for (int i = 0; i < kElems; ++i) mine += row.key[i] >= cutoff;
  const int lane = threadIdx.x % 32;
  const int inclusive = WarpInclusiveSum(mine);
  int base = 0;
  if (lane == 31) base = atomicAdd(&s.gathered, inclusive);
  int slot = __shfl_sync(0xFFFFFFFFu, base, 31) + inclusive - mine;
#pragma unroll
  for (int i = 0; i < kElems; ++i) {
    if (row.key[i] >= cutoff) {
      if (slot < kCandidates) s.select.keys[slot] = row.key[i];
      ++slot;
    }
  }
  __syncthreads();
  const int gathered = s.gathered;
  if (gathered < k || gathered > kCandidates) return SelectRank<3, true>(s, k, row_keys);
  // Every key >= cutoff is gathered, none below: the least a winner may hold is the cutoff.
  return SelectRank<3, true>(
      s, k,
      [&](const auto& visit) {
        for (int j = threadIdx.x; j < gathered; j += kThreads) visit(s.select.keys[j]);
      },
      cutoff);
}

// Phase 4: stages the winners (keys > pivot, then the first `quota` keys == pivot by column) in
// ascending column order. Every thread calls it; two barriers.
template <int kThreads, int kElems>
__device__ __forceinline__ void StageWinners(Shared<kThreads>& s, const RowKeys<kElems>& row,
                                             const Pivot& pivot) {
  const WinnerMasks masks = WinnerMasksOf(row, pivot);
  uint32_t total;
  const uint32_t before = BlockExclusiveSum(s.warp_sums, PackedCounts(masks), total);
  ForEachTaken(row, TakeWinners(masks, before, pivot.quota),
               [&](int position, int32_t column, uint32_t key) {
                 s.staged.columns[position] = column;
                 s.staged.keys[position] = key;
               });
  __syncthreads();
}

// Blocks an SM the register budget is set for: 64 registers a thread (at 40 the 32-key slice
// spills), so 1024 threads an SM.
template <int kThreads>
constexpr int MinBlocksPerSm() {
  return kWideThreads / kThreads;
}

// Scores: float32, or (the many-rows block only) bfloat16 / float16 read at two bytes and widened
// exactly to float32 bits (register_row.cuh), so every phase after the load is float32's.
template <class Scores, int kThreads, int kElems, bool kSorted>
__global__ void __launch_bounds__(kThreads, MinBlocksPerSm<kThreads>())
    TopkF32RowsKernel(const TopkProblem problem) {
  __shared__ Shared<kThreads> s;
  const int64_t row = blockIdx.x;
  const int k = problem.k;
  const RowOutput<Scores> output(problem, row);
  if (!RowIsValid(row, problem.num_valid_rows, problem.rows_per_group)) {
    StoreStagedWinners<kThreads, false>(s.staged, s.sort, output, k, 0);
    return;
  }
  // The loads wait for the length (unlike topk_f32_cluster's): up to 264 rows share the SMs
  // here, so a short row's unread tail would cost each SM bytes, not only latency.
  const int length =
      static_cast<int>(problem.lengths != nullptr ? ClampLength(problem.lengths[row], problem.width)
                                                  : problem.width);
  RowKeys<kElems> keys;
  LoadRow<Scores>(
      static_cast<const typename Scores::Storage*>(problem.scores) + row * problem.width,
      static_cast<int>(threadIdx.x) * kElems, length, keys);

  // Valid keys (<= 2^15) and valid sampled keys, summed in one int.
  uint32_t counts = 0;
#pragma unroll
  for (int i = 0; i < kElems; ++i) counts += keys.key[i] != 0;
  counts |= static_cast<uint32_t>((keys.key[0] != 0) + (keys.key[kElems / 2] != 0)) << 16;
  uint32_t total;
  BlockExclusiveSum(s.warp_sums, counts, total);
  const int valid = static_cast<int>(total & 0xFFFF);
  const int sampled = static_cast<int>(total >> 16);
  __syncthreads();  // warp_sums is rewritten below

  // At most k valid keys: all of them (every key > 0).
  const Pivot pivot = valid <= k ? Pivot{0, 0} : FindPivot(s, keys, k, valid, sampled);
  StageWinners(s, keys, pivot);
  StoreStagedWinners<kThreads, kSorted>(s.staged, s.sort, output, k, min(valid, k));
}

template <class Scores, int kThreads, int kElems>
void Launch(const TopkProblem& problem, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned int>(problem.rows));
  if (problem.sorted) {
    TopkF32RowsKernel<Scores, kThreads, kElems, true><<<grid, kThreads, 0, stream>>>(problem);
  } else {
    TopkF32RowsKernel<Scores, kThreads, kElems, false><<<grid, kThreads, 0, stream>>>(problem);
  }
}

// The narrowest slice that covers the row: short rows hold fewer registers. (A 16-bit slice is
// whole 16-byte loads of 8 elements.)
template <class Scores, int kThreads>
void LaunchNarrowest(const TopkProblem& problem, cudaStream_t stream) {
  if constexpr (kThreads == kManyRowsThreads && Scores::kChunkElems <= 4) {
    if (problem.width <= kThreads * 4) return Launch<Scores, kThreads, 4>(problem, stream);
  }
  if (problem.width <= kThreads * 8) {
    Launch<Scores, kThreads, 8>(problem, stream);
  } else if (problem.width <= kThreads * 16) {
    Launch<Scores, kThreads, 16>(problem, stream);
  } else {
    Launch<Scores, kThreads, 32>(problem, stream);
  }
}

// Benchmarks and tests (read at each launch): "off"; "always" (every call it can take, the block
// shape by the rule); "wide" and "many" (the same, in that block shape wherever the row fits it).
bool ModeIs(const char* wanted) {
  const char* mode = std::getenv("JAX_TOPK_F32_ROWS");
  return mode != nullptr && std::strcmp(mode, wanted) == 0;
}

// Many rows of at most kF32RowsManyMaxWidth columns: more than a wave of wide blocks, or from
// kF32RowsNarrowMinRows rows of at most kF32RowsNarrowWidth (measured: 200 rows of 4096-8192
// columns 1.2-1.4x faster in the 256-thread block, 132 rows of 8192 1.1x slower; 48-132 rows of
// 2048-4096 1.2-1.4x faster).
bool ManyRowsShape(const TopkProblem& problem) {
  if (problem.width > kF32RowsManyMaxWidth || ModeIs("wide")) return false;
  return ModeIs("many") || problem.rows > kF32RowsManyMinRows ||
         (problem.width <= kF32RowsNarrowWidth && problem.rows >= kF32RowsNarrowMinRows);
}

}  // namespace

bool TopkF32RowsForced() {
  return ModeIs("always") || ModeIs("wide") || ModeIs("many");
}

bool TopkF32RowsServes(const TopkProblem& problem) {
  // A block a row: more than INT_MAX rows stay with the filtered queue, which counts them in 64
  // bits.
  if (problem.width > kF32RowsMaxWidth || problem.rows > INT_MAX || ModeIs("off")) return false;
  // 16-bit rows: the many-rows block alone (measured 2.9x faster than the filtered kernel's
  // queue at 2048 x 8192, benches/NOTES.md "topk_f32_rows: 16-bit rows").
  if (problem.score_type != ScoreType::kFloat32) return ManyRowsShape(problem);
  if (TopkF32RowsForced()) return true;
  // Measured on the H200 (benches/NOTES.md "topk_f32_rows"): many rows of <= 8192 columns run
  // 1.3-4x faster in the 256-thread block, sorted or not ("topk_f32_rows: many rows"); else a
  // block radix sort of the winners costs more than the filtered kernel's whole call; past 264
  // rows of 16384 columns (132 of 32768, one wave) the filtered kernel's queue streams more rows
  // an SM; and under 48 rows of 32768 columns (96 sorted) its cluster of blocks a row reads a
  // row faster than one SM.
  if (ManyRowsShape(problem)) return true;
  if (problem.sorted && problem.k > kMaxRankedByCount) return false;
  if (problem.width <= 16384) return problem.rows <= 264;
  return problem.rows <= 132 && problem.rows >= (problem.sorted ? 96 : 48);
}

bool TopkF32RowsBeatsTopkBf16(const TopkProblem& problem) {
  if (problem.score_type == ScoreType::kFloat32 || !TopkF32RowsServes(problem)) return false;
  if (TopkF32RowsForced()) return true;
  // Measured (same section): faster than topk_bf16 on float16 from 512 rows of <= 4096 columns
  // (1.3-2.1x) and on bfloat16 from 512 rows of <= 1024 columns or 2048 of <= 4096 (1.15-1.3x);
  // slower at 8192 columns and on fewer bfloat16 rows, where topk_bf16's 16-bit passes win.
  if (problem.width > kF32RowsNarrowWidth) return false;
  if (problem.score_type == ScoreType::kFloat16) return problem.rows >= 512;
  return problem.rows >= (problem.width <= 1024 ? 512 : 2048);
}

cudaError_t LaunchTopkF32Rows(const TopkProblem& problem, cudaStream_t stream) {
  if (problem.rows == 0) return cudaSuccess;
  const bool many_rows = ManyRowsShape(problem);
  if (problem.rows < 0 || problem.rows > INT_MAX || problem.width < 1 ||
      problem.width > kF32RowsMaxWidth || problem.k < 1 || problem.k > kMaxK ||
      (problem.score_type != ScoreType::kFloat32 && !many_rows) ||
      (problem.num_valid_rows != nullptr && problem.rows_per_group < 1)) {
    return cudaErrorInvalidValue;
  }
  switch (problem.score_type) {
    case ScoreType::kFloat32:
      if (many_rows) {
        LaunchNarrowest<Float32Scores, kManyRowsThreads>(problem, stream);
      } else {
        LaunchNarrowest<Float32Scores, kWideThreads>(problem, stream);
      }
      break;
    case ScoreType::kBfloat16:
      LaunchNarrowest<RegisterScores<ScoreType::kBfloat16>, kManyRowsThreads>(problem, stream);
      break;
    case ScoreType::kFloat16:
      LaunchNarrowest<RegisterScores<ScoreType::kFloat16>, kManyRowsThreads>(problem, stream);
      break;
  }
  return cudaGetLastError();
}

}  // namespace jax_topk
