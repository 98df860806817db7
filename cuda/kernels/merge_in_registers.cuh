// merge_topk for rows of m <= 16384 candidates: a persistent 512-thread block an SM, the row in
// registers (32 candidates a thread: 32-bit ordered key and column), read once with 16-byte
// loads; rows of m <= 4096 (8192) take a narrow instance of 8 (16) candidates a thread, two
// blocks an SM.
// While the wide block works on a row, the copy engine brings its next row into shared
// memory (bulk copies counted on an mbarrier; `staged`, where the row's parts are 16-byte
// multiples) and the one after into L2; unstaged rows (and the narrow instances') load from
// global memory.
// 0. The sampled path (when `sampled`), tried first: 1024 of the row's keys (two a thread,
//    spread over every list) give a cutoff, the key whose rank among them is k's share plus 4
//    standard deviations (two 11-bit digits of a select over the sample); the candidates at or
//    above it (~k + 30 %) go to a shared list, ranked by 16384 buckets of its order code
//    (`fine`: merge_fine_buckets.cuh; else step 2's method), and ranks < k win. The sample
//    only decides how fast: when fewer than min(k, candidates) or more than kListCapacity
//    pass, or a bucket that gets ranks is crowded, the row takes steps 1-2 from its registers.
// 1. Radix select on the ordered key, 11-bit digits in a shared histogram: the first pass over
//    the registers (it also counts the candidates); the boundary bin's entries, when they fit,
//    go to a shared list and the later passes run over it. A tied k-th key adds the same select
//    over its entries' columns (smallest first); equal (key, column) pairs fill the rest.
// 2. The winners go to shared memory by a block scan; each is ranked within its bucket of the
//    top 11 bits of a code holding only the bits the winners differ in, and written at its rank
//    (a cub::BlockRadixSort on the code when a bucket is crowded).
// Traffic: m x (value + 4 bytes) read once a row, k x (value + 4) written.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cub/block/block_radix_sort.cuh>

#include "common/topk_common.h"
#include "kernels/bulk_copy.cuh"
#include "kernels/l2_prefetch.cuh"
#include "kernels/mbarrier.cuh"
#include "kernels/merge_fine_buckets.cuh"
#include "kernels/topk_scan.cuh"

