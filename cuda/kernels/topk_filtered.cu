// topk_filtered: exact top-k of long float32 rows (SPEC section 2). Per row, a regular 1/s sample
// (row-dependent phase) proposes a cutoff keeping ~k candidates (+ slack) and a deeper secondary.
// One pass over the row (float4 loads, bulk L2 prefetch ahead; a hit mask per 16 values a thread, then
// only the hits) appends the values >= cutoff, unordered, to shared memory then a per-worker
// workspace slice. A histogram of the candidates in bins relative to the cutoff finds the k-th
// key's bin, one warp ranks its few members (else 11+11+10-bit radix digits); one more selection
// over the tied columns gives the tie quota. Winners mark a bitmap of the row's columns, read in
// order (a block radix sort for sorted=true or rows over kBitmapColumns).
// Traffic: the sample (<= 1/8 of the row) + one read. Underfill retries the secondary cutoff; still
// short, or more kept than fits, takes the exact route (radix passes over the row). Limits: width <
// 2^31, k <= kMaxK. Few rows: a thread block cluster a row (KV-split); its blocks add up their
// candidates' histograms through distributed shared memory and each writes its own winners
// (one block an SM when the launch's scores are small next to the device, else two).
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <type_traits>
#include <cub/block/block_radix_sort.cuh>

#include "common/topk_common.h"
#include "kernels/topk_cuda.h"
#include "common/topk_filtered_workspace.h"
#include "common/topk_problem.h"
#include "kernels/topk_scan.cuh"

namespace jax_topk {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreadsPerBlock = 512;
constexpr int kWarpSize = 32;
constexpr int kWarpsPerBlock = kThreadsPerBlock / kWarpSize;
constexpr unsigned kFullMask = 0xFFFFFFFFu;
constexpr int kBlocksPerSm = 2;
constexpr int kMaxPoolBlocks = 480;  // a bound on the queue's pool (its slices shrink past kFilteredWorkerSlots)

// Rows are read in 16-byte chunks; chunk c of thread t in a tile starts at column
// 4 * (t + kThreadsPerBlock * c), so each warp load covers 512 contiguous bytes. A thread keeps
// kFilterChunks (filtering pass) or kScanChunks (exact route) chunks in flight: more would spill
// at 64 registers; the filtering pass adds L2 prefetches (kPrefetchAhead) for memory parallelism.
constexpr int kChunkElems = 4;
constexpr int kChunkStride = kChunkElems * kThreadsPerBlock;
constexpr int kFilterChunks = 4;
constexpr int kFilterTile = kFilterChunks * kChunkStride;
constexpr int kScanChunks = 4;
constexpr int kScanTile = kScanChunks * kChunkStride;

// Kept candidates in shared memory (then the workspace slice), and the radix-select survivors.
constexpr int kSharedCandidates = 8192;
constexpr int kFrontierCapacity = 8192;

// Radix digits of a 32-bit ordered value, most significant first: 11 + 11 + 10 bits.
constexpr int kDigitBins = 2048;
constexpr int kBinsPerThread = kDigitBins / kThreadsPerBlock;
constexpr int kNumDigits = 3;
__host__ __device__ constexpr int DigitShift(int digit) { return digit == 0 ? 21 : (digit == 1 ? 10 : 0); }
__host__ __device__ constexpr uint32_t DigitMask(int digit) { return digit == 2 ? 0x3FFu : 0x7FFu; }

// The sample: whole 128-byte lines (one per warp load), at most kSampleLines of them, taken every
// `stride` lines with stride >= kMinSampleStride. The primary cutoff keeps ~kRetention * k expected
// candidates plus kRankSlack sampled ranks; the secondary keeps kSecondaryFactor times more ranks.
constexpr int kSampleLineElems = kWarpSize;
constexpr int kSampleLines = 128;
constexpr int kSampleLinesPerWarp = kSampleLines / kWarpsPerBlock;
constexpr int kMinSampleStride = 8;
// Measured (benches/NOTES.md): 1 x k plus 32 ranks beats 2 x k plus 8 by 4-12 %; the slack
// keeps the primary's under-fill (and its secondary re-read) rare. A whole row by one block
// takes less slack (filtered step 6: 24 ranks, ~1 % faster); a split row keeps 32 (24 made
// 32 x 32768 10 % slower: one under-filled row makes every part of its cluster re-read).
constexpr int kRetention = 1;
constexpr int kRankSlack = 32;
constexpr int kWholeRowRankSlack = 24;
constexpr int kSecondaryFactor = 2;

// The filtering pass pulls the row into L2 kPrefetchAhead columns ahead of its loads: memory
// parallelism that costs no registers. The first of them are pulled while the sample is taken.
constexpr int kPrefetchLineElems = 32;  // 128-byte lines
constexpr int kPrefetchAhead = 2 * kFilterTile;
static_assert(kPrefetchAhead <= kPrefetchLineElems * kThreadsPerBlock, "one line per thread");

// Unsorted results of rows up to kBitmapColumns are put in column order through a bitmap of the
// row (one bit a column, up to kBitmapWordsPerThread words a thread). Measured (benches/NOTES.md,
// filtered step 6): faster than the block radix sort up to 262144 columns.
constexpr int kBitmapWordsPerThread = 16;
constexpr int kBitmapColumns = kBitmapWordsPerThread * 32 * kThreadsPerBlock;

// The k results are sorted over the block, kSortItemsPerThread each.
constexpr int kSortItemsPerThread = kMaxK / kThreadsPerBlock;
static_assert(kSortItemsPerThread * kThreadsPerBlock == kMaxK, "sort covers kMaxK");

// Split mode: a row per thread block cluster of up to kMaxClusterParts blocks (16 needs the
// non-portable cluster size; the launch takes the largest whose clusters are all resident at once).
// The parts' histograms are added up in two steps: super-bins of a warp's worth of adjacent bins,
// then the bins of the one super-bin that holds the rank.
constexpr int kMaxClusterParts = static_cast<int>(kFilteredMaxSplitParts);
constexpr int kPortableClusterParts = 8;
constexpr int kSuperBins = kDigitBins / kWarpSize;
constexpr int kMinSplitSliceEntries = 1024;  // below this a split part would overflow too often
// A split launch of at most kSpreadBytesPerSm of scores an SM runs one block an SM (its shared
// memory padded past half an SM's): a block alone on its SM takes its sample and its cluster's
// steps at twice the issue rate. Longer rows keep two blocks an SM, which their pass needs to
// stream (measured, benches/NOTES.md filtered step 8).
constexpr int64_t kSpreadBytesPerSm = int64_t{192} << 10;

using ColumnSort = cub::BlockRadixSort<uint32_t, kThreadsPerBlock, kSortItemsPerThread>;
using RankSort = cub::BlockRadixSort<uint32_t, kThreadsPerBlock, kSortItemsPerThread, uint32_t>;

// Cutoffs are ordered keys; a row keeps the non-NaN values whose key is >= the cutoff.
struct Cutoffs {
  uint32_t primary;    // 22-bit: keeps ~kRetention * k expected candidates
  uint32_t secondary;  // 11-bit, <= primary: a deeper band for an underfilled primary
};
// The row a block works on. Kept in shared memory so that the passes do not carry it.
struct RowJob {
  int64_t row;
  int length;  // -1: a masked row
  Cutoffs cutoffs;
};

struct BinFound {
  uint32_t bin;
  uint32_t above;  // items in the bins above
  uint32_t count;  // items in the bin
};

struct SharedStorage {
  uint2 candidates[kSharedCandidates];  // (value bits, column), in no particular order
  union {
    uint32_t frontier[kFrontierCapacity];  // the boundary group of a radix selection
    struct {
      uint32_t bits[kMaxK];
      uint32_t col[kMaxK];
    } selected;  // the winners, in no particular order
    ColumnSort::TempStorage column_sort;
    RankSort::TempStorage rank_sort;
    uint32_t bitmap[kBitmapColumns / 32];  // the winners' columns (unsorted rows or split parts)
  } work;
  uint32_t hist[kDigitBins];  // all zero between uses
  uint32_t warp_sums[kWarpsPerBlock];  // BlockExclusiveSum's per-warp totals
  BinFound found[2];
  int kept;  // append counters; kept is read by the other blocks of a split row's cluster
  int frontier_count;
  int selected_count;
  RowJob job;
  unsigned long long next_row;
  uint32_t sample_largest;  // the largest sampled key of the job's row (0: none)
  struct {                  // split mode: what the blocks of a row's cluster share
    uint32_t super[kSuperBins];  // this part's candidates per super-bin (read by the others)
    uint2 boundary[kWarpSize];   // this part's candidates in the k-th key's bin (read by the others)
    int boundary_count;
    uint32_t super_sum[kSuperBins];     // the cluster's super-bins (all parts, and earlier parts)
    uint32_t super_before[kSuperBins];
    uint32_t bins_of_part[kMaxClusterParts][kWarpSize];  // every part's bins of the rank's super-bin
    uint32_t part_offset[kMaxClusterParts];  // where each part's candidates go when merged
    uint32_t total;                          // candidates kept over the cluster
    bool overflow;                           // a part kept more than its sink holds
    BinFound kth_bin;                        // the rank's bin over the cluster
    uint32_t own_above;                      // this part's candidates in the bins above it
    uint32_t above_before;                   // the earlier parts' candidates there
    uint32_t kth_key;                        // the settled row's k-th key ...
    uint32_t column_limit;                   // ... and the last column of it that wins
    uint32_t members_before;                 // winning boundary members in earlier parts
    uint32_t members_mine;                   // ... and in this part
  } cluster;
};
static_assert(sizeof(uint32_t) * kBitmapColumns / 32 <= sizeof(uint32_t) * kFrontierCapacity,
              "the bitmap shares the frontier's space");

// ---------------------------------------------------------------------------------------------
// Warp-level helpers. All lanes of the warp call them.

// Adds `counted` lanes to hist[digit]; a warp whose lanes share one digit adds once (rows of
// equal values would otherwise serialise on one shared-memory address).
__device__ __forceinline__ void AddToHistogram(uint32_t* hist, uint32_t digit, bool counted) {
  const uint32_t voters = __ballot_sync(kFullMask, counted);
  if (voters == 0) return;
  const int leader = __ffs(voters) - 1;
  const uint32_t leader_digit = __shfl_sync(kFullMask, digit, leader);
  if (__all_sync(kFullMask, !counted || digit == leader_digit)) {
    if (static_cast<int>(threadIdx.x % kWarpSize) == leader) atomicAdd(&hist[leader_digit], __popc(voters));
  } else if (counted) {
    atomicAdd(&hist[digit], 1u);
  }
}

// A slot of a shared append counter for each lane that wants one: one atomic per warp.
__device__ __forceinline__ int WarpReserve(int* counter, bool want) {
  const uint32_t wanting = __ballot_sync(kFullMask, want);
  if (wanting == 0) return 0;
  const int lane = threadIdx.x % kWarpSize;
  const int leader = __ffs(wanting) - 1;
  int base = 0;
  if (lane == leader) base = atomicAdd(counter, __popc(wanting));
  base = __shfl_sync(kFullMask, base, leader);
  return base + __popc(wanting & ((1u << lane) - 1u));
}

// ---------------------------------------------------------------------------------------------
// Reading rows.

constexpr uint32_t kNanBits = 0x7FFFFFFFu;  // stands for a missing value: never selected

// The first column of [begin, end) at a 16-byte boundary (or end): the scalar head ends there.
__device__ __forceinline__ int AlignedColumn(const float* row, int begin, int end) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(row + begin);
  const int head = static_cast<int>(((16 - (address & 15)) & 15) / sizeof(float));
  return end - begin > head ? begin + head : end;
}

