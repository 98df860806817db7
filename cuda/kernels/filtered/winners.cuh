// Winners and ordering: writes a row's (or a split part's) m winners to its output slots, in
// column order or, for sorted=true, by key descending then column ascending; page-transformed,
// coalesced, padded with kEmptySlot up to k where asked. Winners marked in s.work.bitmap are
// read out in column order by one block scan of each thread's run of words (linear in the row);
// winners gathered in s.work.selected go through a block radix sort.
//
// Contract: WriteWinners is called by every thread of the block with block-uniform arguments,
// after the selection's closing barrier. It reuses s.candidates (as the ordered columns) and
// s.work (as the sort's storage) and ends with a barrier, after which both are free again.
#pragma once

#include "kernels/filtered/few_winners.cuh"
#include "kernels/filtered/layout.cuh"
#include "kernels/filtered/probe.cuh"
#include "kernels/topk_scan.cuh"
#include "kernels/widen_exact.cuh"

namespace jax_topk {
namespace {

// Writes the columns marked in s.work.bitmap to s.candidates (dead since the selection) in
// ascending order: each thread counts a run of words_per_thread (<= kWords) words, one block scan
// places every thread's columns. Linear in the row's words, where a block radix sort of the 2048
// columns takes five 4-bit passes.
template <int kWords>
__device__ __forceinline__ void OrderBitmap(SharedStorage& s, int words, int words_per_thread) {
  static_assert(kWords % 4 == 0, "whole uint4 loads");
  const int first_word = static_cast<int>(threadIdx.x) * words_per_thread;
  uint32_t mine[kWords];
#pragma unroll
  for (int q = 0; q < kWords / 4; ++q) {  // 16-byte loads where the run allows (fewer conflicts)
    uint4 four = make_uint4(0, 0, 0, 0);
    if (words_per_thread >= 4) {
      if (4 * q < words_per_thread && first_word + 4 * q < words) {
        four = *reinterpret_cast<const uint4*>(&s.work.bitmap[first_word + 4 * q]);
      }
    } else if (q == 0) {
      if (first_word < words) four.x = s.work.bitmap[first_word];
      if (words_per_thread == 2 && first_word + 1 < words) four.y = s.work.bitmap[first_word + 1];
    }
    mine[4 * q + 0] = four.x;
    mine[4 * q + 1] = four.y;
    mine[4 * q + 2] = four.z;
    mine[4 * q + 3] = four.w;
  }
  uint32_t count = 0;
#pragma unroll
  for (int j = 0; j < kWords; ++j) {
    if (first_word + j >= words) mine[j] = 0;  // past the words MarkWinners zeroed
    count += __popc(mine[j]);
  }
  uint32_t total;
  int position = static_cast<int>(BlockExclusiveSum(s.warp_sums, count, total));
  uint32_t* const ordered = reinterpret_cast<uint32_t*>(s.candidates);
#pragma unroll
  for (int j = 0; j < kWords; ++j) {
    for (uint32_t bits = mine[j]; bits != 0; bits &= bits - 1) {
      ordered[position++] = static_cast<uint32_t>(first_word + j) * 32 + __ffs(bits) - 1;
    }
  }
  __syncthreads();
}

// Writes value bits (float32 bits of a row's element: -inf for an empty slot) to values slot
// `index` in the scores' type: the exact inverse of the widening the loaders apply (sources.cuh),
// so a 16-bit row's value comes back bit for bit (float32 -inf narrows to the 16-bit -inf).
__device__ __forceinline__ void WriteValue(const TopkProblem& problem, int64_t index,
                                           uint32_t bits) {
  switch (problem.score_type) {
    case ScoreType::kFloat32:
      static_cast<uint32_t*>(problem.values)[index] = bits;
      break;
    case ScoreType::kBfloat16:
      static_cast<uint16_t*>(problem.values)[index] = NarrowToBf16Bits(bits);
      break;
    case ScoreType::kFloat16:
      static_cast<uint16_t*>(problem.values)[index] = NarrowToF16Bits(bits);
      break;
  }
}

// Rank order (key descending, then column ascending) sorts only the key bits that tell the
// winners apart: the bits of the row type's own key (a float32 key of a bfloat16 value has 16 low
// bits that carry nothing, of a float16 value 13: KeyShift) and, of those, the span between the
// winners' lowest and highest key. Where that span and the column fit 32 bits together (16-bit
// rows, usually: ~8 key bits and 17 column bits at 131072 columns), one keys-only sort of the
// composite (key - low, reversed column) does it in ceil(bits / radix bits) passes; else a stable
// sort by column, then a descending sort by key - low over the span's bits.
struct KeyRange {
  int shift;     // low key bits every key of the row type has in common with its sign
  uint32_t low;  // the lowest and highest key >> shift among the winners
  uint32_t high;
};

__device__ __forceinline__ int KeyShift(ScoreType type) {
  return type == ScoreType::kBfloat16 ? 16 : (type == ScoreType::kFloat16 ? 13 : 0);
}
// key >> shift -> key: the dropped bits are 0 for a positive key, 1s for a negative one (the
// widened 16-bit value's low bits are zero).
__device__ __forceinline__ uint32_t KeyFromShifted(uint32_t shifted, int shift) {
  const uint32_t key = shifted << shift;
  return (key & 0x80000000u) ? key : key | ((1u << shift) - 1u);
}

// The winners' key range (keys blocked, m of them valid), over the block: each warp's into
// s.warp_key_range; read after the caller's barrier (so the result is only valid after it).
__device__ __forceinline__ KeyRange WinnersKeyRange(SharedStorage& s, ScoreType type,
                                                    const uint32_t (&keys)[kSortItemsPerThread],
                                                    int m) {
  KeyRange range{KeyShift(type), 0xFFFFFFFFu, 0u};
#pragma unroll
  for (int j = 0; j < kSortItemsPerThread; ++j) {
    if (static_cast<int>(threadIdx.x) * kSortItemsPerThread + j < m) {
      range.low = min(range.low, keys[j] >> range.shift);
      range.high = max(range.high, keys[j] >> range.shift);
    }
  }
  range.low = __reduce_min_sync(kFullMask, range.low);
  range.high = __reduce_max_sync(kFullMask, range.high);
  if (threadIdx.x % kWarpSize == 0)
    s.warp_key_range[threadIdx.x / kWarpSize] = make_uint2(range.low, range.high);
  return range;
}

// The block's key range from a warp's (WinnersKeyRange), after the caller's barrier.
__device__ __forceinline__ KeyRange BlockKeyRange(const SharedStorage& s, KeyRange range) {
#pragma unroll
  for (int w = 0; w < kWarpsPerBlock; ++w) {
    const uint2 warp_range = s.warp_key_range[w];
    range.low = min(range.low, warp_range.x);
    range.high = max(range.high, warp_range.y);
  }
  return range;
}

// Sorts the blocked (keys, cols) into rank order, striped (see KeyRange; range: BlockKeyRange's).
__device__ __forceinline__ void SortByRank(SharedStorage& s, KeyRange range, int column_bits, int m,
                                           uint32_t (&keys)[kSortItemsPerThread],
                                           uint32_t (&cols)[kSortItemsPerThread]) {
  const uint32_t span = range.high - range.low;  // no wrap: every key >> shift is below 2^32
  const int span_bits = 32 - __clz(span);
  if (span_bits + column_bits <= 32) {
    // Composite: (key - low) above the reversed column, so that a larger key, then a lower
    // column, sorts first; every winner's is >= 1 (column < 2^column_bits - 1), padding 0.
    const uint32_t column_mask = (1u << column_bits) - 1u;
    uint32_t composite[kSortItemsPerThread];
#pragma unroll
    for (int j = 0; j < kSortItemsPerThread; ++j) {
      const bool valid = static_cast<int>(threadIdx.x) * kSortItemsPerThread + j < m;
      composite[j] =
          valid ? (((keys[j] >> range.shift) - range.low) << column_bits) | (column_mask - cols[j])
                : 0u;
    }
    RankKeySort(s.work.rank_key_sort)
        .SortDescendingBlockedToStriped(composite, 0, span_bits + column_bits);
#pragma unroll
    for (int j = 0; j < kSortItemsPerThread; ++j) {
      cols[j] = column_mask - (composite[j] & column_mask);
      keys[j] = KeyFromShifted(range.low + (composite[j] >> column_bits), range.shift);
    }
    return;
  }
  // key - low + 1 for a winner (padding 0 sorts last), over the bits of span + 1.
  const int relative_bits = 32 - __clz(span + 1u);  // span + 1 <= 2^32 - 1: keys are not NaN
#pragma unroll
  for (int j = 0; j < kSortItemsPerThread; ++j) {
    const bool valid = static_cast<int>(threadIdx.x) * kSortItemsPerThread + j < m;
    keys[j] = valid ? (keys[j] >> range.shift) - range.low + 1u : 0u;
  }
  RankSort sort(s.work.rank_sort);
  sort.Sort(cols, keys, 0, column_bits);  // then a stable sort by key keeps ties in column order
  __syncthreads();
  sort.SortDescendingBlockedToStriped(keys, cols, 0, relative_bits);
#pragma unroll
  for (int j = 0; j < kSortItemsPerThread; ++j)
    keys[j] = KeyFromShifted(keys[j] + range.low - 1u, range.shift);
}

// Rank order of at most kWarpSortItems winners, in place in s.work.selected, by the first warp
// alone (no block barriers): each half of the 64-bit (key, reversed column) composites, one a
// lane, sorted by few_winners.cuh's warp network, then the two merged; nothing when they are in
// rank order already. The block's radix sort would take its passes over all kMaxK slots for a
// handful of winners (top_k's k = 50, say).
constexpr int kWarpSortItems = kFewWinnersMaxK;  // one few-winners list: two items a lane

__device__ __forceinline__ void SortFewByRank(SharedStorage& s, int m) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  uint64_t item[2];  // item r is element r * 32 + lane; 0 (padding) is below every winner's
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int slot = r * kWarpSize + lane;
    item[r] = slot < m ? RankComposite(s.work.selected.bits[slot], s.work.selected.col[slot]) : 0u;
  }
  // Already in rank order (few_winners.cuh puts them so): each item at least its successor's.
  const uint64_t down[2] = {__shfl_down_sync(kFullMask, item[0], 1),
                            __shfl_down_sync(kFullMask, item[1], 1)};
  const uint64_t second_first = __shfl_sync(kFullMask, item[1], 0);  // element 32
  const bool last_lane = lane + 1 == kWarpSize;
  if (__all_sync(kFullMask, item[0] >= (last_lane ? second_first : down[0]) &&
                                (last_lane || item[1] >= down[1])))
    return;
  // Descending first half, ascending second half: a bitonic list of 64, which one merge sorts.
  const uint64_t second = SortWarpDescending(item[1]);
  item[0] = SortWarpDescending(item[0]);
  item[1] = __shfl_sync(kFullMask, second, kWarpSize - 1 - lane);
  MergeBitonicDescending(item);
  __syncwarp();  // every lane has read its items
  PutRankComposites(s, item, m);
}

