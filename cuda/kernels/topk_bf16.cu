// topk_bf16: exact row-wise top-k of 16-bit scores, bfloat16 or float16 (both sign-magnitude: one
// algorithm on raw bits), one 512-thread block per row (docs/contract.md section 1). Per row:
//  1. LoadRow: each thread keeps a contiguous slice (8-32 columns, sized by the row's length) as
//     raw bits in registers; columns >= length read as -inf and are taken back out of every
//     count; NaNs (rare) are rewritten to -inf with their columns excluded.
//  2. FindHighBin: a 256-bin shared histogram of raw high bytes, one warp walks it in value order.
//  3. RefinePivot: the same over the low bytes under that high byte: the k-th value, exactly.
//  4. TakeWinners: packed compares (bf16x2, half2) give (greater, equal) bits; one block scan of
//     their counts gives each thread its output slot and share of the equal quota (lowest first).
//  5. StoreWinners: staged in column order, then stored; sorted=true orders them first: by a
//     stable counting rank over the winners' keys when k <= 512 and their keys span < 1024
//     values (RankByKeyCounts), else by a stable block radix sort.
// Traffic: each score read once (16-byte loads on aligned rows), one coalesced page-transformed
// store of k int32 per row, and of k 16-bit values beside them when asked; no workspace, no sync.
// Limits: width <= kMaxBf16Width = 512 * 32, k <= kMaxK (staged in shared memory), rows < 2^31.
// k = 1 goes to topk_argmax.cu, and hundreds to thousands of rows of at most kF32RowsNarrowWidth
// columns to topk_f32_rows.cu's 256-thread block (both where they measured faster).
// topk_filtered hands this kernel its 16-bit rows of at most kMaxBf16Width columns.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include <cub/block/block_radix_sort.cuh>

#include "common/topk_common.h"
#include "kernels/global_timer.cuh"
#include "kernels/set_bits.cuh"
#include "kernels/topk_cuda.h"
#include "kernels/topk_scan.cuh"