// The 4 floats at a 16-byte aligned address; with kBounded, those past the `available` ones
// read as NaN.
template <bool kBounded>
__device__ __forceinline__ float4 LoadChunk(const float* at, int64_t available) {
  if (!kBounded || available >= kChunkElems) return __ldcs(reinterpret_cast<const float4*>(at));
  const float missing = __uint_as_float(kNanBits);
  float4 v = make_float4(missing, missing, missing, missing);
  if (available > 0) v.x = __ldcs(at + 0);
  if (available > 1) v.y = __ldcs(at + 1);
  if (available > 2) v.z = __ldcs(at + 2);
  return v;
}

// Pulls `columns` columns of the row from `from` on (none past `end`) into L2. On sm_90 one
// thread asks the copy engine for the whole range (the 16-byte-aligned inside of it: the load
// units then see no prefetch traffic); before that, a line a thread.
__device__ __forceinline__ void PrefetchToL2(const float* row, int64_t from, int end, int columns) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (threadIdx.x != 0 || from >= end) return;
  const int64_t to = from + columns < end ? from + columns : end;
  const uintptr_t first = (reinterpret_cast<uintptr_t>(row + from) + 15) & ~uintptr_t{15};
  const uintptr_t last = reinterpret_cast<uintptr_t>(row + to) & ~uintptr_t{15};
  if (first < last) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(first), "r"(static_cast<uint32_t>(last - first))
                 : "memory");
  }
#else
  const int offset = kPrefetchLineElems * static_cast<int>(threadIdx.x);
  if (offset < columns && from + offset < end) asm volatile("prefetch.global.L2 [%0];" ::"l"(row + from + offset));
#endif
}

// Sources hand items (value bits, column, valid) to a visitor; every thread of the block
// visits the same number of items, so visitors may use warp collectives.

// kRepeats: whether a source may hold long runs of one value (histograms then add a warp's
// equal digits once, instead of serialising on one shared-memory address).

// Columns [begin, end) of a row in global memory: a scalar head up to a 16-byte boundary, then
// tiles of float4 loads. NaN items are invalid.
struct RowSource {
  static constexpr bool kRepeats = true;
  const float* row;
  int begin;
  int end;

  template <class Visit>
  __device__ __forceinline__ void ForEach(Visit&& visit) const {
    const int aligned = AlignedColumn(row, begin, end);
    if (aligned > begin) {
      const bool inside = static_cast<int>(threadIdx.x) < aligned - begin;
      const int col = begin + (inside ? static_cast<int>(threadIdx.x) : 0);
      const uint32_t bits = inside ? __float_as_uint(__ldcs(row + col)) : kNanBits;
      visit(bits, col, !IsNanF32(bits));
    }
    for (int base = aligned; base < end; base += end - base > kScanTile ? kScanTile : end - base) {
      const uint32_t first = base + kChunkElems * threadIdx.x;  // no wrap: base < 2^31
      float4 chunks[kScanChunks];
#pragma unroll
      for (int c = 0; c < kScanChunks; ++c) {  // all loads first, for memory-level parallelism
        chunks[c] = LoadChunk<true>(row + first + kChunkStride * c, int64_t{end} - first - kChunkStride * c);
      }
#pragma unroll
      for (int c = 0; c < kScanChunks; ++c) {
        const float values[kChunkElems] = {chunks[c].x, chunks[c].y, chunks[c].z, chunks[c].w};
#pragma unroll
        for (int e = 0; e < kChunkElems; ++e) {
          const uint32_t bits = __float_as_uint(values[e]);
          visit(bits, static_cast<int32_t>(first + kChunkStride * c + e), !IsNanF32(bits));
        }
      }
    }
  }
};

// `count` kept candidates: the first `shared_capacity` in shared memory, the rest in a global
// slice (written by this block).
struct CandidateSource {
  static constexpr bool kRepeats = false;  // at most Capacity() of them
  const uint2* shared;
  int shared_capacity;
  const uint2* global;
  int count;

  __device__ __forceinline__ uint2 Get(int entry) const {
    return entry < shared_capacity ? shared[entry] : __ldcg(global + (entry - shared_capacity));
  }

  template <class Visit>
  __device__ __forceinline__ void ForEach(Visit&& visit) const {
    // The shared entries first, in a loop free of the global branch, then the slice's.
    const int in_shared = count < shared_capacity ? count : shared_capacity;
    for (int base = 0; base < in_shared; base += kThreadsPerBlock) {
      const int entry = base + static_cast<int>(threadIdx.x);
      const uint2 c = entry < in_shared ? shared[entry] : make_uint2(kNanBits, 0);
      visit(c.x, static_cast<int32_t>(c.y), entry < in_shared);
    }
    for (int base = in_shared; base < count; base += kThreadsPerBlock) {
      const int entry = base + static_cast<int>(threadIdx.x);
      const uint2 c = entry < count ? __ldcg(global + (entry - shared_capacity)) : make_uint2(kNanBits, 0);
      visit(c.x, static_cast<int32_t>(c.y), entry < count);
    }
  }
};

// Projected values already in shared memory (the frontier of a radix selection).
struct FrontierSource {
  static constexpr bool kRepeats = false;  // at most kFrontierCapacity of them
  const uint32_t* values;
  int count;

  template <class Visit>
  __device__ __forceinline__ void ForEach(Visit&& visit) const {
    for (int base = 0; base < count; base += kThreadsPerBlock) {
      const int entry = base + static_cast<int>(threadIdx.x);
      visit(entry < count ? values[entry] : 0u, 0, entry < count);
    }
  }
};

// This thread's sampled values, in registers.
struct SampleSource {
  static constexpr bool kRepeats = false;  // kSampleLines lines
  float values[kSampleLinesPerWarp];

  template <class Visit>
  __device__ __forceinline__ void ForEach(Visit&& visit) const {
#pragma unroll
    for (int j = 0; j < kSampleLinesPerWarp; ++j) {
      const uint32_t bits = __float_as_uint(values[j]);
      visit(bits, 0, !IsNanF32(bits));
    }
  }
};

// Projections: the 32-bit value a radix selection ranks (largest first), and whether an item
// takes part.
struct KeyOfValue {  // the value itself, by its ordered key
  __device__ __forceinline__ bool operator()(uint32_t bits, int32_t, uint32_t& value) const {
    value = OrderedKeyF32(bits);
    return true;
  }
};
struct LowColumnOfTie {  // among the items of one key, the lowest column first
  uint32_t key;
  __device__ __forceinline__ bool operator()(uint32_t bits, int32_t col, uint32_t& value) const {
    value = ~static_cast<uint32_t>(col);
    return OrderedKeyF32(bits) == key;
  }
};
struct AsProjected {  // frontier entries are projected already
  __device__ __forceinline__ bool operator()(uint32_t projected, int32_t, uint32_t& value) const {
    value = projected;
    return true;
  }
};

// ---------------------------------------------------------------------------------------------
// The filtering pass: the hot loop. Every thread tests its 16 values against a float threshold
// into a bit mask; only a warp with a hit counts and appends, and only a thread's hits cost more.

// Where kept values go: position p < shared_capacity in s.candidates, the next global_capacity
// positions in a global slice; further positions are counted but dropped.
struct CandidateSink {
  int shared_capacity;
  uint2* global;
  int global_capacity;

  __device__ __forceinline__ int Capacity() const { return shared_capacity + global_capacity; }
  __device__ __forceinline__ void Put(SharedStorage& s, int position, uint2 candidate) const {
    if (position < shared_capacity) {
      s.candidates[position] = candidate;
    } else if (position - shared_capacity < global_capacity) {
      global[position - shared_capacity] = candidate;
    }
  }
};

// The float threshold whose `value >= threshold` keeps every non-NaN value with key >= cutoff
// (and, for a cutoff in the NaN range or at +0, a few more below it): always an upper set of the
// total order, which is all that certifying a kept count needs.
__device__ __forceinline__ float KeepThreshold(uint32_t cutoff) {
  constexpr uint32_t kMinusInfKey = OrderedKeyF32(0xFF800000u);
  constexpr uint32_t kPlusInfKey = OrderedKeyF32(0x7F800000u);
  if (cutoff <= kMinusInfKey) return __uint_as_float(0xFF800000u);
  if (cutoff >= kPlusInfKey) return __uint_as_float(0x7F800000u);
  return __uint_as_float(BitsFromOrderedKeyF32(cutoff));
}
__device__ __forceinline__ bool KeepsAll(uint32_t cutoff) { return cutoff <= OrderedKeyF32(0xFF800000u); }

// values[i] for a runtime i, by a tree of selects over the bits of i (halving the candidates per
// bit): a dynamic index into a register array would put the array in local memory.
template <int kItems>
__device__ __forceinline__ float SelectItem(const float (&values)[kItems], int i) {
  if constexpr (kItems == 1) {
    return values[0];
  } else {
    static_assert(kItems % 2 == 0, "a power of two");
    float halved[kItems / 2];
    const bool odd = i & 1;
#pragma unroll
    for (int j = 0; j < kItems / 2; ++j) halved[j] = odd ? values[2 * j + 1] : values[2 * j];
    return SelectItem(halved, i >> 1);
  }
}