// Rank order by buckets: the composite c = (key part, reversed column) (the key part: key - low,
// see KeyRange, or the key's dense rank among the winners' keys, see DenseKeyRanks; up to 63 bits)
// is a total order whose descending order is rank order. Its top kBucketBits bits pick one of
// kDigitBins buckets (s.hist counts them, one block scan places them: bucket b's winners go before
// bucket b+1's, the largest first); each winner is put at a free place of its bucket, and its rank
// is its bucket's start plus the members of its bucket with a larger c; the winners are put at
// their ranks in shared memory and written out from there, coalesced. Seven barriers (nine with
// dense ranks), where a radix sort takes about four a pass (seven passes of a bfloat16 row's 26-bit
// composite). When a bucket holds more than kBucketLimit (rows of few distinct keys and crowded
// columns), returns false having changed nothing but s.work (dead: the winners are in registers)
// and the radix sort does it.
constexpr int kBucketBits = 11;  // kDigitBins buckets
constexpr int kBucketLimit = 64;
static_assert(1 << kBucketBits == kDigitBins, "one bucket per s.hist bin");
static_assert(2 * kDigitBins + 1 <= kFrontierCapacity, "bucket starts and cursors in s.work");
static_assert(2 * kMaxK <= kSharedCandidates, "placed and in rank order in s.candidates");