namespace jax_topk {
namespace merge_registers {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = 4;  // candidates a vector load: 16 bytes of columns
// Three instances: the wide one, kWideChunks chunks a thread (32 candidates, m <= 16384), one
// block an SM for its registers; the narrow ones, kNarrowChunks (8 candidates, m <= 4096: two
// lists of 2048, a running top-k over chunks) and kMidChunks (16, m <= 8192: four lists), two
// blocks an SM, so that one block's barriers and round trips overlap the other's work
// (benches/NOTES.md "merge_topk: two narrow blocks an SM").
constexpr int kWideChunks = 8;
constexpr int kMidChunks = 4;
constexpr int kNarrowChunks = 2;
template <int kChunks>
constexpr int kItemsOf = kChunk * kChunks;  // candidates a thread
// Chunk c of the row is read by the threads rotated by c * kRotationOf: a warp still loads 32
// consecutive 16-byte pieces, but when the row is lists in rank order (top_k(sorted=True)'s
// results, one a chunk at 8 x 2048), each list's leading ranks, where the winners are, fall to
// different warps instead of all to warps 0-2, which then did the whole filter alone.
template <int kChunks>
constexpr int kRotationOf = kThreads / kChunks;
template <int kChunks>
constexpr bool kKeepsWarpPiecesOf = kThreads % kChunks == 0 && kRotationOf<kChunks> % 32 == 0;
static_assert(kKeepsWarpPiecesOf<kWideChunks> && kKeepsWarpPiecesOf<kMidChunks> &&
                  kKeepsWarpPiecesOf<kNarrowChunks>,
              "a warp's pieces stay 32 consecutive ones, and each thread keeps its lane");
template <int kChunks>
constexpr int64_t kWidthOf = int64_t{kThreads} * kItemsOf<kChunks>;
constexpr int64_t kMaxWidth = kWidthOf<kWideChunks>;
// Blocks an SM an instance is built for (its registers: 128 a thread, or 64), and whether it
// stages its next row (two blocks' staged rows beside their shared state would not fit an SM).
template <int kChunks>
constexpr int kBlocksPerSmOf = kChunks < kWideChunks ? 2 : 1;
template <int kChunks>
constexpr bool kStagesRowsOf = kBlocksPerSmOf<kChunks> == 1;
// Whether this compilation has the copy engine's bulk copies (sm_90): code built for an older
// target (run on an older device, or JIT-compiled from older PTX on a newer one) never takes
// the staged path, whose copies would compile to nothing there.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
constexpr bool kHasBulkCopies = false;
#else
constexpr bool kHasBulkCopies = true;
#endif
constexpr int kDigitBits = 11;
constexpr int kBins = 1 << kDigitBits;
constexpr int kBinsPerThread = kBins / kThreads;
constexpr int kListItems = kMaxK / kThreads;  // list entries, winners and sort items a thread
constexpr int kMaxBucket = 64;       // a crowded bucket: the ranks by comparison would cost more
constexpr int kListCapacity = 4096;  // the sampled path's list (~2800 kept at k = 2048, m = 16384)
constexpr int kListSlots = kListCapacity / kThreads;
constexpr int kSamples = 2;  // keys a thread in the sample
constexpr unsigned kAllLanes = 0xFFFFFFFFu;
// The probe build (-DJAX_TOPK_MERGE_PROBE=1) can end a row's sampled path early, to time its
// phases (the output is then not the merge): `probe_stop` 1 after the load, 2 after the
// cutoff, 3 after the filter, 4 after the fine rank's placing; 0 never.
#ifndef JAX_TOPK_MERGE_PROBE
#define JAX_TOPK_MERGE_PROBE 0
#endif
constexpr bool kProbe = JAX_TOPK_MERGE_PROBE;
static_assert(kListItems * kThreads == kMaxK, "the list and the sort hold k <= kMaxK");

struct BinFound {
  uint32_t bin, above, count;
};

// The smallest and largest key and column of a set of candidates.
struct Span {
  uint32_t key_min, key_max, column_min, column_max;
  __device__ __forceinline__ void Reset() {
    key_min = column_min = 0xFFFFFFFFu;
    key_max = column_max = 0;
  }
  // Every thread adds its own extremes (a warp reduces them first).
  __device__ __forceinline__ void Add(uint32_t my_key_min, uint32_t my_key_max,
                                      uint32_t my_column_min, uint32_t my_column_max) {
    my_key_min = __reduce_min_sync(0xFFFFFFFFu, my_key_min);
    my_key_max = __reduce_max_sync(0xFFFFFFFFu, my_key_max);
    my_column_min = __reduce_min_sync(0xFFFFFFFFu, my_column_min);
    my_column_max = __reduce_max_sync(0xFFFFFFFFu, my_column_max);
    if (threadIdx.x % 32 == 0) {
      atomicMin(&key_min, my_key_min), atomicMax(&key_max, my_key_max);
      atomicMin(&column_min, my_column_min), atomicMax(&column_max, my_column_max);
    }
  }
};

struct Shared {
  using Sort32 = cub::BlockRadixSort<uint32_t, kThreads, kListItems>;
  using Sort64 = cub::BlockRadixSort<uint64_t, kThreads, kListItems>;
  union {
    typename Sort32::TempStorage sort32;
    typename Sort64::TempStorage sort64;
    struct {
      uint32_t keys[kListCapacity];
      int32_t columns[kListCapacity];
    } list;  // the boundary bin's entries during the select, then the winners (in no order);
             // the sampled path's kept candidates, then its winners in rank order
    uint64_t placed_by_column[kListCapacity];  // the fine rank's winners by (column, key)
  };
  union {
    uint16_t order[kListCapacity];   // slots by bucket
    uint64_t placed[kListCapacity];  // the fine rank's kept candidates by (key, column)
  };
  union {
    uint32_t hist[kBins];  // zero between uses (inside fine's words, zero between uses too)
    FineBuckets<kThreads> fine;
  };
  uint32_t warp_sums[kWarps];
  BinFound found;
  int32_t equal_taken;
  Span winners, kept;  // the winners' spans; the sampled path's kept candidates'
  uint32_t bucket_max, kept_bucket_max;
  uint32_t straddler_count;  // the flagged route's short list of the straddling bucket
  uint64_t row_landed;       // mbarrier: the staged row has landed (its phase flips each row)
};

// Where the staged row starts in the dynamic shared memory, and the bytes it all takes.
__host__ __device__ constexpr size_t StagedOffset() {
  return (sizeof(Shared) + 15) / 16 * 16;
}
template <typename Bits>
__host__ __device__ constexpr size_t SharedBytes(bool staged, int64_t width) {
  return StagedOffset() + (staged ? static_cast<size_t>(width) * (sizeof(Bits) + 4) : 0);
}
static_assert(SharedBytes<uint32_t>(true, kMaxWidth) <= 227 * 1024,
              "a float32 row staged fits the shared memory of one block per SM");

// What a select decided: items whose projection masked by `mask` is above `prefix` win; of
// those equal to it all win when `exact`, else `needed` of them (mask is then every bit).
// `matching`: how many items match the prefix; `total`: how many counted in the first pass.
struct Cut {
  uint32_t prefix, mask, needed, matching, total;
  bool exact;
};

// Adds the counted lanes to hist[digit]; a warp whose counted lanes share one digit adds once
// (rows of equal values would otherwise serialise on one address).
__device__ __forceinline__ void CountLanes(uint32_t* hist, uint32_t digit, bool counted) {
  const uint32_t voters = __ballot_sync(kAllLanes, counted);
  if (voters == 0) return;
  const int leader = __ffs(voters) - 1;
  const uint32_t leader_digit = __shfl_sync(kAllLanes, digit, leader);
  if (__all_sync(kAllLanes, !counted || digit == leader_digit)) {
    if (static_cast<int>(threadIdx.x % 32) == leader) atomicAdd(&hist[digit], __popc(voters));
  } else if (counted) {
    atomicAdd(&hist[digit], 1u);
  }
}

// One digit, bits [shift, high) with shift = max(high - 11, 0), of the projections
// project(i, value) of items i < kCount (true when item i counts) that match cut's prefix:
// the histogram, then the bin holding the cut.needed-th largest. Every thread calls it with
// block-uniform arguments; it ends with a barrier.
template <int kCount, class Project>
__device__ __forceinline__ void SelectDigit(Shared& s, const Project& project, Cut& cut, int high) {
  const int shift = high > kDigitBits ? high - kDigitBits : 0;
  const uint32_t digit_mask = (1u << (high - shift)) - 1u;
#pragma unroll
  for (int i = 0; i < kCount; ++i) {
    uint32_t value = 0;
    const bool counted = project(i, value) && (value & cut.mask) == cut.prefix;
    CountLanes(s.hist, (value >> shift) & digit_mask, counted);
  }
  __syncthreads();
  uint32_t counts[kBinsPerThread];
  uint32_t mine = 0;
#pragma unroll
  for (int j = 0; j < kBinsPerThread; ++j) {
    const int bin = kBins - 1 - (static_cast<int>(threadIdx.x) * kBinsPerThread + j);
    counts[j] = s.hist[bin];
    s.hist[bin] = 0;
    mine += counts[j];
  }
  uint32_t total;
  uint32_t above = BlockExclusiveSum<kWarps>(s.warp_sums, mine, total);
#pragma unroll
  for (int j = 0; j < kBinsPerThread; ++j) {
    const uint32_t bin = kBins - 1 - (threadIdx.x * kBinsPerThread + j);
    if (above < cut.needed && cut.needed <= above + counts[j]) s.found = {bin, above, counts[j]};
    above += counts[j];
  }
  if (cut.mask == 0) cut.total = total;
  if (total <= cut.needed) {  // every item matching the prefix wins (first digit only)
    cut.needed = cut.matching = total;
    cut.exact = true;
  }
  __syncthreads();
  if (cut.exact) return;
  const BinFound found = s.found;
  cut.prefix |= found.bin << shift;
  cut.mask |= digit_mask << shift;
  cut.needed -= found.above;
  cut.matching = found.count;
  cut.exact = found.count == cut.needed;
}

// The digits below `high` (every thread calls it).
template <int kCount, class Project>
__device__ __forceinline__ void SelectRest(Shared& s, const Project& project, Cut& cut, int high) {
#pragma unroll 1
  for (; high > 0 && !cut.exact; high -= kDigitBits) SelectDigit<kCount>(s, project, cut, high);
}

// Exclusive positions for each thread's `count` items, in thread order; the total.
__device__ __forceinline__ uint32_t Positions(Shared& s, uint32_t count, uint32_t& total) {
  return BlockExclusiveSum<kWarps>(s.warp_sums, count, total);
}

// Thread 0: the copy engine brings row `row` (values, then columns: both 16-byte multiples)
// into the staging buffer, after the block's reads of the previous row (a barrier before).
template <typename Bits>
__device__ __forceinline__ void StageRow(uint64_t& barrier, Bits* staged_values, const Bits* values,
                                         const int32_t* indices, int64_t row, int64_t width) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint32_t value_bytes = static_cast<uint32_t>(width * sizeof(Bits));
  const uint32_t column_bytes = static_cast<uint32_t>(width * sizeof(int32_t));
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // reads before the overwrite
  MbarrierExpectBytes(&barrier, value_bytes + column_bytes);
  BulkCopyToShared(staged_values, values + row * width, value_bytes, &barrier);
  BulkCopyToShared(reinterpret_cast<unsigned char*>(staged_values) + value_bytes,
                   indices + row * width, column_bytes, &barrier);
#endif
}

// After the bucket counts' atomics (and a barrier): s.hist[b] becomes bucket b's start in
// ascending order, and the largest count of a bucket starting before `ranked` (those that
// get ranks) goes into `largest_bucket` (zero before). Ends with a barrier.
__device__ __forceinline__ void BucketStarts(Shared& s, uint32_t ranked, uint32_t& largest_bucket) {
  uint32_t counts[kBinsPerThread];
  uint32_t mine = 0, largest = 0;
#pragma unroll
  for (int j = 0; j < kBinsPerThread; ++j) {
    counts[j] = s.hist[threadIdx.x * kBinsPerThread + j];
    mine += counts[j];
  }
  uint32_t bucket_total;
  uint32_t start = Positions(s, mine, bucket_total);
#pragma unroll
  for (int j = 0; j < kBinsPerThread; ++j) {
    s.hist[threadIdx.x * kBinsPerThread + j] = start;
    if (start < ranked) largest = max(largest, counts[j]);
    start += counts[j];
  }
  largest = __reduce_max_sync(kAllLanes, largest);
  if (threadIdx.x % 32 == 0) atomicMax(&largest_bucket, largest);
  __syncthreads();
}

// Bits needed to write x.
__device__ __forceinline__ int BitsOf(uint32_t x) {
  return 32 - __clz(x);
}

// The winners' order as one ascending number of key_bits + column_bits bits: (key descending,
// column ascending) when sorted, else (column ascending, key descending).
struct OrderCode {
  bool sorted;
  int key_bits, column_bits;
  uint32_t key_max, column_min;
  __device__ __forceinline__ uint64_t operator()(uint32_t key, int32_t column) const {
    const uint64_t key_part = key_max - key;
    const uint64_t column_part = static_cast<uint32_t>(column) - column_min;
    return sorted ? (key_part << column_bits | column_part) : (column_part << key_bits | key_part);
  }
};

// The order code over the items whose spans are `span` (`any`: there is one).
__device__ __forceinline__ OrderCode CodeOver(const Span& span, bool sorted, bool any) {
  OrderCode code{sorted, 0, 0, span.key_max, span.column_min};
  if (any) {
    code.key_bits = BitsOf(span.key_max - span.key_min);
    code.column_bits = BitsOf(span.column_max - span.column_min);
  }
  return code;
}

// The crowded case: the `taken` winners (s.list) sorted with cub on their codes, a flag bit
// above marking the pads (ascending: pads last); put(rank, key, column) for each, the key and
// column read back from the code.
template <typename Code, class Sort, class Storage, class Put>
__device__ __forceinline__ void SortAndPut(Storage& storage, Shared& s, int taken,
                                           const OrderCode& code, const Put& put) {
  const int bits = code.key_bits + code.column_bits;
  Code items[kListItems];
#pragma unroll
  for (int i = 0; i < kListItems; ++i) {
    const int slot = static_cast<int>(threadIdx.x) * kListItems + i;
    items[i] = slot < taken ? static_cast<Code>(code(s.list.keys[slot], s.list.columns[slot]))
                            : static_cast<Code>(Code{1} << bits);
  }
  __syncthreads();  // the winners' storage becomes the sort's
  Sort(storage).SortBlockedToStriped(items, 0, bits + 1);
  const int low_bits = code.sorted ? code.column_bits : code.key_bits;
  const uint64_t low_mask = (uint64_t{1} << low_bits) - 1;
  const uint64_t high_mask = (uint64_t{1} << (bits - low_bits)) - 1;
#pragma unroll
  for (int i = 0; i < kListItems; ++i) {
    const int rank = i * kThreads + static_cast<int>(threadIdx.x);
    if (rank >= taken) continue;
    const uint64_t item = items[i];
    const uint32_t high = static_cast<uint32_t>((item >> low_bits) & high_mask);
    const uint32_t low = static_cast<uint32_t>(item & low_mask);
    const uint32_t key = code.key_max - (code.sorted ? high : low);
    const uint32_t column = code.column_min + (code.sorted ? low : high);
    put(rank, key, static_cast<int32_t>(column));
  }
}

// Step 2: the `taken` winners in s.list (their spans in s.winners, s.hist zero) written at
// their ranks in the output order, the slots past them empty. Every thread calls it.
template <typename Values>
__device__ __forceinline__ void WriteInOrder(Shared& s, int taken, int32_t k, bool sorted,
                                             typename Values::Bits* row_out_values,
                                             int32_t* row_out_indices) {
  const OrderCode code = CodeOver(s.winners, sorted, taken > 0);
  const int code_bits = code.key_bits + code.column_bits;
  const auto put = [&](int rank, uint32_t key, int32_t column) {
    row_out_indices[rank] = column;
    row_out_values[rank] = Values::FromKey(key);
  };
  for (int slot = taken + threadIdx.x; slot < k; slot += kThreads) {
    row_out_indices[slot] = kEmptySlot;
    row_out_values[slot] = Values::kEmpty;
  }
  //    Buckets: the top 11 bits of the code; their counts and starts (ascending).
  const int bucket_shift = code_bits > kDigitBits ? code_bits - kDigitBits : 0;
  uint64_t my_codes[kListItems];
  uint32_t my_buckets[kListItems];
#pragma unroll
  for (int i = 0; i < kListItems; ++i) {
    const int slot = i * kThreads + static_cast<int>(threadIdx.x);
    my_codes[i] = slot < taken ? code(s.list.keys[slot], s.list.columns[slot]) : 0;
    my_buckets[i] = static_cast<uint32_t>(my_codes[i] >> bucket_shift);
    if (slot < taken) atomicAdd(&s.hist[my_buckets[i]], 1u);
  }
  __syncthreads();
  BucketStarts(s, taken, s.bucket_max);
  if (s.bucket_max <= kMaxBucket) {
    //  Slots by bucket, then each winner's rank: its bucket's start plus the winners of its
    //  bucket with a smaller code (or an equal one at a lower slot).
#pragma unroll
    for (int i = 0; i < kListItems; ++i) {
      const int slot = i * kThreads + static_cast<int>(threadIdx.x);
      if (slot < taken) s.order[atomicAdd(&s.hist[my_buckets[i]], 1u)] = slot;
    }
    __syncthreads();  // s.hist[b] now ends bucket b
#pragma unroll
    for (int i = 0; i < kListItems; ++i) {
      const int slot = i * kThreads + static_cast<int>(threadIdx.x);
      if (slot >= taken) continue;
      const uint32_t b = my_buckets[i];
      const uint32_t first = b > 0 ? s.hist[b - 1] : 0, end = s.hist[b];
      uint32_t rank = first;
      for (uint32_t j = first; j < end; ++j) {
        const int other = s.order[j];
        const uint64_t other_code = code(s.list.keys[other], s.list.columns[other]);
        rank += other_code < my_codes[i] || (other_code == my_codes[i] && other < slot);
      }
      put(static_cast<int>(rank), s.list.keys[slot], s.list.columns[slot]);
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kBinsPerThread; ++j) s.hist[threadIdx.x * kBinsPerThread + j] = 0;
  } else {
#pragma unroll
    for (int j = 0; j < kBinsPerThread; ++j) s.hist[threadIdx.x * kBinsPerThread + j] = 0;
    if (code_bits + 1 <= 32) {
      SortAndPut<uint32_t, Shared::Sort32>(s.sort32, s, taken, code, put);
    } else {
      SortAndPut<uint64_t, Shared::Sort64>(s.sort64, s, taken, code, put);
    }
  }
}

// The items marked in `marked` (bit i: item i) to s.list from slot `at` on, their extremes
// added to `span` (every thread calls it; a barrier must follow before they are read).
template <int kItems>
__device__ __forceinline__ void ListMarked(Shared& s, const uint32_t (&keys)[kItems],
                                           const int32_t (&columns)[kItems], uint32_t marked,
                                           uint32_t at, Span& span) {
  uint32_t key_min = 0xFFFFFFFFu, key_max = 0, column_min = 0xFFFFFFFFu, column_max = 0;
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    if (marked >> i & 1u) {
      s.list.keys[at] = keys[i];
      s.list.columns[at] = columns[i];
      ++at;
      const uint32_t column = static_cast<uint32_t>(columns[i]);
      key_min = min(key_min, keys[i]), key_max = max(key_max, keys[i]);
      column_min = min(column_min, column), column_max = max(column_max, column);
    }
  }
  span.Add(key_min, key_max, column_min, column_max);
}