// Appends this warp's values >= threshold; item i of a thread is column
// first_col + (i / 4) * kChunkStride + i % 4. One shared atomic per warp; then each thread
// walks only its own hits (a bit mask), so a tile costs a compare per value plus a few
// instructions per hit, and nothing past the vote when the warp has none.
template <int kItems>
__device__ __forceinline__ void AppendHits(SharedStorage& s, const CandidateSink& sink,
                                           const float (&values)[kItems], uint32_t first_col, float threshold) {
  static_assert(kItems <= 32, "one bit per item");
  uint32_t hits = 0;
#pragma unroll
  for (int i = 0; i < kItems; ++i) hits |= static_cast<uint32_t>(values[i] >= threshold) << i;
  if (!__any_sync(kFullMask, hits != 0)) return;
  const int mine = __popc(hits);
  const int inclusive = WarpInclusiveSum(mine);
  const int warp_total = __shfl_sync(kFullMask, inclusive, kWarpSize - 1);
  int warp_base = 0;
  if (threadIdx.x % kWarpSize == 0) warp_base = atomicAdd(&s.kept, warp_total);
  warp_base = __shfl_sync(kFullMask, warp_base, 0);
  int position = warp_base + inclusive - mine;
  const bool in_shared = warp_base + warp_total <= sink.shared_capacity;
  for (; hits != 0; hits &= hits - 1) {
    const int i = __ffs(hits) - 1;
    const uint32_t col = first_col + (i / kChunkElems) * kChunkStride + i % kChunkElems;
    const uint2 candidate = make_uint2(__float_as_uint(SelectItem(values, i)), col);
    if (in_shared) {
      s.candidates[position++] = candidate;
    } else {
      sink.Put(s, position++, candidate);
    }
  }
}

// One tile of kFilterTile columns from `tile` (16-byte aligned), bounded by `end` if kBounded.
template <bool kBounded>
__device__ __forceinline__ void FilterTile(SharedStorage& s, const float* row, int tile, int end,
                                           float threshold, const CandidateSink& sink) {
  const uint32_t first = tile + kChunkElems * threadIdx.x;  // no wrap: tile < 2^31
  const float* at = row + first;
  float values[kFilterChunks * kChunkElems];
#pragma unroll
  for (int c = 0; c < kFilterChunks; ++c) {
    const float4 chunk = LoadChunk<kBounded>(at + kChunkStride * c, int64_t{end} - first - kChunkStride * c);
    values[kChunkElems * c + 0] = chunk.x;
    values[kChunkElems * c + 1] = chunk.y;
    values[kChunkElems * c + 2] = chunk.z;
    values[kChunkElems * c + 3] = chunk.w;
  }
  AppendHits(s, sink, values, first, threshold);
}

// Appends every non-NaN value >= threshold of columns [begin, end) to the sink, in no particular
// order; returns how many (also past the sink's capacity: the caller detects overflow from it).
__device__ __forceinline__ int FilterColumns(SharedStorage& s, const float* row, int begin, int end,
                                             float threshold, const CandidateSink& sink) {
  if (threadIdx.x == 0) s.kept = 0;
  __syncthreads();
  const int aligned = AlignedColumn(row, begin, end);
  if (aligned > begin && threadIdx.x < kWarpSize) {  // the scalar head, one column per lane
    const int offset = static_cast<int>(threadIdx.x);
    const float head[1] = {offset < aligned - begin ? __ldcs(row + begin + offset) : __uint_as_float(kNanBits)};
    AppendHits(s, sink, head, static_cast<uint32_t>(begin) + offset, threshold);
  }
  int tile = aligned;
  for (; end - tile >= kFilterTile; tile += kFilterTile) {
    PrefetchToL2(row, int64_t{tile} + kPrefetchAhead, end, kFilterTile);
    FilterTile<false>(s, row, tile, end, threshold, sink);
  }
  if (tile < end) FilterTile<true>(s, row, tile, end, threshold, sink);
  __syncthreads();
  const int kept = s.kept;
  __syncthreads();  // a retry resets s.kept
  return kept;
}

// ---------------------------------------------------------------------------------------------
// Radix selection. Every function is called by all threads with block-uniform arguments.

// Histogram of digit `digit` of the projected values whose higher digits equal `prefix`.
template <class Source, class Project>
__device__ __forceinline__ void DigitHistogram(SharedStorage& s, const Source& source, const Project& project,
                                               uint32_t prefix, uint32_t prefix_mask, int digit) {
  const int shift = DigitShift(digit);
  const uint32_t digit_mask = DigitMask(digit);
  source.ForEach([&](uint32_t bits, int32_t col, bool valid) {
    uint32_t value = 0;
    const bool counted = valid && project(bits, col, value) && (value & prefix_mask) == prefix;
    if constexpr (Source::kRepeats) {
      AddToHistogram(s.hist, (value >> shift) & digit_mask, counted);
    } else if (counted) {  // a bounded number of items: conflicts cost less than aggregating
      atomicAdd(&s.hist[(value >> shift) & digit_mask], 1u);
    }
  });
  __syncthreads();
}

// The bins holding the rank_a-th and rank_b-th largest histogram items (a rank of 0 or past the
// total finds nothing), and the total.
struct BinSearch {
  BinFound a;
  BinFound b;
  uint32_t total;
};
// The bin a thread's j-th count stands for: thread 0 owns the top bins.
__device__ __forceinline__ int BinOf(int j) {
  return kDigitBins - 1 - (static_cast<int>(threadIdx.x) * kBinsPerThread + j);
}
// The search over a histogram held as each thread's counts of its bins (BinOf).
__device__ __forceinline__ BinSearch SearchBins(SharedStorage& s, const uint32_t (&counts)[kBinsPerThread],
                                                uint32_t rank_a, uint32_t rank_b) {
  uint32_t mine = 0;
#pragma unroll
  for (int j = 0; j < kBinsPerThread; ++j) mine += counts[j];
  uint32_t total;
  uint32_t above = BlockExclusiveSum(s.warp_sums, mine, total);
#pragma unroll
  for (int j = 0; j < kBinsPerThread; ++j) {
    const uint32_t bin = BinOf(j);
    if (above < rank_a && rank_a <= above + counts[j]) s.found[0] = {bin, above, counts[j]};
    if (above < rank_b && rank_b <= above + counts[j]) s.found[1] = {bin, above, counts[j]};
    above += counts[j];
  }
  __syncthreads();
  return {s.found[0], s.found[1], total};
}
// The search over s.hist, which it leaves zeroed for its next use.
__device__ __forceinline__ BinSearch FindBins(SharedStorage& s, uint32_t rank_a, uint32_t rank_b) {
  uint32_t counts[kBinsPerThread];
#pragma unroll
  for (int j = 0; j < kBinsPerThread; ++j) {
    counts[j] = s.hist[BinOf(j)];
    s.hist[BinOf(j)] = 0;
  }
  return SearchBins(s, counts, rank_a, rank_b);
}

// Calls put(position, candidate) for the candidates that keep(bits, col), at positions 0, 1, ...
// taken from *counter. In rounds of one entry a thread: the round's ballot places each member in
// its warp, and one atomic per warp and batch reserves the warp's places (no scan, no re-read).
// Every thread of the block calls it.
template <class Keep, class Put>
__device__ __forceinline__ void CompactCandidates(const CandidateSource& source, int* counter, const Keep& keep,
                                                  const Put& put) {
  constexpr int kBatch = 8;
  const int lane = threadIdx.x % kWarpSize;
  const uint32_t lanes_below = (1u << lane) - 1u;
  for (int base = 0; base < source.count; base += kBatch * kThreadsPerBlock) {  // block-uniform
    uint2 c[kBatch];
    uint32_t ballots[kBatch];
    int warp_total = 0;
    if (base + kBatch * kThreadsPerBlock <= source.shared_capacity) {  // block-uniform, the usual case
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {  // all loads first, with no branch to the slice
        const int entry = base + kThreadsPerBlock * i + static_cast<int>(threadIdx.x);
        c[i] = entry < source.count ? source.shared[entry] : make_uint2(kNanBits, 0);
      }
    } else {
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        const int entry = base + kThreadsPerBlock * i + static_cast<int>(threadIdx.x);
        c[i] = entry < source.count ? source.Get(entry) : make_uint2(kNanBits, 0);
      }
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int entry = base + kThreadsPerBlock * i + static_cast<int>(threadIdx.x);
      ballots[i] = __ballot_sync(kFullMask, entry < source.count && keep(c[i].x, static_cast<int32_t>(c[i].y)));
      warp_total += __popc(ballots[i]);
    }
    int warp_base = 0;
    if (lane == 0 && warp_total > 0) warp_base = atomicAdd(counter, warp_total);
    int position = __shfl_sync(kFullMask, warp_base, 0);
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      if (ballots[i] & (1u << lane)) put(position + __popc(ballots[i] & lanes_below), c[i]);
      position += __popc(ballots[i]);
    }
  }
}

// Puts value(bits, col) of the candidates that are members into the frontier (frontier_count
// of them).
template <class Member, class Value>
__device__ __forceinline__ void CompactCandidatesToFrontier(SharedStorage& s, const CandidateSource& source,
                                                            const Member& member, const Value& value) {
  if (threadIdx.x == 0) s.frontier_count = 0;
  __syncthreads();
  CompactCandidates(source, &s.frontier_count, member, [&](int position, uint2 c) {
    s.work.frontier[position] = value(c.x, static_cast<int32_t>(c.y));
  });
  __syncthreads();
}