// Dense key ranks for the buckets: a 16-bit row's winners hold few distinct keys (JAX's normal
// rows of 131072: bfloat16 2-3 over a span of ~20-30 keys, float16 ~17 over ~540), so key - low
// takes most of a bucket's 11 bits and each key's winners crowd a few buckets: counted on the
// host, a winner's bucket holds 17-33 on average for bfloat16 (each scanned member by member),
// 64-123 for float16 (over kBucketLimit: the radix sort). The key's rank among the distinct keys
// present takes only the bits of their count, the columns get the rest of the bucket index, and
// the buckets hold 2-5 on average. Used where the span has kDenseMinSpanBits bits or more and
// fits the s.hist bins.
constexpr int kDenseMinSpanBits = 2;
constexpr int kDenseRanksAt = 2 * kDigitBins + 1;  // in s.work.frontier, after the buckets' words
static_assert(kDenseRanksAt + kDigitBins <= kFrontierCapacity, "dense ranks in s.work");

// Replaces each valid winner's key_part (key - low, < kDigitBins) by the number of distinct
// winners' keys below its key, and returns the bits those ranks take. The keys present are
// marked in s.hist (plain stores of 1), counted by one block scan of each thread's bins, and
// their ranks put in s.work.frontier at kDenseRanksAt. s.hist is zero on entry and on return.
// Three barriers, the last before the ranks are read: the caller's next barrier must come before
// anything writes s.work.frontier at kDenseRanksAt or s.warp_sums again (the buckets' scan does).
__device__ __forceinline__ int DenseKeyRanks(SharedStorage& s,
                                             uint32_t (&key_part)[kSortItemsPerThread], int m) {
#pragma unroll
  for (int j = 0; j < kSortItemsPerThread; ++j) {
    if (static_cast<int>(threadIdx.x) * kSortItemsPerThread + j < m) s.hist[key_part[j]] = 1u;
  }
  __syncthreads();
  const int first_bin = static_cast<int>(threadIdx.x) * kBinsPerThread;
  uint32_t present[kBinsPerThread];
  uint32_t mine = 0;
#pragma unroll
  for (int b = 0; b < kBinsPerThread; ++b) {
    present[b] = s.hist[first_bin + b];
    s.hist[first_bin + b] = 0;  // this thread's bins: no other thread reads them now
    mine += present[b];
  }
  uint32_t distinct;
  uint32_t below = BlockExclusiveSum(s.warp_sums, mine, distinct);
  uint32_t* const dense_rank = s.work.frontier + kDenseRanksAt;
#pragma unroll
  for (int b = 0; b < kBinsPerThread; ++b) {
    dense_rank[first_bin + b] = below;
    below += present[b];
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < kSortItemsPerThread; ++j) {
    if (static_cast<int>(threadIdx.x) * kSortItemsPerThread + j < m)
      key_part[j] = dense_rank[key_part[j]];
  }
  return distinct > 1 ? 32 - __clz(distinct - 1) : 0;
}