namespace jax_topk {
namespace {

constexpr int kThreadsPerRow = 512;
constexpr int kWarpsPerRow = kThreadsPerRow / 32;
// Blocks per SM the register budget is set for. Unsorted: 4 (32 registers; the 32-column slice
// spills ~20 words to L1, still faster than 3 blocks at 40 registers: 512 rows fit one wave of
// 528). Sorted: 3 (40) for one sort item per thread, 2 (64) for more, where CUB's radix sort
// would spill at 40.
template <int kSortItemsPerThread>
constexpr int MinBlocksPerSm() {
  return kSortItemsPerThread > 1 ? 2 : (kSortItemsPerThread == 0 ? 4 : 3);
}
constexpr int kMaxElemsPerThread = 32;
static_assert(kThreadsPerRow * kMaxElemsPerThread >= kMaxBf16Width, "a row must fit one block");
static_assert(kMaxElemsPerThread <= 32, "one bit per element in a 32-bit mask");

constexpr int kRadixBins = 256;  // two passes over the 16 raw bits: high byte, low byte
static_assert(kRadixBins <= kThreadsPerRow, "one thread per bin when zeroing the histograms");
// The pass-1 histogram slot of a raw high byte: bit 4 flipped on negative bytes (bit 7), so +x
// and -x of one exponent (bytes b and b + 128, both common in real scores) land 16 banks apart
// instead of in one. An involution that keeps every aligned run of 8 bytes contiguous.
__host__ __device__ constexpr uint32_t HighSlot(uint32_t raw_byte) {
  return raw_byte ^ ((raw_byte >> 3) & 0x10u);
}
// The same for both halves of a raw pair at once (bits 15 -> 12 and 31 -> 28).
__device__ __forceinline__ uint32_t HighSlotsOfPair(uint32_t pair) {
  return pair ^ ((pair >> 3) & 0x10001000u);
}
constexpr int kSpillBin = kRadixBins;  // pass 2's bin for keys outside the pivot's high byte

// Phase stamps for the standalone probe (benches/probes/bf16_rows_variants.cu built with
// -DJAX_TOPK_BF16_STAMPS=1): thread 0 of each block stores the globaltimer after each phase
// (BlockPhase). A no-op in the library.
#ifndef JAX_TOPK_BF16_STAMPS
#define JAX_TOPK_BF16_STAMPS 0
#endif
enum BlockPhase : int {
  kEntered,      // the kernel's first instruction
  kLoaded,       // LoadRow's barrier: the slice in registers, NaNs handled
  kHighCounted,  // pass 1's histogram complete
  kHighWalked,   // the high byte's bin known to every thread
  kLowCounted,   // pass 2's histogram complete (rows of more than k candidates)
  kLowWalked,    // the pivot known to every thread
  kTaken,        // TakeWinners: each thread's slot
  kStored,       // the row's k slots written
  kBlockPhases,
};
#if JAX_TOPK_BF16_STAMPS
constexpr int kStampedBlocks = 4096;
__device__ unsigned long long g_bf16_stamps[kStampedBlocks][kBlockPhases];
#endif
__device__ __forceinline__ void StampPhase(BlockPhase phase) {
#if JAX_TOPK_BF16_STAMPS
  if (threadIdx.x == 0 && blockIdx.x < kStampedBlocks) {
    g_bf16_stamps[blockIdx.x][phase] = GlobalTimerNs();
  }
#else
  (void)phase;
#endif
}

// bfloat16 and float16 run one algorithm on raw bits: both are sign-magnitude, so their order is
// OrderedKeyBf16's and the byte passes are the same. They differ in -inf, in the exponent field
// and in the packed type whose compares TakeWinners uses.
template <typename PackedPair, uint16_t kNegInf, uint16_t kExponentField>
struct SixteenBitScores {
  using Pair = PackedPair;
  // -inf: the value of an empty slot, and the fill loaded in place of columns at or past the
  // length and of NaNs, which every count then takes back out (it is the only value that can
  // share its bins, and it is never below the pivot's bins unless the pivot is -inf itself,
  // where the column mask drops it).
  static constexpr uint16_t kNegInfBits = kNegInf;
  static constexpr uint32_t kFillPair = kNegInf * 0x00010001u;
  static constexpr uint32_t kFillHighByte = kNegInf >> 8;
  static constexpr uint32_t kFillLowByte = kNegInf & 0xFF;
  // A pivot with none of these bits set (a zero or a subnormal) is compared by ordered key.
  static constexpr uint32_t kExponentBits = kExponentField;
};
using Bf16Scores = SixteenBitScores<__nv_bfloat162, kNegInfBf16Bits, 0x7F80>;
using F16Scores = SixteenBitScores<__half2, kNegInfF16Bits, 0x7C00>;

// Masked keys pad the sort and sort after every real key: the smallest key of a value (-inf's) is
// 0x007F (bfloat16) or 0x03FF (float16).
constexpr uint32_t kMaskedKey = 0;

// The counting rank's bins: one per key from the winners' largest down (a bfloat16 row's top 512
// of 16384 normal scores span ~150 keys; float16's, 8 times as many). A warp's counts are 16-bit.
constexpr int kRankBins = 1024;
static_assert(kRankBins == 2 * kThreadsPerRow, "the scan gives each thread two bins");

struct NoSort {
  struct TempStorage {};
};
// kSortItemsPerThread == 0: the unsorted kernel, which needs no sort storage.
template <int kSortItemsPerThread>
using BlockSort = std::conditional_t<
    kSortItemsPerThread == 0, NoSort,
    cub::BlockRadixSort<uint32_t, kThreadsPerRow,
                        (kSortItemsPerThread > 0 ? kSortItemsPerThread : 1), int32_t>>;

template <int kSortItemsPerThread, bool kWithValuesOut>
struct RowShared {
  static constexpr int kSortItems = kSortItemsPerThread;
  static constexpr bool kSorted = kSortItemsPerThread > 0;
  static constexpr bool kWithValues = kWithValuesOut;  // problem.values is written
  // The winners' keys are staged beside their columns for the sort and for the values (a key
  // turns back into its value's bits); the unsorted indices-only kernel stages columns alone.
  static constexpr bool kStagesKeys = kSorted || kWithValues;
  // Sorted rows of k <= kThreadsPerRow (one winner a thread) may be ordered by key counts.
  static constexpr bool kRanksByCount = kSortItemsPerThread == 1;
  // The histograms are dead once the pivot is known, the staged selection once it is read into
  // the sort's registers: each phase reuses the previous one's space (separated by barriers).
  union {
    struct {
      alignas(16) int high[kRadixBins];  // indexed by raw byte
      // + one spill bin: pass 2 counts the keys outside the pivot's high byte there, because
      // an unconditional shared atomic costs fewer instructions than a guarded one (a branch).
      alignas(16) int low[kRadixBins + 4];
    } histograms;
    struct {
      int32_t columns[kMaxK];
      uint16_t keys[kStagesKeys ? kMaxK : 1];
      // RankByKeyCounts' tables: a warp's count of each key bin, then the bin's first output
      // slot for that warp (sorted rows of one item a thread only).
      alignas(4) uint16_t key_bins[kRanksByCount ? kWarpsPerRow : 1][kRanksByCount ? kRankBins : 2];
    } staged;
    typename BlockSort<kSortItemsPerThread>::TempStorage sort;
  };
  int warp_counts[kWarpsPerRow];  // the selection scan's per-warp totals
  int candidates;                 // valid non-NaN scores in the row
  int high_bin;                   // the pivot's raw high byte
  int above_high_bin;             // candidates above that bin in value order
  int low_bin;                    // the pivot's raw low byte
  int above_low_bin;              // candidates in the high bin above that low byte
  uint32_t winners_key_max;       // the staged winners' largest and smallest ordered keys
  uint32_t winners_key_min;       // (kRanksByCount only; set before LoadRow's barrier)
};

// A slice lives as raw 16-bit pairs: element 2p in the low half of pairs[p], element 2p + 1 in the
// high half (column order, as in memory). Per-element flags are gathered in "pair layout": bit p
// for element 2p, bit 16 + p for element 2p + 1 (one LOP3 per pair from a packed compare mask).

template <typename Pair>
__device__ __forceinline__ Pair AsPair(uint32_t pair) {
  return *reinterpret_cast<const Pair*>(&pair);
}

// Pair layout -> column order (bit i = element i): interleave the low and high 16 bits.
__device__ __forceinline__ uint32_t SpreadEvenBits(uint32_t x) {
  x &= 0xFFFFu;
  x = (x | (x << 8)) & 0x00FF00FFu;
  x = (x | (x << 4)) & 0x0F0F0F0Fu;
  x = (x | (x << 2)) & 0x33333333u;
  return (x | (x << 1)) & 0x55555555u;
}
__device__ __forceinline__ uint32_t ColumnOrder(uint32_t pair_layout) {
  return SpreadEvenBits(pair_layout) | (SpreadEvenBits(pair_layout >> 16) << 1);
}
// The first `count` elements (count <= 32) in pair layout.
__device__ __forceinline__ uint32_t FirstElementsInPairLayout(int count) {
  const uint32_t low = (1u << ((count + 1) >> 1)) - 1;  // elements 0, 2, 4, ...
  const uint32_t high = (1u << (count >> 1)) - 1;       // elements 1, 3, 5, ...
  return low | (high << 16);
}

template <int kElemsPerLoad>
__device__ __forceinline__ void LoadWords(const uint16_t* scores, uint32_t* words) {
  if constexpr (kElemsPerLoad == 8) {
    const uint4 vector = __ldg(reinterpret_cast<const uint4*>(scores));
    words[0] = vector.x;
    words[1] = vector.y;
    words[2] = vector.z;
    words[3] = vector.w;
  } else if constexpr (kElemsPerLoad == 4) {
    const uint2 vector = __ldg(reinterpret_cast<const uint2*>(scores));
    words[0] = vector.x;
    words[1] = vector.y;
  } else {
    static_assert(kElemsPerLoad == 2, "loads of 2, 4 or 8 16-bit scores");
    words[0] = __ldg(reinterpret_cast<const unsigned int*>(scores));
  }
}

// Raw bits of columns [first_column, first_column + kElemsPerThread), the fill (-inf) at or past
// `end`. Whole vectors where they lie before `end`; scalar loads for the vector that straddles it
// (and everywhere when the row is only 2-byte aligned: kElemsPerLoad == 1).
template <typename Scores, int kElemsPerThread, int kElemsPerLoad>
__device__ __forceinline__ void LoadSliceBits(const uint16_t* row_scores, int first_column, int end,
                                              uint32_t (&pairs)[kElemsPerThread / 2]) {
  constexpr int kElemsPerStep = kElemsPerLoad > 2 ? kElemsPerLoad : 2;
#pragma unroll
  for (int step = 0; step < kElemsPerThread / kElemsPerStep; ++step) {
    const int column = first_column + step * kElemsPerStep;
    uint32_t* words = pairs + step * (kElemsPerStep / 2);
    if (column >= end) {  // past this thread's slice (or the row): no load at all
#pragma unroll
      for (int pair = 0; pair < kElemsPerStep / 2; ++pair) words[pair] = Scores::kFillPair;
    } else if (kElemsPerLoad > 1 && column + kElemsPerStep <= end) {
      LoadWords<kElemsPerStep>(row_scores + column, words);
    } else {
#pragma unroll
      for (int pair = 0; pair < kElemsPerStep / 2; ++pair) {
        const int low = column + 2 * pair;
        const uint32_t low_bits = low < end ? __ldg(row_scores + low) : Scores::kNegInfBits;
        const uint32_t high_bits =
            low + 1 < end ? __ldg(row_scores + low + 1) : Scores::kNegInfBits;
        words[pair] = low_bits | (high_bits << 16);
      }
    }
  }
}

// Every slice starts a multiple of 16 bytes after the row start, so the row's own alignment picks
// the widest load that all threads can use.
template <typename Scores, int kElemsPerThread>
__device__ __forceinline__ void LoadSlice(const uint16_t* row_scores, int first_column, int end,
                                          uint32_t (&pairs)[kElemsPerThread / 2]) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(row_scores);
  if (address % 16 == 0) {
    LoadSliceBits<Scores, kElemsPerThread, 8>(row_scores, first_column, end, pairs);
  } else if (address % 8 == 0) {
    LoadSliceBits<Scores, kElemsPerThread, 4>(row_scores, first_column, end, pairs);
  } else if (address % 4 == 0) {
    LoadSliceBits<Scores, kElemsPerThread, 2>(row_scores, first_column, end, pairs);
  } else {
    LoadSliceBits<Scores, kElemsPerThread, 1>(row_scores, first_column, end, pairs);
  }
}

// Columns per thread for a row of `length`: the fewest (a multiple of 8, so every slice stays
// 16-byte aligned) that cover the row with all threads, at most the register slice. A short row
// in a wide array is spread over every thread, so no thread histograms more keys than it must.
template <int kElemsPerThread>
__device__ __forceinline__ int SliceElems(int length) {
  static_assert(kElemsPerThread % 8 == 0, "slices are whole 16-byte vectors");
  const int needed = ((length + kThreadsPerRow - 1) / kThreadsPerRow + 7) & ~7;
  return needed < 8 ? 8 : (needed > kElemsPerThread ? kElemsPerThread : needed);
}

// Run by one warp: finds the bin holding the rank-th largest value (rank >= 1). Lane L covers the
// value-ordered positions 255 - 8L down to 248 - 8L, which are the raw bins base .. base + 7 in
// descending (raw_descends) or ascending raw order; the sign of a byte fixes which, so the order
// transform costs nothing per element. If rank <= total, exactly one lane records the bin and the
// count above it. Lane 31 records the histogram's total when `total` is not null. The pass-1
// histogram is laid out by HighSlot (high_slots), the pass-2 one by raw byte.
__device__ __forceinline__ void WarpFindBin(const int* histogram, bool high_slots, int rank,
                                            int base, bool raw_descends, int* chosen_bin,
                                            int* count_above, int* total) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int slot = static_cast<int>(high_slots ? HighSlot(base) : base);
  const int4 first = *reinterpret_cast<const int4*>(histogram + slot);
  const int4 second = *reinterpret_cast<const int4*>(histogram + slot + 4);
  const int counts[8] = {first.x,  first.y,  first.z,  first.w,
                         second.x, second.y, second.z, second.w};
  int lane_count = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) lane_count += counts[i];
  const int at_or_above = WarpInclusiveSum(lane_count);  // from the top lane-range down
  if (total != nullptr && lane == 31) *total = at_or_above;
  int above = at_or_above - lane_count;
  if (above < rank && rank <= at_or_above) {
    bool found = false;
#pragma unroll
    for (int position = 0; position < 8; ++position) {
      const int offset = raw_descends ? 7 - position : position;
      const int count = raw_descends ? counts[7 - position] : counts[position];
      if (!found && above + count >= rank) {
        found = true;
        *chosen_bin = base + offset;
        *count_above = above;
      }
      above += count;
    }
  }
}