// Copies the projected values of the group `prefix` into the frontier.
template <class Source, class Project>
__device__ __forceinline__ void CompactGroup(SharedStorage& s, const Source& source, const Project& project,
                                             uint32_t prefix, uint32_t prefix_mask) {
  if constexpr (std::is_same_v<Source, CandidateSource>) {
    const auto member = [&](uint32_t bits, int32_t col) {
      uint32_t value = 0;
      return project(bits, col, value) && (value & prefix_mask) == prefix;
    };
    const auto projected = [&](uint32_t bits, int32_t col) {
      uint32_t value = 0;
      project(bits, col, value);
      return value;
    };
    CompactCandidatesToFrontier(s, source, member, projected);
    return;
  }
  if (threadIdx.x == 0) s.frontier_count = 0;
  __syncthreads();
  source.ForEach([&](uint32_t bits, int32_t col, bool valid) {
    uint32_t value = 0;
    const bool member = valid && project(bits, col, value) && (value & prefix_mask) == prefix;
    const int position = WarpReserve(&s.frontier_count, member);
    if (member) s.work.frontier[position] = value;
  });
  __syncthreads();
}

// The rank-th largest projected value, how many items of it are needed to make up `rank`
// (quota) and how many there are (group). Fewer than rank items take part: all = true.
struct RankValue {
  uint32_t value;
  int quota;
  int group;
  bool all;
  int total;  // the items taking part
};
template <class Source, class Project>
__device__ __forceinline__ RankValue FindRankValue(SharedStorage& s, const Source& source, const Project& project,
                                                   int rank) {
  DigitHistogram(s, source, project, 0, 0, 0);
  const BinSearch first = FindBins(s, rank, 0);
  if (first.total < static_cast<uint32_t>(rank)) return {0, 0, 0, true, static_cast<int>(first.total)};
  uint32_t prefix = first.a.bin << DigitShift(0);
  uint32_t prefix_mask = DigitMask(0) << DigitShift(0);
  uint32_t remaining = rank - first.a.above;  // the groups above are committed
  uint32_t group = first.a.count;
  // The boundary group usually is a small part of the source: later digits look at it alone.
  const bool compacted = group <= kFrontierCapacity;
  if (compacted) CompactGroup(s, source, project, prefix, prefix_mask);
  const FrontierSource frontier{s.work.frontier, static_cast<int>(group)};
  for (int digit = 1; digit < kNumDigits; ++digit) {
    if (compacted) {
      DigitHistogram(s, frontier, AsProjected{}, prefix, prefix_mask, digit);
    } else {
      DigitHistogram(s, source, project, prefix, prefix_mask, digit);
    }
    const BinFound found = FindBins(s, remaining, 0).a;
    remaining -= found.above;
    group = found.count;
    prefix |= found.bin << DigitShift(digit);
    prefix_mask |= DigitMask(digit) << DigitShift(digit);
  }
  return {prefix, static_cast<int>(remaining), static_cast<int>(group), false, static_cast<int>(first.total)};
}

// 2048 bins relative to a cutoff (> 0), spanning [cutoff, largest]: keys past largest fall in the
// last bin, keys below the cutoff (kept under a +-0 threshold) in the first. A rank in a bin of
// a few candidates is then ranked directly; the first and last bins never settle one.
struct RelativeBins {
  uint32_t cutoff;
  int shift;
  __device__ __forceinline__ RelativeBins(uint32_t cutoff_key, uint32_t largest) : cutoff(cutoff_key) {
    const uint32_t quotient = (largest - cutoff) / kLastBin;  // the smallest shift leaving largest
    shift = quotient == 0 ? 0 : 32 - __clz(quotient);          // below the last bin
  }
  // Whether bins relative to cutoff can settle a rank (else the radix digits do).
  __device__ __forceinline__ static bool Usable(uint32_t cutoff_key, uint32_t largest) {
    return cutoff_key != 0 && largest > cutoff_key;
  }
  __device__ __forceinline__ uint32_t operator()(uint32_t key) const {
    if (key < cutoff) return 0u;
    const uint32_t bin = (key - cutoff) >> shift;
    return bin < kLastBin ? bin : kLastBin;
  }
  // Whether the rank's bin, of `count` candidates, is one a warp ranks.
  __device__ __forceinline__ static bool Settles(const BinFound& found) {
    return found.bin != 0 && found.bin != kLastBin && found.count <= kWarpSize;
  }
  static constexpr uint32_t kLastBin = kDigitBins - 1;
};

// Lane l of a warp holds member l (key, col) of a group of `group` <= 32 members: how many members
// have a greater key, an equal key and (kColumns) an equal key at a lower column.
struct WarpRank {
  int greater;
  int equal;
  int equal_before;
};
template <bool kColumns>
__device__ __forceinline__ WarpRank RankInWarp(uint32_t key, uint32_t col, int group) {
  int greater = 0;
  int equal = 0;
  int equal_before = 0;
  for (int other = 0; other < group; ++other) {
    const uint32_t other_key = __shfl_sync(kFullMask, key, other);
    if constexpr (kColumns) {  // both branches spelled out: this order compiles to the measured code
      const uint32_t other_col = __shfl_sync(kFullMask, col, other);
      greater += other_key > key;
      equal += other_key == key;
      equal_before += other_key == key && other_col < col;
    } else {
      greater += other_key > key;
      equal += other_key == key;
    }
  }
  return {greater, equal, equal_before};
}

// Adds this block's candidates to s.hist in relative bins; a barrier follows.
__device__ __forceinline__ void RelativeHistogram(SharedStorage& s, const CandidateSource& source,
                                                  const RelativeBins& bins) {
  source.ForEach([&](uint32_t bits, int32_t, bool valid) {
    if (valid) atomicAdd(&s.hist[bins(OrderedKeyF32(bits))], 1u);
  });
  __syncthreads();
}

// The rank-th largest key of candidates kept by `cutoff`, given the sample's largest key: one
// histogram in relative bins usually leaves the k-th key in a bin of a few candidates, which one
// warp ranks directly. Otherwise the three-digit selection (the answer never depends on the
// sample, only the work does).
__device__ __forceinline__ RankValue FindCandidateRankValue(SharedStorage& s, const CandidateSource& source,
                                                            int rank, uint32_t cutoff, uint32_t largest) {
  if (!RelativeBins::Usable(cutoff, largest)) return FindRankValue(s, source, KeyOfValue{}, rank);
  const RelativeBins relative_bin(cutoff, largest);
  RelativeHistogram(s, source, relative_bin);
  const BinSearch first = FindBins(s, rank, 0);
  if (first.total < static_cast<uint32_t>(rank)) return {0, 0, 0, true, static_cast<int>(first.total)};
  const uint32_t group_bin = first.a.bin;
  const int group = static_cast<int>(first.a.count);
  if (!RelativeBins::Settles(first.a)) return FindRankValue(s, source, KeyOfValue{}, rank);
  const int remaining = rank - static_cast<int>(first.a.above);
  CompactCandidatesToFrontier(
      s, source, [&](uint32_t bits, int32_t) { return relative_bin(OrderedKeyF32(bits)) == group_bin; },
      [](uint32_t bits, int32_t) { return OrderedKeyF32(bits); });
  if (threadIdx.x < kWarpSize) {  // each member counts the members above it and equal to it
    const int lane = threadIdx.x;
    const uint32_t key = lane < group ? s.work.frontier[lane] : 0u;
    const WarpRank r = RankInWarp<false>(key, 0, group);
    const bool holds_rank = lane < group && r.greater < remaining && remaining <= r.greater + r.equal;
    if (lane == __ffs(__ballot_sync(kFullMask, holds_rank)) - 1) {
      s.found[0] = {key, static_cast<uint32_t>(remaining - r.greater), static_cast<uint32_t>(r.equal)};
    }
  }
  __syncthreads();
  const BinFound kth = s.found[0];  // {key, quota, group}
  return {kth.bin, static_cast<int>(kth.above), static_cast<int>(kth.count), false, static_cast<int>(first.total)};
}

// Whether an item wins: a key above kth_key, or equal to it at a column <= column_limit.
struct Wins {
  uint32_t kth_key;
  uint32_t column_limit;
  __device__ __forceinline__ bool operator()(uint32_t bits, int32_t col) const {
    const uint32_t key = OrderedKeyF32(bits);
    return key > kth_key || (key == kth_key && static_cast<uint32_t>(col) <= column_limit);
  }
};

// Marks the winners' columns, all in [base, base + span) with base a multiple of 32, in
// s.work.bitmap (zeroed first: the frontier it aliases is dead); bit c stands for column base + c.
template <class Source>
__device__ __forceinline__ void MarkWinners(SharedStorage& s, const Source& source, const Wins& wins, int base,
                                            int span) {
  const int words = (span + 31) / 32;
  for (int w = threadIdx.x; w < words; w += kThreadsPerBlock) s.work.bitmap[w] = 0;
  __syncthreads();
  source.ForEach([&](uint32_t bits, int32_t col, bool valid) {
    if (valid && wins(bits, col)) atomicOr(&s.work.bitmap[(col - base) / 32], 1u << (col % 32));
  });
  __syncthreads();
}

// Puts the winners in s.work.selected, in no particular order. Returns how many.
template <class Source>
__device__ __forceinline__ int GatherWinners(SharedStorage& s, const Source& source, const Wins& wins) {
  if (threadIdx.x == 0) s.selected_count = 0;
  __syncthreads();
  if constexpr (std::is_same_v<Source, CandidateSource>) {
    CompactCandidates(source, &s.selected_count, wins, [&](int position, uint2 c) {
      if (position < kMaxK) {
        s.work.selected.bits[position] = c.x;
        s.work.selected.col[position] = c.y;
      }
    });
  } else {
    source.ForEach([&](uint32_t bits, int32_t col, bool valid) {
      const bool won = valid && wins(bits, col);
      const int position = WarpReserve(&s.selected_count, won);
      if (won && position < kMaxK) {
        s.work.selected.bits[position] = bits;
        s.work.selected.col[position] = static_cast<uint32_t>(col);
      }
    });
  }
  __syncthreads();
  return min(s.selected_count, kMaxK);
}

// The exact top-k of a source (ties to the lowest columns): marked in s.work.bitmap (to_bitmap)
// or gathered into s.work.selected. Returns min(k, valid items). Candidates kept by a cutoff (> 0)
// take the relative-bin selection.
template <class Source>
__device__ __forceinline__ int SelectTopK(SharedStorage& s, const Source& source, int k, bool to_bitmap,
                                          uint32_t cutoff) {
  RankValue kth;
  if constexpr (std::is_same_v<Source, CandidateSource>) {
    kth = FindCandidateRankValue(s, source, k, cutoff, s.sample_largest);
  } else {
    kth = FindRankValue(s, source, KeyOfValue{}, k);
  }
  Wins wins{0, 0};  // kth.all: every valid key is above 0
  if (!kth.all) {
    wins = {kth.value, 0xFFFFFFFFu};
    if (kth.quota < kth.group) wins.column_limit = ~FindRankValue(s, source, LowColumnOfTie{kth.value}, kth.quota).value;
  }
  if (!to_bitmap) return GatherWinners(s, source, wins);
  MarkWinners(s, source, wins, 0, s.job.length);
  return kth.all ? kth.total : k;
}