// The sample's rank whose key is the cutoff: the top k's expected share of the sample plus 4
// standard deviations (a binomial count's), so that fewer than k candidates pass about once in
// 30000 rows of distinct keys. The sample is a fixed kThreads * kSamples of an instance's
// kThreads * kItems places (1 in 16 wide, 1 in 8 mid, 1 in 4 narrow, evenly over every chunk), so a
// row of any width holds that share of its places and its top k that share of k: the share does not
// depend on the width. (It was taken as k's share of all 1024 places, which over-kept narrower
// rows: 4 x 2048 kept ~5100 > kListCapacity and always fell back, 2 x 2048 kept all 4096;
// benches/NOTES.md "the sample's rate".)
template <int kItems>
__device__ __forceinline__ uint32_t SampleRank(int32_t k) {
  const float expected =
      static_cast<float>(k) * (kThreads * kSamples) / static_cast<float>(kThreads * kItems);
  return static_cast<uint32_t>(ceilf(expected + 4.0f * sqrtf(expected) + 1.0f));
}

// Step 0's rank when `fine`: the `kept` candidates in s.list (their spans in s.kept) placed by
// fine buckets of their (key descending, column ascending) code (merge_fine_buckets.cuh).
// Sorted, ranks < taken are the output places. Unsorted, that code only decides the winners:
// every candidate of a bucket ending by rank `taken` wins, and of the one bucket straddling it
// those ranked below `taken`. Then the winners are placed and ranked by (column ascending, key
// descending): the same code with its halves swapped. kFlagWinners: the winners are flagged
// where they are (the straddling bucket's members ranked in a short list); else they are
// placed by the first code, the straddling bucket ranked there, and placed again from there.
// Returns false, before it writes anything, when a bucket that gets ranks is crowded (s.fine
// zero again).
template <typename Values, bool kFlagWinners>
__device__ __forceinline__ bool RankByFineBuckets(Shared& s, int kept, int taken, int32_t k,
                                                  bool sorted,
                                                  typename Values::Bits* row_out_values,
                                                  int32_t* row_out_indices, int probe_stop) {
  const OrderCode code = CodeOver(s.kept, true, kept > 0);
  const OrderCode column_code{false, code.key_bits, code.column_bits, code.key_max,
                              code.column_min};
  const int code_bits = code.key_bits + code.column_bits;
  const int shift =
      code_bits > FineBuckets<kThreads>::kBits ? code_bits - FineBuckets<kThreads>::kBits : 0;
  const auto column_mask = [&] { return (uint64_t{1} << code.column_bits) - 1; };
  const auto key_mask = [&] { return (uint64_t{1} << code.key_bits) - 1; };
  const uint32_t limit = static_cast<uint32_t>(taken);
  const auto bucket_of = [&](uint64_t c) { return static_cast<uint32_t>(c >> shift); };
  const auto code_of_slot = [&](int slot) { return code(s.list.keys[slot], s.list.columns[slot]); };
  const auto fill_empty = [&] {
    for (int slot = taken + threadIdx.x; slot < k; slot += kThreads) {
      row_out_indices[slot] = kEmptySlot;
      row_out_values[slot] = Values::kEmpty;
    }
  };
  // The last step of both unsorted routes: the `taken` winners' column codes in placed[0,
  // taken), grouped by bucket (s.fine holds their starts), ranked and written.
  const auto write_by_column = [&](const uint64_t* placed) {
#pragma unroll
    for (int j = 0; j < kListItems; ++j) {
      const uint32_t place = j * kThreads + threadIdx.x;
      if (place >= limit) continue;
      const uint64_t c = placed[place];
      const uint32_t first = s.fine.Start(bucket_of(c));
      const uint32_t rank = RankInBucket(placed, place, c, first, s.fine.End(bucket_of(c), taken));
      row_out_indices[rank] = static_cast<int32_t>(code.column_min + (c >> code.key_bits));
      row_out_values[rank] = Values::FromKey(code.key_max - static_cast<uint32_t>(c & key_mask()));
    }
    fill_empty();
    __syncthreads();  // every rank read s.fine
    s.fine.Zero();
  };
  if (kFlagWinners && !sorted) {
    uint32_t arrivals[kListSlots / 2];  // unused: nothing is placed by this code
    if (!CountIntoBuckets<kListSlots>(s.fine, kept, ~0u, code_of_slot, shift, limit, true,
                                      kMaxBucket, arrivals))
      return false;
    if (kProbe && probe_stop == 4) {
      s.fine.Zero();
      return true;
    }
    //  Winners: the slots whose bucket ends by `limit`; the straddling bucket's members (at
    //  most kMaxBucket) to a short list after the column placing's room, with their slots.
    uint64_t* straddlers = s.placed + kMaxK;
    uint64_t* straddler_slots = straddlers + kMaxBucket;
    uint32_t won = 0, straddling = 0, straddle_first = 0;
#pragma unroll 1  // few registers: the row's items are held for the fallback
    for (int j = 0; j < kListSlots; ++j) {
      const int slot = j * kThreads + static_cast<int>(threadIdx.x);
      if (slot >= kept) continue;
      const uint64_t c = code_of_slot(slot);
      const uint32_t first = s.fine.Start(bucket_of(c)), end = s.fine.End(bucket_of(c), kept);
      if (end <= limit) {
        won |= 1u << j;
      } else if (first < limit) {
        straddling |= 1u << j;
        straddle_first = first;  // one bucket straddles: the same for every member
        const uint32_t at = atomicAdd(&s.straddler_count, 1u);
        straddlers[at] = c;
        straddler_slots[at] = static_cast<uint64_t>(slot);
      }
    }
    __syncthreads();  // every start read, every straddler listed
    s.fine.Zero();
    const uint32_t straddler_count = s.straddler_count;
#pragma unroll 1
    for (int j = 0; j < kListSlots; ++j) {
      if (!(straddling >> j & 1u)) continue;
      const uint64_t slot = static_cast<uint64_t>(j * kThreads + threadIdx.x);
      const uint64_t c = code_of_slot(static_cast<int>(slot));
      uint32_t rank = straddle_first;
      for (uint32_t q = 0; q < straddler_count; ++q) {
        const uint64_t other = straddlers[q];
        rank += other < c || (other == c && straddler_slots[q] < slot);
      }
      if (rank < limit) won |= 1u << j;
    }
    __syncthreads();  // s.fine zero before the column counts
    const auto column_code_of_slot = [&](int slot) {
      return column_code(s.list.keys[slot], s.list.columns[slot]);
    };
    if (!PlaceByBucket<kListSlots>(s.fine, kept, won, column_code_of_slot, shift, limit, false,
                                   kMaxBucket, s.placed))
      return false;
    write_by_column(s.placed);
    return true;
  }
  if (!PlaceByBucket<kListSlots>(s.fine, kept, ~0u, code_of_slot, shift, limit, !sorted, kMaxBucket,
                                 s.placed))
    return false;
  if (kProbe && probe_stop == 4) {
    s.fine.Zero();
    return true;
  }
  if (sorted) {
#pragma unroll
    for (int j = 0; j < kListSlots; ++j) {
      const uint32_t place = j * kThreads + threadIdx.x;
      if (place >= static_cast<uint32_t>(kept)) continue;
      const uint64_t c = s.placed[place];
      const uint32_t first = s.fine.Start(bucket_of(c));
      if (first >= limit) continue;
      const uint32_t rank = RankInBucket(s.placed, place, c, first, s.fine.End(bucket_of(c), kept));
      if (rank >= limit) continue;
      row_out_indices[rank] = static_cast<int32_t>(code.column_min + (c & column_mask()));
      row_out_values[rank] =
          Values::FromKey(code.key_max - static_cast<uint32_t>(c >> code.column_bits));
    }
    fill_empty();
    __syncthreads();  // every rank read s.fine
    s.fine.Zero();
    return true;
  }
  //  Unsorted: the bucket holding rank `taken` (at most kMaxBucket places, so at most one a
  //  thread) ranked, and its winners moved to places [its start, taken).
  uint32_t moved_to = kListCapacity;
  uint64_t moved = 0;
#pragma unroll
  for (int j = 0; j < kListSlots; ++j) {
    const uint32_t place = j * kThreads + threadIdx.x;
    if (place >= static_cast<uint32_t>(kept)) continue;
    const uint64_t c = s.placed[place];
    const uint32_t first = s.fine.Start(bucket_of(c)), end = s.fine.End(bucket_of(c), kept);
    if (first < limit && limit < end) {
      const uint32_t rank = RankInBucket(s.placed, place, c, first, end);
      if (rank < limit) moved_to = rank, moved = c;
    }
  }
  __syncthreads();  // every rank read s.placed and s.fine
  s.fine.Zero();
  if (moved_to < limit) s.placed[moved_to] = moved;
  __syncthreads();
  const auto column_code_of_place = [&](int place) {
    const uint64_t c = s.placed[place];
    return (c & column_mask()) << code.key_bits | c >> code.column_bits;
  };
  if (!PlaceByBucket<kListItems>(s.fine, taken, ~0u, column_code_of_place, shift, limit, false,
                                 kMaxBucket, s.placed_by_column))
    return false;
  write_by_column(s.placed_by_column);
  return true;
}