// A thread's slice of its row, in registers: thread t owns columns
// [t * slice_elems, (t + 1) * slice_elems), so thread order is still column order. Register slots
// past slice_elems hold fill and are never histogrammed (active_pairs is the same for the whole
// block, so skipping them does not diverge).
template <typename Scores, int kElemsPerThread>
struct RowSlice {
  uint32_t pairs[kElemsPerThread / 2];
  int first_column;
  int active_pairs;
  uint32_t valid_bits;  // which elements may be selected, in pair layout
  int filled;           // fill values inside the histogrammed slice (past the length, or NaN)
};

// visit(pair) for each of a slice's active pairs, in order. Slices are whole 16-byte vectors
// (SliceElems), so active pairs come in fours: one bound check a four, where a check a pair (a
// compare, a predicate move and a branch) was ~17 % of the kernel's instructions on rows of 16384
// columns (benches/NOTES.md "topk_bf16: bound checks a vector").
template <int kPairsPerThread, typename Visit>
__device__ __forceinline__ void ForEachActivePair(int active_pairs, const Visit& visit) {
  constexpr int kPairsPerVector = 4;
  static_assert(kPairsPerThread % kPairsPerVector == 0, "slices are whole 16-byte vectors");
#pragma unroll
  for (int first = 0; first < kPairsPerThread; first += kPairsPerVector) {
    if (first >= active_pairs) break;
#pragma unroll
    for (int pair = first; pair < first + kPairsPerVector; ++pair) visit(pair);
  }
}