// ---------------------------------------------------------------------------------------------
// The sample: cutoffs that keep about kRetention * k candidates of the row.

// This thread's share of a regular sample of whole lines; `positions` gets the sampled count.
__device__ __forceinline__ SampleSource LoadSample(const float* row, int length, int64_t row_index,
                                                   int& positions) {
  const int lines = length / kSampleLineElems + (length % kSampleLineElems != 0);
  const int wanted_stride = lines / kSampleLines + (lines % kSampleLines != 0);
  const int stride = wanted_stride > kMinSampleStride ? wanted_stride : kMinSampleStride;
  const int phase = static_cast<int>(row_index % stride);  // consecutive rows sample different lines
  const int sampled_lines = (lines - phase - 1) / stride + 1;  // lines > phase: length > 8 lines
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  SampleSource sample;
#pragma unroll
  for (int j = 0; j < kSampleLinesPerWarp; ++j) {
    const int line = warp + kWarpsPerBlock * j;
    const int64_t col = int64_t{phase + line * stride} * kSampleLineElems + lane;  // line * stride < lines
    sample.values[j] = line < sampled_lines && col < length ? __ldg(row + col) : __uint_as_float(kNanBits);
  }
  positions = sampled_lines * kSampleLineElems;
  return sample;
}

// Also pulls columns [prefetch_begin, prefetch_end) (up to kPrefetchAhead of them) into L2, behind
// the sample's loads so that these are not queued after the prefetches, and records the sample's
// largest key in s.sample_largest (zeroed when the job started).
__device__ __forceinline__ Cutoffs SampleCutoffs(SharedStorage& s, const float* row, int length,
                                                 int64_t row_index, int k, int rank_slack, int prefetch_begin,
                                                 int prefetch_end) {
  if (length <= kSharedCandidates) {  // short rows are kept whole
    PrefetchToL2(row, prefetch_begin, prefetch_end, kPrefetchAhead);
    return {0, 0};
  }
  int positions = 0;
  const SampleSource sample = LoadSample(row, length, row_index, positions);
  PrefetchToL2(row, prefetch_begin, prefetch_end, kPrefetchAhead);
  uint32_t largest = 0;
#pragma unroll
  for (int j = 0; j < kSampleLinesPerWarp; ++j) {
    const uint32_t bits = __float_as_uint(sample.values[j]);
    if (!IsNanF32(bits)) largest = max(largest, OrderedKeyF32(bits));
  }
  largest = __reduce_max_sync(kFullMask, largest);
  if (threadIdx.x % kWarpSize == 0) atomicMax(&s.sample_largest, largest);  // read after a barrier
  // Sampled rank whose key leaves ~kRetention * k row items above it (positions <= 4096).
  const int64_t primary_rank =
      (kRetention * static_cast<int64_t>(k) * positions + length - 1) / length + rank_slack;
  const int64_t secondary_rank = kSecondaryFactor * primary_rank + kRankSlack;
  DigitHistogram(s, sample, KeyOfValue{}, 0, 0, 0);
  const BinSearch coarse =
      FindBins(s, static_cast<uint32_t>(primary_rank), static_cast<uint32_t>(secondary_rank));
  if (primary_rank > coarse.total) return {0, 0};
  const uint32_t secondary = secondary_rank > coarse.total ? 0 : coarse.b.bin << DigitShift(0);
  // Refine the primary within its coarse bin with the next 11 bits of the sampled keys.
  const uint32_t coarse_prefix = coarse.a.bin << DigitShift(0);
  DigitHistogram(s, sample, KeyOfValue{}, coarse_prefix, DigitMask(0) << DigitShift(0), 1);
  const BinFound fine = FindBins(s, static_cast<uint32_t>(primary_rank) - coarse.a.above, 0).a;
  return {coarse_prefix | (fine.bin << DigitShift(1)), secondary};
}

// ---------------------------------------------------------------------------------------------
// One row.
struct FilteredLaunch {
  TopkProblem problem;
  unsigned long long* queue_next;  // the next row a worker takes (queue mode)
  unsigned int* workers_done;      // the last worker to finish zeroes the counters
  uint2* slices;                   // [grid][slice_entries]
  int slice_entries;
};

// The row's valid length, or -1 when the row is masked out by num_valid_rows.
__device__ __forceinline__ int RowLength(const TopkProblem& problem, int64_t row) {
  if (!RowIsValid(row, problem.num_valid_rows, problem.rows_per_group)) return -1;
  if (problem.lengths == nullptr) return static_cast<int>(problem.width);
  return static_cast<int>(ClampLength(problem.lengths[row], problem.width));  // width <= INT_MAX
}

// This block's overflow slice: its own, so concurrent blocks never share one.
__device__ __forceinline__ uint2* WorkerSlice(const FilteredLaunch& launch) {
  return launch.slices + static_cast<int64_t>(blockIdx.x) * launch.slice_entries;
}

// Thread 0 publishes a row's index and length (-1: masked); a barrier must follow.
__device__ __forceinline__ void PublishJob(SharedStorage& s, int64_t row, int length) {
  s.job.row = row;
  s.job.length = length;
  s.sample_largest = 0;
}


__device__ __forceinline__ const float* JobScores(const SharedStorage& s, const TopkProblem& problem) {
  return static_cast<const float*>(problem.scores) + s.job.row * problem.width;
}

// The job's cutoffs; also pulls the start of columns [begin, end) into L2.
__device__ __forceinline__ void SampleJobCutoffs(SharedStorage& s, const TopkProblem& problem, int rank_slack,
                                                 int begin, int end) {
  const Cutoffs cutoffs =
      SampleCutoffs(s, JobScores(s, problem), s.job.length, s.job.row, problem.k, rank_slack, begin, end);
  if (threadIdx.x == 0) s.job.cutoffs = cutoffs;
  __syncthreads();
}

// Whether the job's result is ordered through s.work.bitmap (else through s.work.selected).
__device__ __forceinline__ bool OrdersByBitmap(const SharedStorage& s, const TopkProblem& problem) {
  return !problem.sorted && s.job.length <= kBitmapColumns;
}

// Selects the job's row (see SelectTopK), trying in turn the primary cutoff, the secondary and the
// exact route over the row. Kept candidates go to shared memory, then to the slice. `attempt` is
// the first cutoff to try (1: the primary is known short); kept >= 0 says its candidates are in
// s.candidates already (merged there by a split row's cluster; attempt 2: the exact route).
__device__ __forceinline__ int SelectJobRow(SharedStorage& s, const FilteredLaunch& launch, int attempt, int kept) {
  const int k = launch.problem.k;
  const float* row = JobScores(s, launch.problem);
  const CandidateSink keep{kSharedCandidates, WorkerSlice(launch), launch.slice_entries};
  const bool to_bitmap = OrdersByBitmap(s, launch.problem);
  for (; attempt < 2; ++attempt, kept = -1) {
    const uint32_t cutoff = attempt == 0 ? s.job.cutoffs.primary : s.job.cutoffs.secondary;
    if (attempt == 1 && cutoff == s.job.cutoffs.primary) break;  // same band: known short
    if (kept < 0) kept = FilterColumns(s, row, 0, s.job.length, KeepThreshold(cutoff), keep);
    if (kept > keep.Capacity()) break;  // overflow: the exact route re-reads the row
    if (kept >= k || KeepsAll(cutoff)) {
      const CandidateSource candidates{s.candidates, keep.shared_capacity, keep.global, kept};
      return SelectTopK(s, candidates, k, to_bitmap, KeepsAll(cutoff) ? 0u : cutoff);
    }
  }
  return SelectTopK(s, RowSource{row, 0, s.job.length}, k, to_bitmap, 0u);
}

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

// Writes m winners to out slots [first_slot, first_slot + m) and, with pad, kEmptySlot to the
// slots after them up to k: ascending, or by key descending then column ascending when sorted;
// page-transformed, coalesced. by_bitmap: the winners are marked in s.work.bitmap for columns
// [base, base + span); else they are in s.work.selected.
__device__ __forceinline__ void WriteWinners(SharedStorage& s, const TopkProblem& problem, int m, int first_slot,
                                             int base, int span, bool by_bitmap, bool pad) {
  const int slots = pad ? problem.k - first_slot : m;
  int32_t* out = problem.out + s.job.row * problem.k + first_slot;
  const int32_t* page_row = nullptr;
  if (problem.page_table != nullptr && m > 0) {
    page_row = problem.page_table +
               TableRowFor(s.job.row, problem.table_rows, problem.table_count) * problem.pages;
  }
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
      out[slot] = slot < m ? PageTransform(static_cast<int32_t>(base + ordered[slot]), page_row, problem.log2_page_size)
                           : kEmptySlot;
    }
    __syncthreads();  // the buffers are reused by the next row
    return;
  }
  uint32_t cols[kSortItemsPerThread];
  uint32_t keys[kSortItemsPerThread];
#pragma unroll
  for (int j = 0; j < kSortItemsPerThread; ++j) {  // blocked; padding sorts last both ways
    const int slot = threadIdx.x * kSortItemsPerThread + j;
    cols[j] = slot < m ? s.work.selected.col[slot] : 0xFFFFFFFFu;
    keys[j] = slot < m ? OrderedKeyF32(s.work.selected.bits[slot]) : 0u;  // 0: below every key
  }
  __syncthreads();  // the sort storage aliases the selection
  if (m > 1) {
    // Columns are < length < 2^column_bits, so the padding stays above them.
    const int column_bits = 32 - __clz(static_cast<int>(s.job.length));
    if (problem.sorted) {
      RankSort sort(s.work.rank_sort);
      sort.Sort(cols, keys, 0, column_bits);  // then a stable sort by key keeps ties in column order
      __syncthreads();
      sort.SortDescendingBlockedToStriped(keys, cols, 0, 32);
    } else {
      ColumnSort(s.work.column_sort).SortBlockedToStriped(cols, 0, column_bits);
    }
  }  // m <= 1: slot 0 sits in the same place blocked and striped