__device__ __forceinline__ bool WriteRankOrderByBuckets(
    SharedStorage& s, const TopkProblem& problem, const KeyRange& range, int column_bits, int m,
    const uint32_t (&keys)[kSortItemsPerThread], const uint32_t (&cols)[kSortItemsPerThread],
    int32_t* out, int64_t out_offset, const int32_t* page_row, int slots) {
  const uint32_t span = range.high - range.low;
  int key_bits = 32 - __clz(span);
  uint32_t key_part[kSortItemsPerThread];  // key - low, or the key's dense rank: both in order
#pragma unroll
  for (int j = 0; j < kSortItemsPerThread; ++j) key_part[j] = (keys[j] >> range.shift) - range.low;
  if (key_bits >= kDenseMinSpanBits && span < kDigitBins && !ProbeOn(s, kProbeOldBuckets)) {
    key_bits = DenseKeyRanks(s, key_part, m);  // block-uniform
    ProbeCount(s, kCountDenseRanks);
  }
  const int bucket_shift = max(key_bits + column_bits - kBucketBits, 0);
  const uint32_t column_mask = (1u << column_bits) - 1u;
  uint64_t composite[kSortItemsPerThread];
  int bin[kSortItemsPerThread];  // the largest composites in bin 0
#pragma unroll
  for (int j = 0; j < kSortItemsPerThread; ++j) {
    const bool valid = static_cast<int>(threadIdx.x) * kSortItemsPerThread + j < m;
    composite[j] = (uint64_t{key_part[j]} << column_bits) | (column_mask - cols[j]);
    bin[j] = kDigitBins - 1 - static_cast<int>(composite[j] >> bucket_shift);
    if (valid) atomicAdd(&s.hist[bin[j]], 1u);
  }
  __syncthreads();
  // Each thread's kBinsPerThread adjacent bins: counts out (s.hist zero again), starts in.
  const int first_bin = static_cast<int>(threadIdx.x) * kBinsPerThread;
  uint32_t counts[kBinsPerThread];
  uint32_t in_bins = 0;
  uint32_t largest = 0;
#pragma unroll
  for (int b = 0; b < kBinsPerThread; ++b) {
    counts[b] = s.hist[first_bin + b];
    s.hist[first_bin + b] = 0;
    in_bins += counts[b];
    largest = max(largest, counts[b]);
  }
  largest = __reduce_max_sync(kFullMask, largest);
  if (threadIdx.x % kWarpSize == 0) s.warp_bucket_largest[threadIdx.x / kWarpSize] = largest;
  uint32_t total;
  uint32_t start = BlockExclusiveSum(s.warp_sums, in_bins, total);  // its barrier publishes both
#pragma unroll
  for (int w = 0; w < kWarpsPerBlock; ++w) largest = max(largest, s.warp_bucket_largest[w]);
  if (largest > kBucketLimit) return false;                          // block-uniform
  uint32_t* const bucket_start = s.work.frontier;                    // [kDigitBins + 1]
  uint32_t* const bucket_cursor = s.work.frontier + kDigitBins + 1;  // [kDigitBins]
#pragma unroll
  for (int b = 0; b < kBinsPerThread; ++b) {
    bucket_start[first_bin + b] = start;
    bucket_cursor[first_bin + b] = start;
    start += counts[b];
  }
  if (threadIdx.x == 0) bucket_start[kDigitBins] = static_cast<uint32_t>(m);
  __syncthreads();
  uint2* const placed = s.candidates;  // dead since the selection
#pragma unroll
  for (int j = 0; j < kSortItemsPerThread; ++j) {
    if (static_cast<int>(threadIdx.x) * kSortItemsPerThread + j < m) {
      const uint32_t at = atomicAdd(&bucket_cursor[bin[j]], 1u);
      placed[at] = make_uint2(static_cast<uint32_t>(composite[j] >> 32),
                              static_cast<uint32_t>(composite[j]));
    }
  }
  __syncthreads();
  uint2* const in_rank_order = s.candidates + kMaxK;  // (column, key) by rank, after `placed`
#pragma unroll
  for (int j = 0; j < kSortItemsPerThread; ++j) {
    if (static_cast<int>(threadIdx.x) * kSortItemsPerThread + j < m) {
      const uint32_t end = bucket_start[bin[j] + 1];
      uint32_t rank = bucket_start[bin[j]];
      for (uint32_t q = rank; q < end; ++q) {
        const uint2 other = placed[q];
        rank += ((uint64_t{other.x} << 32) | other.y) > composite[j];
      }
      in_rank_order[rank] = make_uint2(cols[j], keys[j]);
    }
  }
  __syncthreads();
  // Every slot from shared memory in rank order: consecutive threads write consecutive slots (a
  // warp store a few sectors), where a store at each winner's own rank touched a sector a lane
  // (benches/NOTES.md "bf16-queue": top_k 5536 x 131072 bfloat16 778 -> 717 us).
  const bool with_values = problem.values != nullptr;
  for (int slot = threadIdx.x; slot < slots; slot += kThreadsPerBlock) {
    const uint2 winner = slot < m ? in_rank_order[slot] : make_uint2(0u, 0u);
    out[slot] =
        slot < m ? PageTransform(static_cast<int32_t>(winner.x), page_row, problem.log2_page_size)
                 : kEmptySlot;
    if (with_values) {
      WriteValue(problem, out_offset + slot,
                 slot < m ? BitsFromOrderedKeyF32(winner.y) : kNegInfF32Bits);
    }
  }
  __syncthreads();  // the buffers are reused by the next row
  return true;
}