// Phase 1, load the row: zeroes the histograms and loads this thread's slice; a row holding any
// NaN rewrites it to the fill value (-inf) with its column dropped. Every thread calls it; its
// one barrier also publishes the zeroed histograms.
template <typename Scores, int kElemsPerThread, typename Shared>
__device__ __forceinline__ void LoadRow(Shared& shared, const TopkProblem& problem, int64_t row,
                                        int length, RowSlice<Scores, kElemsPerThread>& slice) {
  using Pair = typename Scores::Pair;
  constexpr int kPairsPerThread = kElemsPerThread / 2;
  const int thread = threadIdx.x;
  if (thread < kRadixBins) shared.histograms.high[thread] = 0;
  if (thread <= kSpillBin) shared.histograms.low[thread] = 0;
  const uint16_t* row_scores = static_cast<const uint16_t*>(problem.scores) + row * problem.width;
  const int slice_elems = SliceElems<kElemsPerThread>(length);
  slice.active_pairs = slice_elems / 2;
  slice.first_column = thread * slice_elems;
  const int valid_elems = max(0, min(length - slice.first_column, slice_elems));
  LoadSlice<Scores, kElemsPerThread>(row_scores, slice.first_column,
                                     slice.first_column + valid_elems, slice.pairs);

  // The columns before the length, minus NaNs.
  slice.valid_bits = FirstElementsInPairLayout(valid_elems);
  uint32_t nan_lanes = 0;
  ForEachActivePair<kPairsPerThread>(slice.active_pairs, [&](int pair) {
    nan_lanes |= __hneu2_mask(AsPair<Pair>(slice.pairs[pair]), AsPair<Pair>(slice.pairs[pair]));
  });
  if (__syncthreads_or(nan_lanes != 0)) {
    // Rare: NaN anywhere in the row. Rewrite each NaN to the fill value (-inf) and drop its
    // column, so the passes and the compares below need no NaN test of their own.
#pragma unroll
    for (int pair = 0; pair < kPairsPerThread; ++pair) {
      const uint32_t nan_mask =
          __hneu2_mask(AsPair<Pair>(slice.pairs[pair]), AsPair<Pair>(slice.pairs[pair]));
      slice.valid_bits &= ~(nan_mask & (0x00010001u << pair));
      slice.pairs[pair] = (slice.pairs[pair] & ~nan_mask) | (Scores::kFillPair & nan_mask);
    }
  }
  slice.filled = slice_elems - __popc(slice.valid_bits);
}

// Phase 2, the high byte: a histogram of the raw high bytes and one warp's walk of it in value
// order find the bin of the k-th largest value. Returns the row's candidates (valid scores);
// shared.high_bin and shared.above_high_bin hold the bin. Every thread calls it; two barriers.
template <typename Scores, int kElemsPerThread, typename Shared>
__device__ __forceinline__ int FindHighBin(Shared& shared,
                                           const RowSlice<Scores, kElemsPerThread>& slice,
                                           int length, int k) {
  constexpr int kPairsPerThread = kElemsPerThread / 2;
  const int lane = threadIdx.x & 31;
  int* const high_histogram = shared.histograms.high;
  // The fill (-inf) is counted too (no test per element), then taken out.
  // __byte_perm(x, 0, 0x444b) is byte b of x, zero-extended: one instruction per slot.
  if (slice.first_column < length) {
    ForEachActivePair<kPairsPerThread>(slice.active_pairs, [&](int pair) {
      const uint32_t slots = HighSlotsOfPair(slice.pairs[pair]);
      atomicAdd(&high_histogram[__byte_perm(slots, 0, 0x4441)], 1);
      atomicAdd(&high_histogram[__byte_perm(slots, 0, 0x4443)], 1);
    });
    if (slice.filled > 0) {
      atomicSub(&high_histogram[HighSlot(Scores::kFillHighByte)], slice.filled);
    }
  }
  __syncthreads();
  StampPhase(kHighCounted);
  if ((threadIdx.x >> 5) == 0) {
    // Lanes 0-15 walk the positive half (raw 127 down to 0), lanes 16-31 the negative half
    // (raw 128 up to 255: larger raw bits are more negative).
    const int base = lane < 16 ? 120 - 8 * lane : 8 * lane;
    WarpFindBin(high_histogram, /*high_slots=*/true, k, base, lane < 16, &shared.high_bin,
                &shared.above_high_bin, &shared.candidates);
  }
  __syncthreads();
  StampPhase(kHighWalked);
  return shared.candidates;
}