#pragma unroll
  for (int j = 0; j < kSortItemsPerThread; ++j) {
    const int slot = threadIdx.x + kThreadsPerBlock * j;
    if (slot < slots) {
      out[slot] = slot < m ? PageTransform(static_cast<int32_t>(cols[j]), page_row, problem.log2_page_size)
                           : kEmptySlot;
    }
  }
  __syncthreads();  // the sort storage is reused by the next row
}

// Writes the job's m winners, then -1s (see WriteWinners).
__device__ __forceinline__ void WriteRow(SharedStorage& s, const TopkProblem& problem, int m) {
  WriteWinners(s, problem, m, 0, 0, s.job.length, OrdersByBitmap(s, problem), true);
}

// The job's row by this block alone; while_selecting() runs after the sample (and for an empty row).
template <class WhileSelecting>
__device__ __forceinline__ void RunJobRow(SharedStorage& s, const FilteredLaunch& launch, int rank_slack,
                                          const WhileSelecting& while_selecting) {
  int m = 0;
  if (s.job.length > 0) {
    SampleJobCutoffs(s, launch.problem, rank_slack, 0, s.job.length);
    while_selecting();
    m = SelectJobRow(s, launch, 0, -1);
  } else {
    while_selecting();
  }
  WriteRow(s, launch.problem, m);
}

// A whole row by one block. Thread 0 holds `claimed`, the worker's next row, claimed at the
// row's start; it reads that row's length into `claimed_length` once the claim has returned.
__device__ __forceinline__ void RunWholeRow(SharedStorage& s, const FilteredLaunch& launch,
                                            unsigned long long claimed, int& claimed_length) {
  const auto read_claimed_length = [&] {
    if (threadIdx.x != 0) return;
    const bool real = claimed < static_cast<unsigned long long>(launch.problem.rows);
    claimed_length = real ? RowLength(launch.problem, static_cast<int64_t>(claimed)) : -1;
  };
  RunJobRow(s, launch, kWholeRowRankSlack, read_claimed_length);  // its latency hides behind the pass
}

// ---------------------------------------------------------------------------------------------
// Thread block clusters need sm_90: for older targets the split kernel compiles empty and the
// host never launches it there (MaxSplitParts).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define JAX_TOPK_HAS_CLUSTERS 1
#else
#define JAX_TOPK_HAS_CLUSTERS 0
#endif
#if JAX_TOPK_HAS_CLUSTERS

// Split mode: a row per thread block cluster; part p of its blocks filters columns [begin_p, end_p)
// into its own sink. The parts add up their candidates' relative-bin histograms through
// distributed shared memory, one warp in each ranks the few candidates of the k-th key's bin, and
// every part writes its own winners, in column order, after the winners of the parts before it.
// An underfilled primary is retried by every part with the secondary cutoff. A row this does not
// settle (a crowded k-th bin, sorted results, cutoffs that keep everything) is merged into part 0
// when its candidates fit there, else done whole by part 0 (re-filtered, or the exact route).

// Zeroes s.hist (each thread its BinOf bins).
__device__ __forceinline__ void ClearHistogram(SharedStorage& s) {
#pragma unroll
  for (int j = 0; j < kBinsPerThread; ++j) s.hist[BinOf(j)] = 0;
}

// Starts a row of a split launch.
__device__ __forceinline__ void StartJob(SharedStorage& s, const TopkProblem& problem, int64_t row) {
  if (threadIdx.x == 0) PublishJob(s, row, RowLength(problem, row));
  __syncthreads();
}

// The first column of `part` (parts: the row's end); rounded down to 32 columns (bitmap words).
__device__ __forceinline__ int PartBegin(int64_t length, int part, int parts) {
  return part == parts ? static_cast<int>(length) : static_cast<int>((length * part / parts) & ~int64_t{31});
}

// Reads every part's kept count (after a cluster barrier): s.cluster's total, overflow and
// part_offset (where each part's candidates go when merged).
__device__ __forceinline__ void TallyCluster(SharedStorage& s, const cg::cluster_group& cluster, int parts,
                                             int capacity) {
  if (threadIdx.x < kWarpSize) {
    const int lane = threadIdx.x;
    const int kept = lane < parts ? *cluster.map_shared_rank(&s.kept, lane) : 0;
    const int inclusive = WarpInclusiveSum(kept);  // <= the row's length
    const bool overflow = __any_sync(kFullMask, kept > capacity);
    if (lane < parts) s.cluster.part_offset[lane] = static_cast<uint32_t>(inclusive - kept);
    if (lane == kWarpSize - 1) {
      s.cluster.total = static_cast<uint32_t>(inclusive);
      s.cluster.overflow = overflow;
    }
  }
  __syncthreads();
}

// This part's candidates per super-bin, for the other parts (after RelativeHistogram).
__device__ __forceinline__ void PublishSuperBins(SharedStorage& s) {
  const int lane = threadIdx.x % kWarpSize;
  for (int super = threadIdx.x / kWarpSize; super < kSuperBins; super += kWarpsPerBlock) {
    const uint32_t count = __reduce_add_sync(kFullMask, s.hist[super * kWarpSize + lane]);
    if (lane == 0) s.cluster.super[super] = count;
  }
}

// Adds part q's count to a cluster-wide and, for parts before this one, an earlier-parts tally.
__device__ __forceinline__ void AddPartCount(uint32_t* sum, uint32_t* before, int q, int part, uint32_t count) {
  if (count == 0) return;
  atomicAdd(sum, count);
  if (q < part) atomicAdd(before, count);
}