// Step 0 (every thread calls it with block-uniform arguments): the sampled path of one row
// held in keys / columns. Returns false, before it writes anything, when the row must take
// steps 1-2 (s.hist zero again, the registers untouched).
template <typename Values, bool kFlagWinners, int kItems>
__device__ __forceinline__ bool MergeBySample(Shared& s, const uint32_t (&keys)[kItems],
                                              const int32_t (&columns)[kItems],
                                              uint32_t sample_rank, int32_t k, bool sorted,
                                              bool fine, typename Values::Bits* row_out_values,
                                              int32_t* row_out_indices, int probe_stop) {
  // The sample: items lane and lane + kItems / 2 (mod kItems) of each thread, so every chunk
  // (list) is sampled.
  const int lane = static_cast<int>(threadIdx.x % 32);
  uint32_t sample[kSamples] = {0, 0};
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    if (i == lane % kItems) sample[0] = keys[i];
    if (i == (lane + kItems / 2) % kItems) sample[1] = keys[i];
  }
  const auto key_of_sample = [&](int i, uint32_t& value) {
    value = sample[i];
    return value != 0;
  };
  Cut cut{0, 0, sample_rank, 0, 0, false};
  SelectDigit<kSamples>(s, key_of_sample, cut, Values::kKeyBits);
  if (!cut.exact) SelectDigit<kSamples>(s, key_of_sample, cut, Values::kKeyBits - kDigitBits);
  const uint32_t cutoff = cut.prefix;  // 0 when the sample holds <= sample_rank keys: all pass
  if (kProbe && probe_stop == 2) return true;

  // The filter: candidates and kept ones counted in one scan (each total <= 16384 < 2^16).
  uint32_t kept_mask = 0, my_candidates = 0;
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    kept_mask |= static_cast<uint32_t>(keys[i] != 0 && keys[i] >= cutoff) << i;
    my_candidates += keys[i] != 0;
  }
  uint32_t totals;
  uint32_t at = Positions(s, my_candidates << 16 | __popc(kept_mask), totals) & 0xFFFFu;
  const int kept = static_cast<int>(totals & 0xFFFFu), candidates = static_cast<int>(totals >> 16);
  const int taken = min(candidates, static_cast<int>(k));
  if (kept < taken || kept > kListCapacity) return false;  // block-uniform
  ListMarked(s, keys, columns, kept_mask, at, s.kept);
  __syncthreads();
  if (kProbe && probe_stop == 3) return true;
  if (fine)
    return RankByFineBuckets<Values, kFlagWinners>(s, kept, taken, k, sorted, row_out_values,
                                                   row_out_indices, probe_stop);

  // The kept candidates' order code (key descending, column ascending) and its buckets.
  const OrderCode code = CodeOver(s.kept, true, kept > 0);
  const int code_bits = code.key_bits + code.column_bits;
  const int bucket_shift = code_bits > kDigitBits ? code_bits - kDigitBits : 0;
  const auto bucket_of = [&](int slot) {
    return static_cast<uint32_t>(code(s.list.keys[slot], s.list.columns[slot]) >> bucket_shift);
  };