// The selection's boundary: every value > bits is taken, and the first `quota` values == bits.
struct Pivot {
  uint32_t bits;
  int quota;
};

// Phase 3, the low byte: with more candidates than k, a histogram of the low bytes of the values
// under the pivot's high byte (one warp walks it) settles the pivot exactly. With no more than k,
// pivot = -inf and an unbounded quota take exactly the valid columns. Every thread calls it with
// block-uniform `candidates`; two barriers when it refines.
template <typename Scores, int kElemsPerThread, typename Shared>
__device__ __forceinline__ Pivot RefinePivot(Shared& shared,
                                             const RowSlice<Scores, kElemsPerThread>& slice,
                                             int length, int k, int candidates) {
  constexpr int kPairsPerThread = kElemsPerThread / 2;
  const int lane = threadIdx.x & 31;
  int* const low_histogram = shared.histograms.low;
  uint32_t pivot = Scores::kNegInfBits;
  int quota = kMaxBf16Width;
  if (candidates > k) {
    // The fill again counted and taken back out when it shares the pivot's high byte.
    const uint32_t high_bin = shared.high_bin;
    const int rank_in_bin = k - shared.above_high_bin;
    // XOR with the pivot's high byte in both halves zeroes the high byte of exactly the values
    // under it, so min(half, kSpillBin) is their low byte and sends every other value to the
    // spill bin, both halves in one 16x2 min; one shift makes both byte offsets (a half stays
    // <= 4 * kSpillBin, inside its 16 bits); no branch. (2.7-3.2 % faster at 512-2048 rows on an
    // H100 than a min and an index a half: benches/NOTES.md "topk_bf16: pass 2's two mins in
    // one".)
    const uint32_t high_bin_pattern = (high_bin << 24) | (high_bin << 8);
    char* const low_bytes = reinterpret_cast<char*>(low_histogram);
    if (slice.first_column < length) {
      ForEachActivePair<kPairsPerThread>(slice.active_pairs, [&](int pair) {
        const uint32_t marked = slice.pairs[pair] ^ high_bin_pattern;
        const uint32_t offsets = __vminu2(marked, kSpillBin * 0x00010001u) << 2;
        atomicAdd(reinterpret_cast<int*>(low_bytes + (offsets & 0xFFFFu)), 1);
        atomicAdd(reinterpret_cast<int*>(low_bytes + (offsets >> 16)), 1);
      });
      if (slice.filled > 0 && high_bin == Scores::kFillHighByte) {
        atomicSub(&low_histogram[Scores::kFillLowByte], slice.filled);
      }
    }
    __syncthreads();
    StampPhase(kLowCounted);
    if ((threadIdx.x >> 5) == 0) {
      // Under a positive high byte larger raw low bytes are larger values; under a negative one,
      // smaller.
      const bool positive = high_bin < 0x80u;
      WarpFindBin(low_histogram, /*high_slots=*/false, rank_in_bin,
                  positive ? 248 - 8 * lane : 8 * lane, positive, &shared.low_bin,
                  &shared.above_low_bin, nullptr);
    }
    __syncthreads();
    StampPhase(kLowWalked);
    pivot = (high_bin << 8) | static_cast<uint32_t>(shared.low_bin);
    quota = rank_in_bin - shared.above_low_bin;
  }
  return {pivot, quota};
}

// What a thread takes: its winners' bits in column order (bit i = column first_column + i) and
// the output slot of the first.
struct Taken {
  uint32_t bits;
  int position;
};

// Phase 4, select with the equal quota: (greater, equal) flags against the pivot, and one block
// scan of their counts gives each thread its first output slot and its share of the equal quota
// (the lowest columns first). Every thread calls it; one barrier.
template <typename Scores, int kElemsPerThread, typename Shared>
__device__ __forceinline__ Taken TakeWinners(Shared& shared,
                                             const RowSlice<Scores, kElemsPerThread>& slice,
                                             const Pivot& pivot) {
  using Pair = typename Scores::Pair;
  constexpr int kPairsPerThread = kElemsPerThread / 2;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  // Packed compares (bf16x2 or half2; no NaN is left) are exact against any pivot that is neither
  // zero nor subnormal (they treat -0 == +0, and a flushing compare would blur subnormals); for
  // those rare pivots, compare ordered keys instead. Flags in pair layout.
  uint32_t greater_bits = 0;
  uint32_t equal_bits = 0;
  if ((pivot.bits & Scores::kExponentBits) != 0) {
    const Pair pivot_pair = AsPair<Pair>(pivot.bits * 0x00010001u);
    ForEachActivePair<kPairsPerThread>(slice.active_pairs, [&](int pair) {
      const Pair values = AsPair<Pair>(slice.pairs[pair]);
      greater_bits |= __hgt2_mask(values, pivot_pair) & (0x00010001u << pair);
      equal_bits |= __heq2_mask(values, pivot_pair) & (0x00010001u << pair);
    });
  } else {
    const uint32_t pivot_key = OrderedKeyBf16(static_cast<uint16_t>(pivot.bits));
    ForEachActivePair<kPairsPerThread>(slice.active_pairs, [&](int pair) {
      const uint32_t low_key = OrderedKeyBf16(static_cast<uint16_t>(slice.pairs[pair]));
      const uint32_t high_key = OrderedKeyBf16(static_cast<uint16_t>(slice.pairs[pair] >> 16));
      greater_bits |= (static_cast<uint32_t>(low_key > pivot_key) << pair) |
                      (static_cast<uint32_t>(high_key > pivot_key) << (16 + pair));
      equal_bits |= (static_cast<uint32_t>(low_key == pivot_key) << pair) |
                    (static_cast<uint32_t>(high_key == pivot_key) << (16 + pair));
    });
  }
  greater_bits &= slice.valid_bits;
  equal_bits &= slice.valid_bits;

  // Both counts are <= kMaxBf16Width < 2^16, so they pack into one int.
  const int equal_count = __popc(equal_bits);
  const int packed = (__popc(greater_bits) << 16) | equal_count;
  // BlockExclusiveSum (topk_scan.cuh) without its block total, which this kernel does not need
  // and whose extra register spills the sorted instance at its 40-register budget.
  const int inclusive = WarpInclusiveSum(packed);
  if (lane == 31) shared.warp_counts[warp] = inclusive;
  __syncthreads();
  const int lower_warp_count = lane < warp ? shared.warp_counts[lane] : 0;
  const int before =
      static_cast<int>(__reduce_add_sync(0xFFFFFFFFu, lower_warp_count)) + inclusive - packed;
  const int greater_before = before >> 16;
  const int equal_before = before & 0xFFFF;
  const int position = greater_before + min(equal_before, pivot.quota);
  const int equal_to_take = max(0, min(equal_count, pivot.quota - equal_before));
  // The equal quota takes the lowest columns.
  uint32_t take_bits = ColumnOrder(greater_bits | (equal_to_take == equal_count ? equal_bits : 0));
  if (equal_to_take > 0 && equal_to_take < equal_count) {
    take_bits |= LowestSetBits(ColumnOrder(equal_bits), equal_to_take);
  }
  return {take_bits, position};
}