// Finds the bin of the rank-th largest candidate over the cluster (rank <= the cluster's total;
// after a cluster barrier that follows every part's PublishSuperBins): s.cluster's kth_bin,
// own_above and above_before. The super-bins of every part first, then the 32 bins of the one
// holding the rank, each part's kept in s.cluster.bins_of_part.
__device__ __forceinline__ void FindClusterRank(SharedStorage& s, const cg::cluster_group& cluster, int parts,
                                                int part, uint32_t rank) {
  static_assert(kSuperBins * kMaxClusterParts <= 2 * kThreadsPerBlock, "two super-bins a thread");
  static_assert(kWarpSize * kMaxClusterParts <= kThreadsPerBlock, "one bin a thread");
  const int lane = threadIdx.x % kWarpSize;
  const bool first_warp = threadIdx.x < kWarpSize;
  uint32_t counts[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {  // both loads first
    const int item = threadIdx.x + kThreadsPerBlock * i;
    counts[i] = item < kSuperBins * parts
                    ? cluster.map_shared_rank(s.cluster.super, item / kSuperBins)[item % kSuperBins] : 0u;
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int item = threadIdx.x + kThreadsPerBlock * i;
    AddPartCount(&s.cluster.super_sum[item % kSuperBins], &s.cluster.super_before[item % kSuperBins],
                 item / kSuperBins, part, counts[i]);
  }
  __syncthreads();
  // One warp finds the super-bin, two a lane, the top ones first.
  if (first_warp) {
    const int high = kSuperBins - 1 - 2 * lane;
    const uint32_t in_high = s.cluster.super_sum[high];
    const uint32_t in_pair = in_high + s.cluster.super_sum[high - 1];
    const uint32_t above_pair = static_cast<uint32_t>(WarpInclusiveSum(static_cast<int>(in_pair))) - in_pair;
    const bool holds = above_pair < rank && rank <= above_pair + in_pair;
    const int holder = __ffs(__ballot_sync(kFullMask, holds)) - 1;
    const bool in_high_bin = __shfl_sync(kFullMask, above_pair + in_high, holder) >= rank;
    const int super = kSuperBins - 1 - 2 * holder - (in_high_bin ? 0 : 1);
    const uint32_t above = __shfl_sync(kFullMask, in_high_bin ? above_pair : above_pair + in_high, holder);
    // The earlier parts' and this part's candidates in the super-bins above it.
    const bool high_above = high > super;
    const bool low_above = high - 1 > super;
    const uint32_t before = __reduce_add_sync(kFullMask, (high_above ? s.cluster.super_before[high] : 0u) +
                                                             (low_above ? s.cluster.super_before[high - 1] : 0u));
    const uint32_t own = __reduce_add_sync(kFullMask, (high_above ? s.cluster.super[high] : 0u) +
                                                          (low_above ? s.cluster.super[high - 1] : 0u));
    if (lane == 0) {  // kth_bin holds the super-bin until the bin is found below
      s.cluster.kth_bin = {static_cast<uint32_t>(super), above, 0};
      s.cluster.above_before = before;
      s.cluster.own_above = own;
    }
  }
  __syncthreads();
  const int super = static_cast<int>(s.cluster.kth_bin.bin);
  if (threadIdx.x < kWarpSize * parts) {  // part q's bin of the super-bin, top first
    const int q = threadIdx.x / kWarpSize;
    s.cluster.bins_of_part[q][lane] = cluster.map_shared_rank(s.hist, q)[super * kWarpSize + kWarpSize - 1 - lane];
  }
  __syncthreads();
  if (first_warp) {  // lane l: the super-bin's l-th bin from the top
    uint32_t in_bin = 0;
    uint32_t before = 0;
    for (int q = 0; q < parts; ++q) {
      const uint32_t count = s.cluster.bins_of_part[q][lane];
      in_bin += count;
      before += q < part ? count : 0u;
    }
    const uint32_t own = s.cluster.bins_of_part[part][lane];
    const uint32_t remaining = rank - s.cluster.kth_bin.above;  // in [1, the super-bin's count]
    const uint32_t above = static_cast<uint32_t>(WarpInclusiveSum(static_cast<int>(in_bin))) - in_bin;
    const int holder = __ffs(__ballot_sync(kFullMask, above < remaining && remaining <= above + in_bin)) - 1;
    const bool bin_above = lane < holder;
    const uint32_t before_above = __reduce_add_sync(kFullMask, bin_above ? before : 0u);
    const uint32_t own_above = __reduce_add_sync(kFullMask, bin_above ? own : 0u);
    if (lane == holder) {
      const uint32_t bin = static_cast<uint32_t>(super * kWarpSize + kWarpSize - 1 - lane);
      s.cluster.kth_bin = {bin, s.cluster.kth_bin.above + above, in_bin};
      s.cluster.above_before += before_above;
      s.cluster.own_above += own_above;
    }
  }
  __syncthreads();
}

// One warp ranks the members of s.cluster.kth_bin in every part (at most a warp's worth):
// s.cluster gets the k-th key, the last column of it that wins, and how many winning members lie
// in the parts before this one and in this one. Columns are distinct, so ties order strictly.
__device__ __forceinline__ void RankClusterBoundary(SharedStorage& s, const cg::cluster_group& cluster, int parts,
                                                    int part, int k) {
  const int group = static_cast<int>(s.cluster.kth_bin.count);
  const int remaining = k - static_cast<int>(s.cluster.kth_bin.above);
  if (threadIdx.x >= kWarpSize) return;
  const int lane = threadIdx.x;
  const int slot = kWarpSize - 1 - static_cast<int>(s.cluster.kth_bin.bin % kWarpSize);  // see FindClusterRank
  const int count = lane < parts ? static_cast<int>(s.cluster.bins_of_part[lane][slot]) : 0;
  const int first = WarpInclusiveSum(count) - count;  // lane q: part q's first member
  int holder = 0;                                     // the part holding member `lane`
  for (int q = 1; q < parts; ++q) holder = __shfl_sync(kFullMask, first, q) <= lane ? q : holder;
  const int holder_first = __shfl_sync(kFullMask, first, holder);
  uint2 member = make_uint2(0, 0);
  if (lane < group) member = cluster.map_shared_rank(s.cluster.boundary, holder)[lane - holder_first];
  const uint32_t key = lane < group ? OrderedKeyF32(member.x) : 0u;
  const WarpRank r = RankInWarp<true>(key, member.y, group);
  const int equal_before = r.equal_before;  // members of this key at lower columns
  const bool holds_rank = lane < group && r.greater < remaining && remaining <= r.greater + r.equal;
  const int kth_lane = __ffs(__ballot_sync(kFullMask, holds_rank)) - 1;  // remaining is in [1, group]
  const uint32_t kth_key = __shfl_sync(kFullMask, key, kth_lane);
  const int quota = remaining - __shfl_sync(kFullMask, r.greater, kth_lane);
  const bool all_ties_win = quota == __shfl_sync(kFullMask, r.equal, kth_lane);
  const bool wins = lane < group && (key > kth_key || (key == kth_key && equal_before < quota));
  const bool last_tie = lane < group && key == kth_key && equal_before == quota - 1;
  const uint32_t last_tie_col = __shfl_sync(kFullMask, member.y, __ffs(__ballot_sync(kFullMask, last_tie)) - 1);
  const uint32_t wins_before = __ballot_sync(kFullMask, wins && holder < part);
  const uint32_t wins_mine = __ballot_sync(kFullMask, wins && holder == part);
  if (lane == 0) {
    s.cluster.kth_key = kth_key;
    s.cluster.column_limit = all_ties_win ? 0xFFFFFFFFu : last_tie_col;
    s.cluster.members_before = __popc(wins_before);
    s.cluster.members_mine = __popc(wins_mine);
  }
}

// The row settled: s.cluster.kth_bin, the k-th key's bin over the cluster, holds at most a warp's
// worth of candidates. Ranks them and writes this part's winners after the earlier parts'.
__device__ __forceinline__ void FinishSettledRow(SharedStorage& s, const FilteredLaunch& launch,
                                                 const cg::cluster_group& cluster, int parts, int part, int begin,
                                                 int end, const CandidateSource& mine, const RelativeBins& bins) {
  const uint32_t kth_bin = s.cluster.kth_bin.bin;
  CompactCandidates(
      mine, &s.cluster.boundary_count, [&](uint32_t bits, int32_t) { return bins(OrderedKeyF32(bits)) == kth_bin; },
      [&](int position, uint2 c) { s.cluster.boundary[position] = c; });  // position < kWarpSize
  cluster.sync();  // members published; no part reads another's histogram any more
  ClearHistogram(s);
  RankClusterBoundary(s, cluster, parts, part, launch.problem.k);
  __syncthreads();
  cluster.barrier_arrive();  // done reading the other parts' shared memory
  const Wins wins{s.cluster.kth_key, s.cluster.column_limit};
  const int m = static_cast<int>(s.cluster.own_above + s.cluster.members_mine);
  const int first_slot = static_cast<int>(s.cluster.above_before + s.cluster.members_before);
  const int span = end - begin;
  const bool by_bitmap = span <= kBitmapColumns;
  if (by_bitmap) {
    MarkWinners(s, mine, wins, begin, span);
  } else {
    GatherWinners(s, mine, wins);
  }
  WriteWinners(s, launch.problem, m, first_slot, begin, span, by_bitmap, false);
  cluster.barrier_wait();  // no part leaves while another may still read its shared memory
}

// The part holding merged entry `entry` (s.cluster.part_offset is non-decreasing).
__device__ __forceinline__ int PartHolding(const SharedStorage& s, uint32_t entry, int parts) {
  int part = 0;
#pragma unroll
  for (int step = kMaxClusterParts / 2; step > 0; step /= 2) {
    if (part + step < parts && s.cluster.part_offset[part + step] <= entry) part += step;
  }
  return part;
}

// Part 0 copies the other parts' candidates (all in their shared memory) after its own.
__device__ __forceinline__ void MergeIntoPartZero(SharedStorage& s, const cg::cluster_group& cluster, int parts) {
  constexpr int kBatch = 8;  // remote loads a thread has in flight
  const uint32_t total = s.cluster.total;
  for (uint32_t base = s.cluster.part_offset[1]; base < total; base += kBatch * kThreadsPerBlock) {
    uint2 entries[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const uint32_t entry = base + kThreadsPerBlock * i + threadIdx.x;
      if (entry < total) {
        const int holder = PartHolding(s, entry, parts);
        entries[i] = cluster.map_shared_rank(s.candidates, holder)[entry - s.cluster.part_offset[holder]];
      }
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const uint32_t entry = base + kThreadsPerBlock * i + threadIdx.x;
      if (entry < total) s.candidates[entry] = entries[i];
    }
  }
  __syncthreads();
}

// The job's row by block 0 of the cluster alone (rows of at most kSharedCandidates columns: they
// take no sample, the cutoffs keep everything).
__device__ __forceinline__ void RunRowAlone(SharedStorage& s, const FilteredLaunch& launch) {
  RunJobRow(s, launch, kRankSlack, [] {});
}

// One part of a row's cluster. Every branch around a cluster barrier is taken alike by all the
// cluster's blocks: it depends only on the row, the sample (the same in every part) and tallies
// over the whole cluster.
__device__ __forceinline__ void RunClusterPart(SharedStorage& s, const FilteredLaunch& launch) {
  const cg::cluster_group cluster = cg::this_cluster();
  const int parts = static_cast<int>(cluster.num_blocks());
  const int part = static_cast<int>(cluster.block_rank());
  const TopkProblem& problem = launch.problem;
  StartJob(s, problem, blockIdx.x / parts);
  if (s.job.length <= kSharedCandidates) {  // masked, empty or short: no sample, one block
    if (part == 0) RunRowAlone(s, launch);
    return;
  }
  const int begin = PartBegin(s.job.length, part, parts);
  const int end = PartBegin(s.job.length, part + 1, parts);
  SampleJobCutoffs(s, problem, kRankSlack, begin, end);  // the same cutoffs in every part
  const float* row = JobScores(s, problem);
  const CandidateSink sink{kSharedCandidates, WorkerSlice(launch), launch.slice_entries};
  int attempt = 0;
  uint32_t cutoff;
  bool short_of_k;
  for (;; attempt = 1) {
    cutoff = attempt == 0 ? s.job.cutoffs.primary : s.job.cutoffs.secondary;
    const int kept = FilterColumns(s, row, begin, end, KeepThreshold(cutoff), sink);
    if (threadIdx.x == 0) s.cluster.boundary_count = 0;
    if (threadIdx.x < kSuperBins) s.cluster.super_sum[threadIdx.x] = s.cluster.super_before[threadIdx.x] = 0;
    const CandidateSource mine{s.candidates, sink.shared_capacity, sink.global, min(kept, sink.Capacity())};
    // Sorted results are ordered by key over the whole row: part 0 does that (below).
    const bool relative = !problem.sorted && RelativeBins::Usable(cutoff, s.sample_largest);
    const RelativeBins bins(cutoff, relative ? s.sample_largest : cutoff);
    if (relative && kept <= sink.Capacity()) {
      RelativeHistogram(s, mine, bins);
      PublishSuperBins(s);
    }
    cluster.sync();  // kept counts and histograms published
    TallyCluster(s, cluster, parts, sink.Capacity());
    short_of_k = !s.cluster.overflow && s.cluster.total < static_cast<uint32_t>(problem.k) && !KeepsAll(cutoff);
    if (relative && !s.cluster.overflow && s.cluster.total >= static_cast<uint32_t>(problem.k)) {
      FindClusterRank(s, cluster, parts, part, static_cast<uint32_t>(problem.k));
      if (RelativeBins::Settles(s.cluster.kth_bin)) {
        FinishSettledRow(s, launch, cluster, parts, part, begin, end, mine, bins);
        return;
      }
    }
    cluster.sync();  // no part reads another's histogram any more
    ClearHistogram(s);
    __syncthreads();  // the histogram is zero before its next use
    // Short of k: every part re-reads its columns with the deeper cutoff, once.
    if (!short_of_k || attempt == 1 || s.job.cutoffs.secondary == s.job.cutoffs.primary) break;
  }
  // Not settled by the cluster: part 0 selects over the cluster's candidates, merged into its
  // shared memory when they fit and certify the row; else it re-reads the row with the same
  // cutoff (its own sink holds twice what fits in shared memory), or, short of k or when a part
  // overflowed, takes the exact route.
  const uint32_t total = s.cluster.total;
  const bool merged = !s.cluster.overflow && total <= kSharedCandidates &&
                      (total >= static_cast<uint32_t>(problem.k) || KeepsAll(cutoff));
  if (merged) {
    if (part == 0) MergeIntoPartZero(s, cluster, parts);
    cluster.sync();  // no part leaves while part 0 reads its candidates
  }
  if (part != 0) return;
  int m;
  if (merged) {
    m = SelectJobRow(s, launch, attempt, static_cast<int>(total));
  } else {
    m = SelectJobRow(s, launch, s.cluster.overflow || short_of_k ? 2 : attempt, -1);
  }
  WriteRow(s, problem, m);
}

#endif  // JAX_TOPK_HAS_CLUSTERS

// One launch: split mode (kSplit) or a persistent pool of workers taking whole rows from the
// queue in completion order.
template <bool kSplit>
__global__ void __launch_bounds__(kThreadsPerBlock, kBlocksPerSm)
    TopkFilteredKernel(const FilteredLaunch launch) {
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  SharedStorage& s = *reinterpret_cast<SharedStorage*>(shared_bytes);
  for (int bin = threadIdx.x; bin < kDigitBins; bin += kThreadsPerBlock) s.hist[bin] = 0;
  __syncthreads();
  if (kSplit) {
#if JAX_TOPK_HAS_CLUSTERS
    RunClusterPart(s, launch);
#endif
    return;
  }
  // Thread 0 claims each row one row ahead of its start (index and length in registers), so
  // that starting a row costs no round trip to the queue and the lengths.
  const unsigned long long rows = static_cast<unsigned long long>(launch.problem.rows);
  unsigned long long claimed = 0;
  int claimed_length = -1;
  if (threadIdx.x == 0) {
    claimed = atomicAdd(launch.queue_next, 1ull);
    if (claimed < rows) claimed_length = RowLength(launch.problem, static_cast<int64_t>(claimed));
  }
  for (;;) {
    if (threadIdx.x == 0) {
      s.next_row = claimed;
      if (claimed < rows) PublishJob(s, static_cast<int64_t>(claimed), claimed_length);
    }
    __syncthreads();
    if (s.next_row >= rows) break;  // rewritten only after the row's barriers
    if (threadIdx.x == 0) claimed = atomicAdd(launch.queue_next, 1ull);
    RunWholeRow(s, launch, claimed, claimed_length);
  }
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(launch.workers_done, 1u) == gridDim.x - 1) {  // every worker left the queue
      *launch.queue_next = 0;
      *launch.workers_done = 0;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Host side.
constexpr int kMaxCachedDevices = 64;

// compute() (>= 0) for `device`, computed once per device: cache[device] holds it plus one, so
// that 0 means not yet known. Racing writers store the same value.
template <class Compute>
int CachedPerDevice(int (&cache)[kMaxCachedDevices], int device, const Compute& compute) {
  if (device < 0 || device >= kMaxCachedDevices) return compute();
  if (cache[device] == 0) cache[device] = compute() + 1;
  return cache[device] - 1;
}

int SmCount(int device) {
  static int cache[kMaxCachedDevices] = {};
  return CachedPerDevice(cache, device, [&] {
    int count = 0;
    if (cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || count <= 0) {
      count = 1;  // still exact: a pool of kBlocksPerSm workers
    }
    return count;
  });
}

// The workspace: the queue's counters, then an overflow slice for each block.
struct WorkspacePlan {
  int parts = 1;  // > 1: split mode, a cluster of `parts` blocks a row
  int64_t grid = 0;
  int slice_entries = 0;
};

constexpr size_t kCounterBytes = 16;  // queue_next (8) + workers_done (4), padded; the slices start
                                      // at kFilteredHeaderBytes

WorkspacePlan PlanWorkspace(int64_t rows, int parts, int pool, size_t workspace_bytes) {
  WorkspacePlan plan;
  plan.parts = parts;
  plan.grid = parts > 1 ? rows * parts : (rows < pool ? rows : pool);
  const size_t free_bytes = workspace_bytes > kFilteredHeaderBytes ? workspace_bytes - kFilteredHeaderBytes : 0;
  const size_t entries = free_bytes / (plan.grid * sizeof(uint2));
  plan.slice_entries = static_cast<int>(entries < kFilteredSliceEntries ? entries : kFilteredSliceEntries);
  return plan;
}

// The cluster's launch configuration for `parts` blocks a row.
cudaLaunchConfig_t ClusterConfig(int64_t grid, int parts, size_t shared_bytes, cudaStream_t stream,
                                 cudaLaunchAttribute& attribute) {
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = static_cast<unsigned int>(parts);
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned int>(grid));
  config.blockDim = dim3(kThreadsPerBlock);
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return config;
}

// The dynamic shared memory of a split block that has its SM alone: just over half an SM's
// (cached; sizeof(SharedStorage) where the device cannot give a block that much).
int SpreadSharedBytes(int device) {
  static int cache[kMaxCachedDevices] = {};
  return CachedPerDevice(cache, device, [&] {
    int per_sm = 0;
    int per_block = 0;
    const int own = static_cast<int>(sizeof(SharedStorage));
    if (cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
      cudaGetLastError();
      return own;
    }
    const int half_and_more = per_sm / 2 + 16;
    return half_and_more > own && half_and_more <= per_block ? half_and_more : own;
  });
}

// The dynamic shared memory of a split block (spread: one block an SM).
int SplitSharedBytes(int device, bool spread) {
  return spread ? SpreadSharedBytes(device) : static_cast<int>(sizeof(SharedStorage));
}

// How many clusters of `parts` blocks the device holds at once (cached; 0: none).
int ResidentClusters(int device, int parts, bool spread) {
  static int cache[2][kMaxClusterParts + 1][kMaxCachedDevices] = {};
  return CachedPerDevice(cache[spread][parts], device, [&] {
    cudaLaunchAttribute attribute;
    const cudaLaunchConfig_t config =
        ClusterConfig(parts, parts, SplitSharedBytes(device, spread), nullptr, attribute);
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, TopkFilteredKernel<true>, &config) != cudaSuccess) {
      cudaGetLastError();  // a size this device cannot launch: not used
      clusters = 0;
    }
    return clusters;
  });
}