#pragma unroll
  for (int i = 0; i < kListSlots; ++i) {
    const int slot = i * kThreads + static_cast<int>(threadIdx.x);
    if (slot < kept) atomicAdd(&s.hist[bucket_of(slot)], 1u);
  }
  __syncthreads();
  BucketStarts(s, taken, s.kept_bucket_max);
  if (s.kept_bucket_max > kMaxBucket) {  // block-uniform: the registers' steps instead
#pragma unroll
    for (int j = 0; j < kBinsPerThread; ++j) s.hist[threadIdx.x * kBinsPerThread + j] = 0;
    __syncthreads();
    return false;
  }

  // Slots by bucket; each kept candidate's rank: its bucket's start plus the smaller codes of
  // its bucket (an equal code, the same (key, column), ranks by slot). A bucket starting at or
  // past `taken` holds no winner: its entries are not ranked.
#pragma unroll
  for (int i = 0; i < kListSlots; ++i) {
    const int slot = i * kThreads + static_cast<int>(threadIdx.x);
    if (slot < kept) s.order[atomicAdd(&s.hist[bucket_of(slot)], 1u)] = slot;
  }
  __syncthreads();  // s.hist[b] now ends bucket b
  uint32_t ranks[kListSlots];
  uint32_t my_keys[kListSlots];
  int32_t my_columns[kListSlots];