// Phase 5's order for sorted rows of one winner a thread whose keys span fewer than kRankBins
// values: a stable counting sort in one pass. Staged winner t (ascending columns) is thread t's;
// its bin is key_max - key, so bins ascend as keys descend. Each warp counts its winners a bin
// (peers by __match_any_sync; a winner's rank among its warp's peers is the lower lanes'), one
// block scan over (bin, warp) order turns the counts into each warp's first slot in each bin, and
// slot = that + rank: keys descending, equal keys by ascending column, as the radix sort gives.
// Three barriers, against the radix sort's four passes of several each. Every thread calls it.
template <typename Scores, typename Shared>
__device__ __forceinline__ void RankByKeyCounts(Shared& shared, uint32_t key_max,
                                                const TopkProblem& problem, int64_t row,
                                                int32_t* row_out, uint16_t* row_values,
                                                int selected) {
  const int thread = threadIdx.x;
  const int lane = thread & 31;
  const int warp = thread >> 5;
  const int span_words = static_cast<int>(key_max - shared.winners_key_min) / 2 + 1;
  // A warp's own table: zeroed and filled by the warp alone.
  uint32_t* const own_words = reinterpret_cast<uint32_t*>(shared.staged.key_bins[warp]);
  for (int word = lane; word < span_words; word += 32) own_words[word] = 0;
  __syncwarp();
  const bool has = thread < selected;
  const uint32_t key = has ? shared.staged.keys[thread] : 0;
  const int32_t column = has ? shared.staged.columns[thread] : 0;
  const uint32_t bin = has ? key_max - key : 0xFFFFFFFFu;  // no winner: a group of its own
  const uint32_t peers = __match_any_sync(0xFFFFFFFFu, bin);
  const int rank = __popc(peers & ((1u << lane) - 1));
  if (has && rank == 0) shared.staged.key_bins[warp][bin] = static_cast<uint16_t>(__popc(peers));
  __syncthreads();

  // Thread t owns bins 2t and 2t + 1 (one 32-bit word of each warp's table): its winners come
  // after those of every lower bin, and inside a bin warp by warp.
  int owned = 0;
  if (thread < span_words) {
#pragma unroll
    for (int w = 0; w < kWarpsPerRow; ++w) {
      const uint32_t word = reinterpret_cast<const uint32_t*>(shared.staged.key_bins[w])[thread];
      owned += static_cast<int>((word & 0xFFFFu) + (word >> 16));
    }
  }
  const int inclusive = WarpInclusiveSum(owned);
  if (lane == 31) shared.warp_counts[warp] = inclusive;
  __syncthreads();
  const int lower_warp_count = lane < warp ? shared.warp_counts[lane] : 0;
  int next_slot =
      static_cast<int>(__reduce_add_sync(0xFFFFFFFFu, lower_warp_count)) + inclusive - owned;
  if (thread < span_words) {  // each count becomes its first slot: bin 2t warp by warp, then 2t + 1
#pragma unroll
    for (int half = 0; half < 2; ++half) {
#pragma unroll
      for (int w = 0; w < kWarpsPerRow; ++w) {
        uint16_t& bin_of_warp = shared.staged.key_bins[w][2 * thread + half];
        const int count = bin_of_warp;
        bin_of_warp = static_cast<uint16_t>(next_slot);
        next_slot += count;
      }
    }
  }
  __syncthreads();

  const int32_t* table_row = PageTableRow(problem, row);
  if (has) {
    const int slot = shared.staged.key_bins[warp][bin] + rank;
    row_out[slot] = PageTransform(column, table_row, problem.log2_page_size);
    if constexpr (Shared::kWithValues) row_values[slot] = BitsFromOrderedKeyBf16(key);
  }
  // k <= kThreadsPerRow: one slot a thread at most.
  if (thread >= selected && thread < problem.k) {
    row_out[thread] = kEmptySlot;
    if constexpr (Shared::kWithValues) row_values[thread] = Scores::kNegInfBits;
  }
}