// Writes m winners to out slots [first_slot, first_slot + m) and, with pad, kEmptySlot to the
// slots after them up to k: ascending, or by key descending then column ascending when sorted;
// page-transformed, coalesced. by_bitmap: the winners are marked in s.work.bitmap for columns
// [base, base + span); else they are in s.work.selected. With problem.values, each winner's value
// goes to the same slot of the values (-inf in kEmptySlot slots); the bitmap holds no values, so
// such calls never order by bitmap (OrdersByBitmap).
__device__ __forceinline__ void WriteWinners(SharedStorage& s, const TopkProblem& problem, int m,
                                             int first_slot, int base, int span, bool by_bitmap,
                                             bool pad) {
  const int slots = pad ? problem.k - first_slot : m;
  const int64_t out_offset = s.job.row * problem.k + first_slot;
  int32_t* out = problem.out + out_offset;
  const bool with_values = problem.values != nullptr;  // uniform; never with by_bitmap
  const int32_t* page_row = m > 0 ? PageTableRow(problem, s.job.row) : nullptr;
  if (by_bitmap) {
    if (m > 0) {
      const int words = (span + 31) / 32;
      int words_per_thread = 1;  // the fewest of 1, 2, 4, ... that cover the span
      while (words_per_thread * kThreadsPerBlock < words) words_per_thread *= 2;
      if (words_per_thread <= 8) {  // fewer registers and unrolled steps for spans <= 131072
        OrderBitmap<8>(s, words, words_per_thread);
      } else {
        OrderBitmap<kBitmapWordsPerThread>(s, words, words_per_thread);
      }
    }
    const uint32_t* const ordered = reinterpret_cast<const uint32_t*>(s.candidates);
    for (int slot = threadIdx.x; slot < slots; slot += kThreadsPerBlock) {
      out[slot] = slot < m ? PageTransform(static_cast<int32_t>(base + ordered[slot]), page_row,
                                           problem.log2_page_size)
                           : kEmptySlot;
    }
    __syncthreads();  // the buffers are reused by the next row
    return;
  }
  uint32_t cols[kSortItemsPerThread];
  uint32_t keys[kSortItemsPerThread];
  const bool few = problem.sorted && m <= kWarpSortItems;  // one warp sorts them in place
  if (few) {
    if (threadIdx.x < kWarpSize) SortFewByRank(s, m);
    __syncthreads();
  }
#pragma unroll
  for (int j = 0; j < kSortItemsPerThread; ++j) {  // blocked (striped when few: sorted already)
    const int slot =
        few ? threadIdx.x + kThreadsPerBlock * j : threadIdx.x * kSortItemsPerThread + j;
    cols[j] = slot < m ? s.work.selected.col[slot] : 0xFFFFFFFFu;  // padding sorts last both ways
    keys[j] = slot < m ? OrderedKeyF32(s.work.selected.bits[slot]) : 0u;  // 0: below every key
  }
  KeyRange range{};
  if (problem.sorted && !few && m > 1) range = WinnersKeyRange(s, problem.score_type, keys, m);
  __syncthreads();  // the sort storage aliases the selection; the warps' key ranges are in
  if (m > 1 && !few) {
    // Columns are < length < 2^column_bits, so the padding stays above them.
    const int column_bits = 32 - __clz(static_cast<int>(s.job.length));
    if (problem.sorted) {
      range = BlockKeyRange(s, range);
      if (WriteRankOrderByBuckets(s, problem, range, column_bits, m, keys, cols, out, out_offset,
                                  page_row, slots)) {
        return;
      }
      ProbeCount(s, kCountBucketSpill);
      SortByRank(s, range, column_bits, m, keys, cols);
    } else if (with_values) {  // the keys ride along as the sort's values
      RankSort(s.work.rank_sort).SortBlockedToStriped(cols, keys, 0, column_bits);
    } else {
      ColumnSort(s.work.column_sort).SortBlockedToStriped(cols, 0, column_bits);
    }
  }  // m <= 1: slot 0 sits in the same place blocked and striped
#pragma unroll
  for (int j = 0; j < kSortItemsPerThread; ++j) {
    const int slot = threadIdx.x + kThreadsPerBlock * j;
    if (slot < slots) {
      if (with_values) {
        WriteValue(problem, out_offset + slot,
                   slot < m ? BitsFromOrderedKeyF32(keys[j]) : kNegInfF32Bits);
      }
      out[slot] =
          slot < m ? PageTransform(static_cast<int32_t>(cols[j]), page_row, problem.log2_page_size)
                   : kEmptySlot;
    }
  }
  __syncthreads();  // the sort storage is reused by the next row
}

}  // namespace
}  // namespace jax_topk