#pragma unroll
  for (int i = 0; i < kListSlots; ++i) {
    const int slot = i * kThreads + static_cast<int>(threadIdx.x);
    ranks[i] = kListCapacity;  // no entry: never a winner
    if (slot >= kept) continue;
    my_keys[i] = s.list.keys[slot];
    my_columns[i] = s.list.columns[slot];
    const uint64_t my_code = code(my_keys[i], my_columns[i]);
    const uint32_t b = static_cast<uint32_t>(my_code >> bucket_shift);
    const uint32_t first = b > 0 ? s.hist[b - 1] : 0, end = s.hist[b];
    if (first >= static_cast<uint32_t>(taken)) continue;
    uint32_t rank = first;
    for (uint32_t j = first; j < end; ++j) {
      const int other = s.order[j];
      const uint64_t other_code = code(s.list.keys[other], s.list.columns[other]);
      rank += other_code < my_code || (other_code == my_code && other < slot);
    }
    ranks[i] = rank;
  }
  if (sorted) {  // the rank is the place
    for (int slot = taken + threadIdx.x; slot < k; slot += kThreads) {
      row_out_indices[slot] = kEmptySlot;
      row_out_values[slot] = Values::kEmpty;
    }
#pragma unroll
    for (int i = 0; i < kListSlots; ++i) {
      if (ranks[i] < static_cast<uint32_t>(taken)) {
        row_out_indices[ranks[i]] = my_columns[i];
        row_out_values[ranks[i]] = Values::FromKey(my_keys[i]);
      }
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kBinsPerThread; ++j) s.hist[threadIdx.x * kBinsPerThread + j] = 0;
    return true;
  }
  //  Unsorted: the winners to s.list in rank order, then step 2's order by column.
  __syncthreads();  // every rank read the list and s.hist