// Phase 5, stage and store: the winners are staged in shared memory in ascending column order
// (with their keys for sorted=true, which adds a stable block radix sort, and for the values),
// then stored to the row's k slots, page-transformed and coalesced, padded with kEmptySlot; each
// value (its key turned back into bits, so before the page transform) beside its index, -inf
// beside kEmptySlot. Every thread calls it.
template <typename Scores, int kElemsPerThread, typename Shared>
__device__ __forceinline__ void StoreWinners(Shared& shared,
                                             const RowSlice<Scores, kElemsPerThread>& slice,
                                             Taken taken, const TopkProblem& problem, int64_t row,
                                             int32_t* row_out, uint16_t* row_values, int selected,
                                             bool may_rank_by_count) {
  constexpr int kSortItemsPerThread = Shared::kSortItems;
  constexpr int kPairsPerThread = kElemsPerThread / 2;
  const int thread = threadIdx.x;
  const int k = problem.k;
  const int first_column = slice.first_column;
  uint32_t take_bits = taken.bits;
  int position = taken.position;
  if constexpr (!Shared::kStagesKeys) {
    for (; take_bits != 0; take_bits &= take_bits - 1) {
      shared.staged.columns[position++] = first_column + __ffs(take_bits) - 1;
    }
  } else {
    uint32_t key_max = 0;
    uint32_t key_min = 0xFFFFu;
#pragma unroll
    for (int pair = 0; pair < kPairsPerThread; ++pair) {
      if (take_bits & (1u << (2 * pair))) {
        const uint32_t key = OrderedKeyBf16(static_cast<uint16_t>(slice.pairs[pair]));
        shared.staged.columns[position] = first_column + 2 * pair;
        shared.staged.keys[position++] = static_cast<uint16_t>(key);
        key_max = max(key_max, key);
        key_min = min(key_min, key);
      }
      if (take_bits & (2u << (2 * pair))) {
        const uint32_t key = OrderedKeyBf16(static_cast<uint16_t>(slice.pairs[pair] >> 16));
        shared.staged.columns[position] = first_column + 2 * pair + 1;
        shared.staged.keys[position++] = static_cast<uint16_t>(key);
        key_max = max(key_max, key);
        key_min = min(key_min, key);
      }
    }
    if constexpr (Shared::kRanksByCount) {
      key_max = __reduce_max_sync(0xFFFFFFFFu, key_max);
      key_min = __reduce_min_sync(0xFFFFFFFFu, key_min);
      if ((thread & 31) == 0) {
        atomicMax(&shared.winners_key_max, key_max);
        atomicMin(&shared.winners_key_min, key_min);
      }
    }
  }
  __syncthreads();

  const int32_t* table_row = PageTableRow(problem, row);
  if constexpr (!Shared::kSorted) {
    for (int slot = thread; slot < k; slot += kThreadsPerRow) {
      const bool filled_slot = slot < selected;
      row_out[slot] = filled_slot ? PageTransform(shared.staged.columns[slot], table_row,
                                                  problem.log2_page_size)
                                  : kEmptySlot;
      if constexpr (Shared::kWithValues) {
        row_values[slot] =
            filled_slot ? BitsFromOrderedKeyBf16(shared.staged.keys[slot]) : Scores::kNegInfBits;
      }
    }
  } else {
    if constexpr (Shared::kRanksByCount) {
      // Block-uniform: read after the staging barrier.
      const uint32_t key_max = shared.winners_key_max;
      if (may_rank_by_count && selected > 0 && key_max - shared.winners_key_min < kRankBins) {
        RankByKeyCounts<Scores>(shared, key_max, problem, row, row_out, row_values, selected);
        return;
      }
    }
    // Blocked arrangement = staged (ascending column) order, and the radix sort is stable, so
    // equal keys keep ascending columns. Padding keys (kMaskedKey) sort after every real key.
    uint32_t sort_keys[kSortItemsPerThread];
    int32_t sort_columns[kSortItemsPerThread];
#pragma unroll
    for (int i = 0; i < kSortItemsPerThread; ++i) {
      const int slot = thread * kSortItemsPerThread + i;
      const bool filled_slot = slot < selected;
      sort_keys[i] = filled_slot ? shared.staged.keys[slot] : kMaskedKey;
      sort_columns[i] = filled_slot ? shared.staged.columns[slot] : kEmptySlot;
    }
    __syncthreads();
    BlockSort<kSortItemsPerThread>(shared.sort)
        .SortDescendingBlockedToStriped(sort_keys, sort_columns, 0, 16);
#pragma unroll
    for (int i = 0; i < kSortItemsPerThread; ++i) {
      const int slot = i * kThreadsPerRow + thread;
      if (slot < k) {
        const bool filled_slot = slot < selected;
        row_out[slot] = filled_slot
                            ? PageTransform(sort_columns[i], table_row, problem.log2_page_size)
                            : kEmptySlot;
        if constexpr (Shared::kWithValues) {
          row_values[slot] =
              filled_slot ? BitsFromOrderedKeyBf16(sort_keys[i]) : Scores::kNegInfBits;
        }
      }
    }
  }
}