// The most parts a split row may have on `device`: 1 (no split mode) before sm_90, whose thread
// block clusters it needs; the portable cluster size where the non-portable one is refused.
int MaxSplitParts(int device) {
  static int cache[kMaxCachedDevices] = {};
  return CachedPerDevice(cache, device, [&] {
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess || major < 9) {
      return 1;
    }
    if (cudaFuncSetAttribute(TopkFilteredKernel<true>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) !=
        cudaSuccess) {
      cudaGetLastError();  // not sticky: clear it so that the launch does not report it
      return kPortableClusterParts;
    }
    return kMaxClusterParts;
  });
}

// Split mode's parts a row: the most, up to the row's useful parts, whose clusters for all the
// rows are resident at once (a second wave would double the launch); 1: none (queue mode).
int SplitParts(int device, int64_t rows, int64_t useful_parts, bool spread) {
  const int limit = MaxSplitParts(device);
  const int most = static_cast<int>(useful_parts < limit ? useful_parts : limit);
  for (int parts = most; parts > 1; --parts) {
    if (ResidentClusters(device, parts, spread) >= rows) return parts;
  }
  return 1;
}

}  // namespace

cudaError_t LaunchTopkFiltered(const TopkProblem& problem, void* workspace, size_t workspace_bytes,
                               cudaStream_t stream) {
  if (problem.rows <= 0) return cudaSuccess;
  if (problem.k < 1 || problem.k > kMaxK || problem.width < 1 || problem.width > INT_MAX ||
      problem.rows_per_group < 1 || problem.scores == nullptr || problem.out == nullptr ||
      workspace == nullptr || workspace_bytes < kFilteredMinWorkspaceBytes) {
    return cudaErrorInvalidValue;
  }
  int device = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) return status;
  const int sm_pool = kBlocksPerSm * SmCount(device);
  const int pool = sm_pool < kMaxPoolBlocks ? sm_pool : kMaxPoolBlocks;
  const size_t shared_bytes = sizeof(SharedStorage);
  status = cudaFuncSetAttribute(TopkFilteredKernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(shared_bytes));
  if (status != cudaSuccess) return status;
  status = cudaFuncSetAttribute(TopkFilteredKernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                SpreadSharedBytes(device));
  if (status != cudaSuccess) return status;

  // Few rows: a cluster of blocks a row, if the workspace gives every part a useful slice (rows
  // of at most kSharedCandidates columns are done by one block either way).
  WorkspacePlan plan = PlanWorkspace(problem.rows, 1, pool, workspace_bytes);
  bool spread = false;
  if (problem.rows * 2 <= pool && problem.width > kSharedCandidates) {
    const int64_t useful_parts = FilteredUsefulParts(problem.width);
    spread = problem.rows * problem.width * static_cast<int64_t>(sizeof(float)) <=
             kSpreadBytesPerSm * SmCount(device);
    int parts = spread ? SplitParts(device, problem.rows, useful_parts, true) : 1;
    if (parts <= 1) {  // too many rows to spread them
      spread = false;
      parts = SplitParts(device, problem.rows, useful_parts, false);
    }
    if (parts > 1) {
      const WorkspacePlan split = PlanWorkspace(problem.rows, parts, pool, workspace_bytes);
      if (split.slice_entries >= kMinSplitSliceEntries) plan = split;
    }
  }

  unsigned char* base = static_cast<unsigned char*>(workspace);
  FilteredLaunch launch;
  launch.problem = problem;
  launch.queue_next = reinterpret_cast<unsigned long long*>(base);
  launch.workers_done = reinterpret_cast<unsigned int*>(base + sizeof(unsigned long long));
  launch.slices = reinterpret_cast<uint2*>(base + kFilteredHeaderBytes);
  launch.slice_entries = plan.slice_entries;

  if (plan.parts > 1) {  // split mode needs no counters
    cudaLaunchAttribute attribute;
    const cudaLaunchConfig_t config =
        ClusterConfig(plan.grid, plan.parts, SplitSharedBytes(device, spread), stream, attribute);
    status = cudaLaunchKernelEx(&config, TopkFilteredKernel<true>, launch);
    return status != cudaSuccess ? status : cudaGetLastError();
  }
  // The workspace is an XLA output buffer: garbage on entry. The queue's counters need zeros.
  status = cudaMemsetAsync(workspace, 0, kCounterBytes, stream);
  if (status != cudaSuccess) return status;
  TopkFilteredKernel<false><<<static_cast<unsigned int>(plan.grid), kThreadsPerBlock, shared_bytes, stream>>>(launch);
  return cudaGetLastError();
}

}  // namespace jax_topk