#pragma unroll
  for (int j = 0; j < kBinsPerThread; ++j) s.hist[threadIdx.x * kBinsPerThread + j] = 0;
  uint32_t key_min = 0xFFFFFFFFu, key_max = 0, column_min = 0xFFFFFFFFu, column_max = 0;
#pragma unroll
  for (int i = 0; i < kListSlots; ++i) {
    if (ranks[i] < static_cast<uint32_t>(taken)) {
      s.list.keys[ranks[i]] = my_keys[i];
      s.list.columns[ranks[i]] = my_columns[i];
      const uint32_t column = static_cast<uint32_t>(my_columns[i]);
      key_min = min(key_min, my_keys[i]), key_max = max(key_max, my_keys[i]);
      column_min = min(column_min, column), column_max = max(column_max, column);
    }
  }
  s.winners.Add(key_min, key_max, column_min, column_max);
  __syncthreads();
  WriteInOrder<Values>(s, taken, k, false, row_out_values, row_out_indices);
  return true;
}

// Four candidates by 16-byte loads (8-byte ones of 16-bit values): from global memory
// streaming (kGlobal), else from the staged row in shared memory.
template <bool kGlobal, typename Bits>
__device__ __forceinline__ void LoadChunk(const Bits* values, const int32_t* columns,
                                          Bits (&bits)[kChunk], int32_t (&cols)[kChunk]) {
  const auto load = [](const auto* p) {
    if constexpr (kGlobal)
      return __ldcs(p);
    else
      return *p;
  };
  const int4 col4 = load(reinterpret_cast<const int4*>(columns));
  cols[0] = col4.x, cols[1] = col4.y, cols[2] = col4.z, cols[3] = col4.w;
  if constexpr (sizeof(Bits) == 4) {
    const uint4 v = load(reinterpret_cast<const uint4*>(values));
    bits[0] = v.x, bits[1] = v.y, bits[2] = v.z, bits[3] = v.w;
  } else {
    const uint2 v = load(reinterpret_cast<const uint2*>(values));
    bits[0] = static_cast<Bits>(v.x), bits[1] = static_cast<Bits>(v.x >> 16);
    bits[2] = static_cast<Bits>(v.y), bits[3] = static_cast<Bits>(v.y >> 16);
  }
}

// How the kernel runs (block-uniform; merge_topk.cu fills it in).
struct Options {
  bool vector_loads;   // the row's parts allow 16-byte loads from global memory
  bool sampled, fine;  // step 0, ranked by fine buckets (else by 11-bit ones)
  bool staged;         // the next row brought into shared memory by bulk copies
  int lookahead;       // rows pulled into L2 ahead of the one staged (or, unstaged, loaded)
  int probe_stop;      // the probe build: end the sampled path after phase N (0: never)
  bool probe_no_copy;  // the probe build: stage the block's first row only, work on it each row
                       // (unstaged instances: no L2 lookahead; each row still loaded)
};