// One row a block: the five phases above, in order. kWithValues: problem.values is written (a
// template flag, so the indices-only kernels keep their code and shared memory).
template <typename Scores, int kElemsPerThread, int kSortItemsPerThread, bool kWithValues>
__global__ void __launch_bounds__(kThreadsPerRow, MinBlocksPerSm<kSortItemsPerThread>())
    TopkBf16Kernel(const TopkProblem problem, const bool may_rank_by_count) {
  __shared__ RowShared<kSortItemsPerThread, kWithValues> shared;
  StampPhase(kEntered);
  const int64_t row = blockIdx.x;
  const int k = problem.k;
  int32_t* row_out = problem.out + row * k;
  uint16_t* row_values = kWithValues ? static_cast<uint16_t*>(problem.values) + row * k : nullptr;
  if (!RowIsValid(row, problem.num_valid_rows, problem.rows_per_group)) {
    for (int slot = threadIdx.x; slot < k; slot += kThreadsPerRow) {
      row_out[slot] = kEmptySlot;
      if constexpr (kWithValues) row_values[slot] = Scores::kNegInfBits;
    }
    return;
  }
  const int length =
      static_cast<int>(problem.lengths != nullptr ? ClampLength(problem.lengths[row], problem.width)
                                                  : problem.width);
  if (kSortItemsPerThread == 1 && threadIdx.x == 0) {  // published by LoadRow's barrier
    shared.winners_key_max = 0;
    shared.winners_key_min = 0xFFFFu;
  }
  RowSlice<Scores, kElemsPerThread> slice;
  LoadRow(shared, problem, row, length, slice);
  StampPhase(kLoaded);
  const int candidates = FindHighBin(shared, slice, length, k);
  const Pivot pivot = RefinePivot(shared, slice, length, k, candidates);
  const Taken taken = TakeWinners(shared, slice, pivot);
  StampPhase(kTaken);
  StoreWinners(shared, slice, taken, problem, row, row_out, row_values,
               candidates < k ? candidates : k, may_rank_by_count);
  StampPhase(kStored);
}

template <typename Scores, int kElemsPerThread, int kSortItemsPerThread>
void LaunchKernel(const TopkProblem& problem, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned int>(problem.rows));
  const dim3 block(kThreadsPerRow);
  // Benchmarks and tests: JAX_TOPK_BF16_SORT=radix orders every sorted row by the radix sort
  // (read at each launch; a launch captured in a command buffer keeps the mode of its capture).
  const char* const sort_mode = std::getenv("JAX_TOPK_BF16_SORT");
  const bool may_rank_by_count = sort_mode == nullptr || std::strcmp(sort_mode, "radix") != 0;
  if (problem.values != nullptr) {
    TopkBf16Kernel<Scores, kElemsPerThread, kSortItemsPerThread, true>
        <<<grid, block, 0, stream>>>(problem, may_rank_by_count);
  } else {
    TopkBf16Kernel<Scores, kElemsPerThread, kSortItemsPerThread, false>
        <<<grid, block, 0, stream>>>(problem, may_rank_by_count);
  }
}

// The sort's items per thread: none unsorted, else the fewest that hold k.
template <typename Scores, int kElemsPerThread>
cudaError_t LaunchForSliceSize(const TopkProblem& problem, cudaStream_t stream) {
  if (!problem.sorted) {
    LaunchKernel<Scores, kElemsPerThread, 0>(problem, stream);
  } else if (problem.k <= kThreadsPerRow) {
    LaunchKernel<Scores, kElemsPerThread, 1>(problem, stream);
  } else if (problem.k <= 2 * kThreadsPerRow) {
    LaunchKernel<Scores, kElemsPerThread, 2>(problem, stream);
  } else {
    static_assert(4 * kThreadsPerRow >= kMaxK, "the widest sort covers every k");
    LaunchKernel<Scores, kElemsPerThread, 4>(problem, stream);
  }
  return cudaGetLastError();
}

// The narrowest slice that covers the row: short rows hold fewer registers.
template <typename Scores>
cudaError_t LaunchForScores(const TopkProblem& problem, cudaStream_t stream) {
  if (problem.width <= kThreadsPerRow * 8) return LaunchForSliceSize<Scores, 8>(problem, stream);
  if (problem.width <= kThreadsPerRow * 16) return LaunchForSliceSize<Scores, 16>(problem, stream);
  return LaunchForSliceSize<Scores, kMaxElemsPerThread>(problem, stream);
}

}  // namespace

bool TopkBf16TakesFilteredRows(const TopkProblem& problem) {
  // 16-bit rows that fit one block: every row a block of this kernel, measured 1.4-4.8x faster
  // than topk_filtered's own kernels (its cluster, its 256-thread register block, its queue) on
  // bfloat16 and float16 rows of 4096-16384 columns, 1-2048 rows, k 64-2048 (benches/NOTES.md
  // "topk_filtered's short 16-bit rows"). JAX_TOPK_SHORT_16BIT=own (read at each launch)
  // keeps them on topk_filtered's own kernels, for benchmarks and tests.
  if (problem.score_type == ScoreType::kFloat32 || problem.width > kMaxBf16Width ||
      problem.rows > INT32_MAX) {
    return false;
  }
  const char* const mode = std::getenv("JAX_TOPK_SHORT_16BIT");
  return mode == nullptr || std::strcmp(mode, "own") != 0;
}

cudaError_t LaunchTopkBf16(const TopkProblem& problem, cudaStream_t stream) {
  if (problem.rows == 0) return cudaSuccess;
  if (problem.rows < 0 || problem.rows > INT32_MAX || problem.width < 1 ||
      problem.width > kMaxBf16Width || problem.k < 1 || problem.k > kMaxK ||
      (problem.num_valid_rows != nullptr && problem.rows_per_group < 1)) {
    return cudaErrorInvalidValue;
  }
  if (TopkArgmaxServes(problem)) return LaunchTopkArgmax(problem, stream);
  if (TopkF32RowsBeatsTopkBf16(problem)) return LaunchTopkF32Rows(problem, stream);
  switch (problem.score_type) {
    case ScoreType::kBfloat16:
      return LaunchForScores<Bf16Scores>(problem, stream);
    case ScoreType::kFloat16:
      return LaunchForScores<F16Scores>(problem, stream);
    case ScoreType::kFloat32:
      break;
  }
  return cudaErrorInvalidValue;
}

}  // namespace jax_topk