// kFlagWinners: unsorted output only, its fine rank flagging the winners (RankByFineBuckets):
// an instance of its own, so that the other's registers are allotted as without it.
template <typename Values, bool kFlagWinners, int kChunks>
__global__ void __launch_bounds__(kThreads, kBlocksPerSmOf<kChunks>)
    MergeInRegistersKernel(const typename Values::Bits* values, const int32_t* indices,
                           int64_t rows, int64_t width, int32_t k, bool sorted_output,
                           Options options, typename Values::Bits* out_values,
                           int32_t* out_indices) {
  using Bits = typename Values::Bits;
  constexpr int kItems = kItemsOf<kChunks>;
  constexpr int kRotation = kRotationOf<kChunks>;
  const bool sorted = !kFlagWinners && sorted_output;
  const bool vector_loads = options.vector_loads, sampled = options.sampled, fine = options.fine;
  const bool staged = kHasBulkCopies && options.staged;
  const int probe_stop = kProbe ? options.probe_stop : 0;
  // Each row the block takes is copied in, unless the probe times the work alone.
  const bool restage = !(kProbe && options.probe_no_copy);
  const int lookahead = restage ? options.lookahead : 0;
  const int64_t staged_ahead = staged ? 1 : 0;  // rows ahead already asked for by StageRow
  extern __shared__ __align__(16) unsigned char shared_bytes[];  // sizeof(Shared)
  Shared& s = *reinterpret_cast<Shared*>(shared_bytes);
  // The staged row (when `staged`): its values, then its columns, after s.
  Bits* staged_values = reinterpret_cast<Bits*>(shared_bytes + StagedOffset());
  const int32_t* staged_indices = reinterpret_cast<const int32_t*>(staged_values + width);
  const uint32_t sample_rank = SampleRank<kItems>(k);
  s.fine.Zero();  // s.hist with it
  const int64_t grid = gridDim.x;
  const auto prefetch_row = [&](int64_t row) {
    if (row >= rows) return;
    PrefetchRangeToL2(values + row * width, width * sizeof(Bits));
    PrefetchRangeToL2(indices + row * width, width * sizeof(int32_t));
  };
  if (threadIdx.x == 0) {
    if (staged) {
      // The staged row's landing: armed with the bytes to come, counted down by the copies.
      MbarrierInit(&s.row_landed, 1);
      FenceMbarrierInit();
      StageRow(s.row_landed, staged_values, values, indices, blockIdx.x, width);
    }
    // The rows that the loop's first iterations would otherwise leave out of the lookahead.
    for (int ahead = 1; ahead < lookahead; ++ahead)
      prefetch_row(blockIdx.x + (staged_ahead + ahead) * grid);
  }
  __syncthreads();
  // Block-uniform row loop: each block takes rows blockIdx.x, + grid, ...
  int64_t visit = 0;  // rows this block has taken: the landing barrier's phase
  for (int64_t row = blockIdx.x; row < rows; row += grid, ++visit) {
    if (threadIdx.x == 0) {
      s.equal_taken = 0;
      s.winners.Reset(), s.kept.Reset();
      s.bucket_max = s.kept_bucket_max = 0;
      s.straddler_count = 0;
      if (lookahead > 0) prefetch_row(row + (staged_ahead + lookahead) * grid);
    }
    if (staged && (restage || visit == 0))
      MbarrierWait</*kCluster=*/false>(&s.row_landed, static_cast<uint32_t>(visit & 1));
    // 1. The row: key 0 marks no candidate (column < 0, NaN, past the row); every other
    //    ordered key is > 0.
    const Bits* row_values = values + row * width;
    const int32_t* row_indices = indices + row * width;
    uint32_t keys[kItems];
    int32_t columns[kItems];
    const auto load_row = [&](bool from_staged) {
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const int64_t piece = (threadIdx.x + c * kRotation) % kThreads;  // see kRotation
        const int64_t first = (int64_t{c} * kThreads + piece) * kChunk;
        Bits bits[kChunk];
        int32_t cols[kChunk];
        if (from_staged && first < width) {  // the row in shared memory, landed by the copy engine
          LoadChunk<false>(staged_values + first, staged_indices + first, bits, cols);
        } else if (vector_loads && first < width) {
          LoadChunk<true>(row_values + first, row_indices + first, bits, cols);
        } else {
#pragma unroll
          for (int q = 0; q < kChunk; ++q) {
            const bool inside = first + q < width;
            cols[q] = inside ? row_indices[first + q] : -1;
            bits[q] = inside ? row_values[first + q] : Bits{0};
          }
        }
#pragma unroll
        for (int q = 0; q < kChunk; ++q) {
          const bool candidate = first + q < width && cols[q] >= 0 && !Values::IsNan(bits[q]);
          keys[c * kChunk + q] = candidate ? Values::Key(bits[q]) : 0u;
          columns[c * kChunk + q] = cols[q];
        }
      }
    };
    load_row(staged);
    if (staged && restage) {
      __syncthreads();  // every thread holds its items: the buffer takes the next row
      if (threadIdx.x == 0 && row + grid < rows)
        StageRow(s.row_landed, staged_values, values, indices, row + grid, width);
    }
    if (kProbe && probe_stop == 1) continue;

    if (sampled && MergeBySample<Values, kFlagWinners>(s, keys, columns, sample_rank, k, sorted,
                                                       fine, out_values + row * k,
                                                       out_indices + row * k, probe_stop)) {
      __syncthreads();  // the list's storage is the next row's
      continue;
    }
    // 2. The k-th key: its first digit over the registers, the rest over a shared list of the
    //    boundary bin's entries when they fit (else over the registers again).
    const auto key_of_register = [&](int i, uint32_t& value) {
      value = keys[i];
      return keys[i] != 0;
    };
    const auto key_of_list = [&](int i, uint32_t& value) {
      value = s.list.keys[i * kThreads + threadIdx.x];
      return value != 0;
    };
    Cut key_cut{0, 0, static_cast<uint32_t>(k), 0, 0, false};
    SelectDigit<kItems>(s, key_of_register, key_cut, Values::kKeyBits);
    const bool listed = !key_cut.exact && key_cut.matching <= kMaxK;
    if (listed) {
      uint32_t in_bin = 0;
      const auto in_boundary_bin = [&](int i) {  // key 0 may share bin 0 (-inf is there)
        return keys[i] != 0 && (keys[i] & key_cut.mask) == key_cut.prefix;
      };
#pragma unroll
      for (int i = 0; i < kItems; ++i) in_bin += in_boundary_bin(i);
      uint32_t total;
      uint32_t at = Positions(s, in_bin, total);
#pragma unroll
      for (int i = 0; i < kItems; ++i) {
        if (in_boundary_bin(i)) {
          s.list.keys[at] = keys[i];
          s.list.columns[at] = columns[i];
          ++at;
        }
      }
      for (int slot = total + threadIdx.x; slot < kMaxK; slot += kThreads) s.list.keys[slot] = 0;
      __syncthreads();
      SelectRest<kListItems>(s, key_of_list, key_cut, Values::kKeyBits - kDigitBits);
    } else {
      SelectRest<kItems>(s, key_of_register, key_cut, Values::kKeyBits - kDigitBits);
    }
    //    Then, for a tied k-th key, the k-th smallest column among its entries.
    Cut column_cut{0, 0, key_cut.needed, 0, 0, true};
    if (!key_cut.exact) {
      column_cut.exact = false;
      if (listed) {
        SelectRest<kListItems>(
            s,
            [&](int i, uint32_t& value) {
              const int slot = i * kThreads + threadIdx.x;
              value = 0x7FFFFFFFu - static_cast<uint32_t>(s.list.columns[slot]);
              return s.list.keys[slot] == key_cut.prefix;
            },
            column_cut, 31);
      } else {
        SelectRest<kItems>(
            s,
            [&](int i, uint32_t& value) {
              value = 0x7FFFFFFFu - static_cast<uint32_t>(columns[i]);
              return keys[i] == key_cut.prefix;
            },
            column_cut, 31);
      }
    }
    const int taken =
        static_cast<int>(key_cut.total < static_cast<uint32_t>(k) ? key_cut.total : k);

    // 3. The winners to shared memory (positions by a block scan), and their spans.
    uint32_t wins = 0;  // bit i: item i wins
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const uint32_t key = keys[i];
      const uint32_t decided = key & key_cut.mask;
      bool win = key != 0 && decided > key_cut.prefix;
      if (key != 0 && decided == key_cut.prefix) {
        if (key_cut.exact) {
          win = true;
        } else {
          const uint32_t column_value =
              (0x7FFFFFFFu - static_cast<uint32_t>(columns[i])) & column_cut.mask;
          win = column_value > column_cut.prefix ||
                (column_value == column_cut.prefix &&
                 (column_cut.exact ||
                  atomicAdd(&s.equal_taken, 1) < static_cast<int>(column_cut.needed)));
        }
      }
      wins |= static_cast<uint32_t>(win) << i;
    }
    uint32_t winner_total;
    uint32_t at = Positions(s, __popc(wins), winner_total);
    ListMarked(s, keys, columns, wins, at, s.winners);
    __syncthreads();

    // 4. Each winner's rank in the output order, and the writes.
    WriteInOrder<Values>(s, taken, k, sorted, out_values + row * k, out_indices + row * k);
    __syncthreads();  // the list's storage is the next row's
  }
}

}  // namespace merge_registers
}  // namespace jax_topk
