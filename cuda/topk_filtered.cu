// topk_filtered: exact top-k of long float32 rows (SPEC section 2). Per row, a regular 1/s sample
// (row-dependent phase) proposes a 22-bit cutoff on the ordered key keeping ~2k candidates, and a
// deeper 11-bit secondary cutoff. One ordered pass over the row keeps every non-NaN key >= cutoff,
// in column order, in shared memory then a per-worker workspace slice; 11+11+10-bit radix digits
// over the kept keys find the k-th key and its tie quota; an ordered select writes the winners in
// column order (or by key through a stable block radix sort). Traffic: <= 1/8 (1/32 at 128K) of the
// row for the sample + one read. Underfill retries the secondary cutoff; still short, or more kept
// than fits, takes the exact route: 3 digit passes + 1 select pass over the row. Limits: width <
// 2^31, k <= kMaxK. Few rows: each row is split over blocks (KV-split), the last to arrive merges.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <type_traits>
#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_scan.cuh>

#include "topk_common.h"
#include "topk_cuda.h"
#include "topk_filtered_workspace.h"
#include "topk_problem.h"

namespace jax_topk {
namespace {

constexpr int kThreadsPerBlock = 512;
constexpr int kWarpSize = 32;
constexpr int kWarpsPerBlock = kThreadsPerBlock / kWarpSize;
constexpr int kBlocksPerSm = 2;
constexpr int kMaxPoolBlocks = 480;  // keeps the kernel's counters inside kFilteredHeaderBytes

// Tiles of kChunks 16-byte chunks per thread (see ChunkStart). Streaming passes hold 16 floats
// per thread in flight; the final tie-quota select, which carries more per item, holds 8.
constexpr int kChunkElems = 4;
constexpr int kStreamChunks = 4;
constexpr int kSelectChunks = 2;

// Candidates kept in shared memory; a multiple of every tile so no tile straddles shared and global.
constexpr int kSharedCandidates = 8192;
static_assert(kSharedCandidates % (kThreadsPerBlock * kChunkElems * kStreamChunks) == 0 &&
                  kSharedCandidates % (kThreadsPerBlock * kChunkElems * kSelectChunks) == 0,
              "a tile must not straddle shared and global");

// Radix digits of the 32-bit ordered key, most significant first: 11 + 11 + 10 bits.
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
constexpr int kRetention = 2;
constexpr int kRankSlack = 8;
constexpr int kSecondaryFactor = 2;

// The k results, sorted by key when `sorted`: kMaxK items over the block.
constexpr int kSortItemsPerThread = kMaxK / kThreadsPerBlock;
static_assert(kSortItemsPerThread * kThreadsPerBlock == kMaxK, "sort covers kMaxK");

constexpr int kMaxParts = 64;
constexpr int kMinSplitSliceEntries = 1024;  // below this a split part would overflow too often

// Counts of one tile, one 16-bit field per chunk (a field sums to <= 4 * kThreadsPerBlock).
struct PackedCounts {
  uint64_t greater;
  uint64_t equal;
};
constexpr uint64_t kFieldPrefixMul = 0x0001000100010001ull;  // x * this: field c = sum of fields <= c
__device__ __forceinline__ int Field(uint64_t packed, int c) {
  return static_cast<int>((packed >> (16 * c)) & 0xFFFFu);
}

using BinScan = cub::BlockScan<uint32_t, kThreadsPerBlock>;
using ResultSort = cub::BlockRadixSort<uint32_t, kThreadsPerBlock, kSortItemsPerThread, int32_t>;

// The row a block works on. Kept in shared memory so that the passes, which need all the
// registers, do not carry it.
struct Cutoffs {
  uint32_t primary;    // 22-bit: keeps ~kRetention * k expected candidates
  uint32_t secondary;  // 11-bit, <= primary: a deeper band for an underfilled primary
};
struct RowJob {
  int64_t row;
  int64_t length;  // -1: a masked row
  Cutoffs cutoffs;
  int64_t part_begin;  // split mode: this block's columns of the row
  int64_t part_end;
  int parts;           // split mode: the blocks that share the row
};

struct CandidateArrays {
  uint32_t key[kSharedCandidates];
  int32_t col[kSharedCandidates];
};

struct SharedStorage {
  union {
    CandidateArrays candidates;  // the sample's keys first, then the kept candidates
    ResultSort::TempStorage sort;
  } region;
  uint32_t hist[kDigitBins + 1];  // a digit histogram, then its suffix sums; [kDigitBins] == 0
  uint32_t staging_key[kMaxK];     // the selected items, in column order
  int32_t staging_col[kMaxK];
  uint64_t warp_counts[kWarpsPerBlock];  // per-warp byte-packed totals of a tile scan
  BinScan::TempStorage bin_scan;
  uint32_t found_bin;
  uint32_t found_above;
  RowJob job;
  int sample_count;
  int flag;
  unsigned long long next_row;
};

// ---------------------------------------------------------------------------------------------
// Tiles: where items come from. Both sources hand out tiles in column order: with kChunks
// chunks per thread, chunk c of thread t starts at 4 * (t + kThreadsPerBlock * c) in the tile,
// so each warp load covers 512 contiguous bytes. An invalid item (NaN, past the end) has its
// bit clear in `valid`. A tile's keys feed the counts; an admitted item's key and column are
// read back from the source after the block scan (few items, cache hits), so that no keys stay
// live across the scan.
constexpr int kChunkStride = kChunkElems * kThreadsPerBlock;  // between a thread's chunks
__device__ __forceinline__ int64_t ChunkStart(int64_t base, int c) {
  return base + kChunkElems * threadIdx.x + kChunkStride * c;
}

template <int kChunks>
struct RowTile {
  uint32_t key[kChunks * kChunkElems];
  int32_t first;  // chunk c starts at column first + c * kChunkStride
  uint32_t valid;
  const float* row;
  __device__ __forceinline__ int32_t Col(int item) const {
    return first + (item / kChunkElems) * kChunkStride + item % kChunkElems;
  }
  __device__ __forceinline__ uint32_t KeyAgain(int item) const {
    return OrderedKeyF32(__float_as_uint(__ldg(row + Col(item))));
  }
};

// Columns [base, end) of a row; kVectorLoads needs row + base 16-byte aligned.
template <int kChunks, bool kVectorLoads>
__device__ __forceinline__ RowTile<kChunks> LoadRowTile(const float* row, int64_t base, int64_t end) {
  const float kMissing = __int_as_float(0x7FFFFFFF);  // a NaN: never selected
  float4 values[kChunks];
  RowTile<kChunks> tile;
  tile.row = row;
  tile.first = static_cast<int32_t>(ChunkStart(base, 0));
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {  // all loads first, for memory-level parallelism
    const int64_t first = ChunkStart(base, c);
    float4& v = values[c];
    v = make_float4(kMissing, kMissing, kMissing, kMissing);
    if (kVectorLoads && first + kChunkElems <= end) {
      v = __ldg(reinterpret_cast<const float4*>(row + first));
    } else {
      if (first + 0 < end) v.x = __ldg(row + first + 0);
      if (first + 1 < end) v.y = __ldg(row + first + 1);
      if (first + 2 < end) v.z = __ldg(row + first + 2);
      if (first + 3 < end) v.w = __ldg(row + first + 3);
    }
  }
  tile.valid = 0;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const float lanes[kChunkElems] = {values[c].x, values[c].y, values[c].z, values[c].w};
#pragma unroll
    for (int e = 0; e < kChunkElems; ++e) {
      const uint32_t bits = __float_as_uint(lanes[e]);
      const int item = c * kChunkElems + e;
      tile.key[item] = OrderedKeyF32(bits);
      if (!IsNanF32(bits)) tile.valid |= 1u << item;
    }
  }
  return tile;
}

// Columns [begin, end) of a row in global memory: a scalar head up to the first 16-byte
// boundary, then aligned tiles of float4 loads (the last one bounds-checked per chunk).
struct RowSource {
  const float* row;
  int64_t begin;
  int64_t end;

  template <int kChunks, class Visit>
  __device__ __forceinline__ void ForEachTile(Visit&& visit) const {
    const uintptr_t address = reinterpret_cast<uintptr_t>(row + begin);
    const int64_t head = static_cast<int64_t>(((16 - (address & 15)) & 15) / sizeof(float));
    const int64_t body = begin + head < end ? begin + head : end;
    if (body > begin) visit(LoadRowTile<kChunks, false>(row, begin, body));
    for (int64_t base = body; base < end; base += kThreadsPerBlock * kChunkElems * kChunks) {
      visit(LoadRowTile<kChunks, true>(row, base, end));
    }
  }
};

// `count` (column, key) entries kept in column order: the first `shared_capacity` in shared
// memory, the rest in a global slice written by this block (or merged in by the finisher).
struct BufferSource {
  const uint32_t* shared_key;
  const int32_t* shared_col;
  int shared_capacity;
  const uint2* global;
  int count;

  __device__ __forceinline__ uint32_t KeyAt(int entry) const {
    return entry < shared_capacity ? shared_key[entry] : global[entry - shared_capacity].y;
  }
  __device__ __forceinline__ int32_t ColAt(int entry) const {
    return static_cast<int32_t>(entry < shared_capacity ? shared_col[entry]
                                                        : global[entry - shared_capacity].x);
  }

  template <int kChunks>
  struct Tile {
    uint32_t key[kChunks * kChunkElems];
    int32_t first;  // chunk c starts at entry first + c * kChunkStride
    uint32_t valid;
    const BufferSource* source;
    __device__ __forceinline__ int Entry(int item) const {
      return first + (item / kChunkElems) * kChunkStride + item % kChunkElems;
    }
    __device__ __forceinline__ int32_t Col(int item) const { return source->ColAt(Entry(item)); }
    __device__ __forceinline__ uint32_t KeyAgain(int item) const { return source->KeyAt(Entry(item)); }
  };

  template <int kChunks, class Visit>
  __device__ __forceinline__ void ForEachTile(Visit&& visit) const {
    for (int base = 0; base < count; base += kThreadsPerBlock * kChunkElems * kChunks) {
      Tile<kChunks> tile;
      tile.valid = 0;
      tile.source = this;
      tile.first = static_cast<int32_t>(ChunkStart(base, 0));
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
#pragma unroll
        for (int e = 0; e < kChunkElems; ++e) {
          const int item = c * kChunkElems + e;
          const int entry = tile.Entry(item);
          tile.key[item] = entry < count ? KeyAt(entry) : 0;
          if (entry < count) tile.valid |= 1u << item;
        }
      }
      visit(tile);
    }
  }
};

// Where admitted items go: position p < shared_capacity in the shared staging arrays (the
// result) or candidate arrays, the next global_capacity positions in a global slice; anything
// further is counted but dropped.
struct CandidateSink {
  bool to_staging;
  int shared_capacity;
  uint2* global;
  int global_capacity;

  __device__ __forceinline__ int Capacity() const { return shared_capacity + global_capacity; }
  __device__ __forceinline__ void Put(SharedStorage& s, int position, int32_t col, uint32_t key) const {
    if (position < shared_capacity) {
      (to_staging ? s.staging_key : s.region.candidates.key)[position] = key;
      (to_staging ? s.staging_col : s.region.candidates.col)[position] = col;
    } else if (position - shared_capacity < global_capacity) {
      global[position - shared_capacity] = make_uint2(static_cast<uint32_t>(col), key);
    }
  }
};

__device__ __forceinline__ BufferSource KeptCandidates(const SharedStorage& s, const CandidateSink& sink, int count) {
  return {s.region.candidates.key, s.region.candidates.col, sink.shared_capacity, sink.global, count};
}

// ---------------------------------------------------------------------------------------------
// The block-wide steps. Every function is called by all threads with block-uniform arguments.

// Block-wide exclusive prefix of per-thread chunk counts. A thread's counts (<= 4 each) go
// through the warp scan as bytes of a word: bytes 0-3 greater items of chunks 0-3, bytes 4-7
// (only with a 64-bit Word) equal items; a warp's sums stay <= 128. Across warps they are
// widened to 16-bit fields (a block's sums stay <= 2048). `total` gets the block's sums.
__device__ __forceinline__ uint64_t WidenBytes(uint32_t bytes) {
  const uint64_t x = bytes;
  return (x & 0xFFull) | ((x & 0xFF00ull) << 8) | ((x & 0xFF0000ull) << 16) | ((x & 0xFF000000ull) << 24);
}
template <class Word>
__device__ __forceinline__ PackedCounts ExclusiveScanCounts(SharedStorage& s, Word mine, PackedCounts& total) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  Word inclusive = mine;
#pragma unroll
  for (int offset = 1; offset < kWarpSize; offset *= 2) {
    const Word other = __shfl_up_sync(0xFFFFFFFFu, inclusive, offset);
    if (lane >= offset) inclusive += other;
  }
  if (lane == kWarpSize - 1) s.warp_counts[warp] = inclusive;
  __syncthreads();
  const uint64_t in_warp = inclusive - mine;
  PackedCounts before{WidenBytes(static_cast<uint32_t>(in_warp)), WidenBytes(static_cast<uint32_t>(in_warp >> 32))};
  total = PackedCounts{0, 0};
#pragma unroll
  for (int w = 0; w < kWarpsPerBlock; ++w) {
    const uint64_t counts = s.warp_counts[w];
    const uint64_t greater = WidenBytes(static_cast<uint32_t>(counts));
    const uint64_t equal = sizeof(Word) == 8 ? WidenBytes(static_cast<uint32_t>(counts >> 32)) : 0;
    if (w < warp) {
      before.greater += greater;
      before.equal += equal;
    }
    total.greater += greater;
    total.equal += equal;
  }
  return before;
}

// Admits items in column order into the sink, each at its rank among the admitted; returns the
// number admitted (also past the sink's capacity: the caller detects overflow from it).
// kTieQuota == false: every valid item with key >= threshold (the filtering pass).
// kTieQuota == true: every key > threshold and the first tie_quota keys == threshold (the result).
template <bool kTieQuota, class Source>
__device__ __forceinline__ int OrderedSelect(SharedStorage& s, const Source& source, uint32_t threshold,
                                             int tie_quota, const CandidateSink& sink) {
  using Word = typename std::conditional<kTieQuota, uint64_t, uint32_t>::type;
  constexpr int kChunks = kTieQuota ? kSelectChunks : kStreamChunks;
  int greater_before = 0;  // block-uniform totals of the tiles already visited
  int equal_before = 0;
  source.template ForEachTile<kChunks>([&](const auto& tile) {
    uint32_t greater_mask = 0;  // bit `item`: admitted outright
    uint32_t equal_mask = 0;    // bit `item`: a tie, admitted while the quota lasts
#pragma unroll
    for (int item = 0; item < kChunks * kChunkElems; ++item) {
      const bool valid = (tile.valid >> item) & 1u;
      const uint32_t key = tile.key[item];
      greater_mask |= static_cast<uint32_t>(valid && (kTieQuota ? key > threshold : key >= threshold)) << item;
      if (kTieQuota) equal_mask |= static_cast<uint32_t>(valid && key == threshold) << item;
    }
    Word mine = 0;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const uint32_t chunk_bits = (1u << kChunkElems) - 1u;
      mine |= static_cast<Word>(__popc((greater_mask >> (c * kChunkElems)) & chunk_bits)) << (8 * c);
      if (kTieQuota) {
        mine |= static_cast<Word>(__popc((equal_mask >> (c * kChunkElems)) & chunk_bits))
                << ((32 + 8 * c) % (8 * sizeof(Word)));
      }
    }
    PackedCounts total;
    const PackedCounts before = ExclusiveScanCounts<Word>(s, mine, total);
    // Field c: items of all earlier chunks of the tile, plus this chunk's items in earlier threads.
    const uint64_t greater_base = ((total.greater * kFieldPrefixMul) << 16) + before.greater;
    const uint64_t equal_base = ((total.equal * kFieldPrefixMul) << 16) + before.equal;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      int greater = greater_before + Field(greater_base, c);
      int equal = equal_before + Field(equal_base, c);
#pragma unroll
      for (int e = 0; e < kChunkElems; ++e) {
        const int item = c * kChunkElems + e;
        const bool is_greater = (greater_mask >> item) & 1u;
        const bool is_equal = (equal_mask >> item) & 1u;
        if (is_greater || (is_equal && equal < tie_quota)) {
          const int position = is_greater ? greater + min(equal, tie_quota) : greater + equal;
          sink.Put(s, position, tile.Col(item), tile.KeyAgain(item));
        }
        greater += is_greater;
        equal += is_equal;
      }
    }
    greater_before += static_cast<int>((total.greater * kFieldPrefixMul) >> 48);
    equal_before += static_cast<int>((total.equal * kFieldPrefixMul) >> 48);
    __syncthreads();  // warp_counts is reused by the next tile
  });
  return greater_before + min(equal_before, tie_quota);
}

// Histogram of digit (key >> shift) & digit_mask over the valid items whose key matches
// `prefix` on `prefix_mask`. Equal digits of a warp are added once (rows of equal values
// would otherwise serialise on one shared-memory address).
template <class Source>
__device__ __forceinline__ void DigitHistogram(SharedStorage& s, const Source& source, uint32_t prefix,
                               uint32_t prefix_mask, int shift, uint32_t digit_mask) {
  for (int b = threadIdx.x; b <= kDigitBins; b += kThreadsPerBlock) s.hist[b] = 0;
  __syncthreads();
  const int lane = threadIdx.x % kWarpSize;
  source.template ForEachTile<kStreamChunks>([&](const auto& tile) {
#pragma unroll
    for (int item = 0; item < kStreamChunks * kChunkElems; ++item) {
      const uint32_t key = tile.key[item];
      const bool counted = ((tile.valid >> item) & 1u) && (key & prefix_mask) == prefix;
      if (!__any_sync(0xFFFFFFFFu, counted)) continue;
      const uint32_t digit = counted ? (key >> shift) & digit_mask : 0xFFFFFFFFu;
      const uint32_t peers = __match_any_sync(0xFFFFFFFFu, digit);
      if (counted && lane == __ffs(peers) - 1) atomicAdd(&s.hist[digit], __popc(peers));
    }
  });
  __syncthreads();
}

// hist[b] becomes the number of items in bins >= b.
__device__ __forceinline__ void SuffixSumsInPlace(SharedStorage& s) {
  uint32_t counts[kBinsPerThread];
  uint32_t mine = 0;
#pragma unroll
  for (int j = 0; j < kBinsPerThread; ++j) {  // thread 0 owns the top bins
    counts[j] = s.hist[kDigitBins - 1 - (threadIdx.x * kBinsPerThread + j)];
    mine += counts[j];
  }
  uint32_t above;
  BinScan(s.bin_scan).ExclusiveSum(mine, above);
#pragma unroll
  for (int j = 0; j < kBinsPerThread; ++j) {
    above += counts[j];
    s.hist[kDigitBins - 1 - (threadIdx.x * kBinsPerThread + j)] = above;
  }
  __syncthreads();
}

// After SuffixSumsInPlace: the bin holding the rank-th largest item (1 <= rank <= hist[0]),
// and how many items lie in the bins above it.
struct RankBin {
  uint32_t bin;
  uint32_t above;
};
__device__ __forceinline__ RankBin BinForRank(SharedStorage& s, uint32_t rank) {
#pragma unroll
  for (int j = 0; j < kBinsPerThread; ++j) {
    const int b = threadIdx.x * kBinsPerThread + j;
    if (s.hist[b] >= rank && s.hist[b + 1] < rank) {
      s.found_bin = b;
      s.found_above = s.hist[b + 1];
    }
  }
  __syncthreads();
  const RankBin found{s.found_bin, s.found_above};
  __syncthreads();  // found_* are rewritten by the next call
  return found;
}

// The k-th largest key of a source and how many items equal to it are selected (ties go to
// the lowest columns). Fewer than k valid items: key 0 (below every non-NaN key), quota 0.
struct KthKey {
  uint32_t key;
  int tie_quota;
};
template <class Source>
__device__ __forceinline__ KthKey FindKthKey(SharedStorage& s, const Source& source, int k) {
  uint32_t prefix = 0;
  uint32_t prefix_mask = 0;
  uint32_t rank = k;
  for (int digit = 0; digit < kNumDigits; ++digit) {
    const int shift = DigitShift(digit);
    DigitHistogram(s, source, prefix, prefix_mask, shift, DigitMask(digit));
    SuffixSumsInPlace(s);
    if (digit == 0 && s.hist[0] <= static_cast<uint32_t>(k)) return {0, 0};
    const RankBin found = BinForRank(s, rank);
    rank -= found.above;  // the groups above are committed; the boundary group carries on
    prefix |= found.bin << shift;
    prefix_mask |= DigitMask(digit) << shift;
  }
  return {prefix, static_cast<int>(rank)};
}

// The exact top-k of a source into staging, in column order. Returns how many (min(k, valid)).
template <class Source>
__device__ __forceinline__ int SelectIntoStaging(SharedStorage& s, const Source& source, int k) {
  const KthKey kth = FindKthKey(s, source, k);
  const CandidateSink staging{true, kMaxK, nullptr, 0};
  return OrderedSelect<true>(s, source, kth.key, kth.tie_quota, staging);
}

// ---------------------------------------------------------------------------------------------
// The sample: cutoffs that keep about kRetention * k candidates of the row.

// Compacts the sampled non-NaN keys into the candidate key array; returns the sampled positions.
__device__ __forceinline__ int64_t GatherSample(SharedStorage& s, const float* row, int64_t length, int64_t row_index) {
  const int64_t lines = (length + kSampleLineElems - 1) / kSampleLineElems;
  const int64_t wanted_stride = (lines + kSampleLines - 1) / kSampleLines;
  const int64_t stride = wanted_stride > kMinSampleStride ? wanted_stride : kMinSampleStride;
  const int64_t phase = row_index % stride;  // consecutive rows sample different lines
  const int64_t sampled_lines = (lines - phase + stride - 1) / stride;
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  if (threadIdx.x == 0) s.sample_count = 0;
  __syncthreads();
  float values[kSampleLinesPerWarp];
#pragma unroll
  for (int j = 0; j < kSampleLinesPerWarp; ++j) {  // all loads first: they are latency-bound
    const int64_t line = warp + kWarpsPerBlock * j;
    const int64_t col = (phase + line * stride) * kSampleLineElems + lane;
    values[j] = line < sampled_lines && col < length ? __ldg(row + col) : __int_as_float(0x7FFFFFFF);
  }
#pragma unroll
  for (int j = 0; j < kSampleLinesPerWarp; ++j) {
    const uint32_t bits = __float_as_uint(values[j]);
    const bool keep = !IsNanF32(bits);
    const uint32_t kept = __ballot_sync(0xFFFFFFFFu, keep);
    int base = 0;
    if (lane == 0 && kept != 0) base = atomicAdd(&s.sample_count, __popc(kept));
    base = __shfl_sync(0xFFFFFFFFu, base, 0);
    if (keep) s.region.candidates.key[base + __popc(kept & ((1u << lane) - 1))] = OrderedKeyF32(bits);
  }
  __syncthreads();
  return sampled_lines * kSampleLineElems;
}

__device__ __forceinline__ Cutoffs SampleCutoffs(SharedStorage& s, const float* row, int64_t length,
                                 int64_t row_index, int k) {
  if (length <= kSharedCandidates) return {0, 0};  // short rows are kept whole
  const int64_t positions = GatherSample(s, row, length, row_index);
  const BufferSource sample{s.region.candidates.key, s.region.candidates.col, kSharedCandidates,
                            nullptr, s.sample_count};
  // Sampled rank whose key leaves ~kRetention * k row items above it (positions <= 4096).
  const int64_t primary_rank =
      (kRetention * static_cast<int64_t>(k) * positions + length - 1) / length + kRankSlack;
  const int64_t secondary_rank = kSecondaryFactor * primary_rank + kRankSlack;
  DigitHistogram(s, sample, 0, 0, DigitShift(0), DigitMask(0));
  SuffixSumsInPlace(s);
  const int64_t sampled = s.hist[0];
  if (primary_rank > sampled) return {0, 0};
  const RankBin coarse = BinForRank(s, static_cast<uint32_t>(primary_rank));
  const uint32_t secondary =
      secondary_rank > sampled ? 0 : BinForRank(s, static_cast<uint32_t>(secondary_rank)).bin << DigitShift(0);
  // Refine the primary within its coarse bin with the next 11 bits of the sampled keys.
  const uint32_t coarse_prefix = coarse.bin << DigitShift(0);
  DigitHistogram(s, sample, coarse_prefix, DigitMask(0) << DigitShift(0), DigitShift(1), DigitMask(1));
  SuffixSumsInPlace(s);
  const RankBin fine = BinForRank(s, static_cast<uint32_t>(primary_rank) - coarse.above);
  return {coarse_prefix | (fine.bin << DigitShift(1)), secondary};
}

// ---------------------------------------------------------------------------------------------
// One row.
struct FilteredLaunch {
  TopkProblem problem;
  unsigned long long* queue_next;  // the next row a worker takes (queue mode)
  unsigned int* workers_done;      // the last worker to finish zeroes the counters
  unsigned int* parts_arrived;     // [rows], split mode
  int* part_kept;                  // [grid], split mode: candidates each part kept
  uint2* slices;                   // [grid][slice_entries]
  int slice_entries;
  int parts;                       // > 1: split mode
};

// The row's valid length, or -1 when the row is masked out by num_valid_rows.
__device__ __forceinline__ int64_t RowLength(const TopkProblem& problem, int64_t row) {
  if (!RowIsValid(row, problem.num_valid_rows, problem.rows_per_group)) return -1;
  if (problem.lengths == nullptr) return problem.width;
  return ClampLength(problem.lengths[row], problem.width);
}

// This block's overflow slice: its own, so concurrent blocks never share one.
__device__ __forceinline__ uint2* WorkerSlice(const FilteredLaunch& launch) {
  return launch.slices + static_cast<int64_t>(blockIdx.x) * launch.slice_entries;
}

// Starts a row: publishes its index and length (-1: masked) in shared memory.
__device__ __forceinline__ void StartJob(SharedStorage& s, const TopkProblem& problem, int64_t row) {
  if (threadIdx.x == 0) {
    s.job.row = row;
    s.job.length = RowLength(problem, row);
  }
  __syncthreads();
}

__device__ __forceinline__ const float* JobScores(const SharedStorage& s, const TopkProblem& problem) {
  return static_cast<const float*>(problem.scores) + s.job.row * problem.width;
}

__device__ __forceinline__ void SampleJobCutoffs(SharedStorage& s, const TopkProblem& problem) {
  const Cutoffs cutoffs = SampleCutoffs(s, JobScores(s, problem), s.job.length, s.job.row, problem.k);
  if (threadIdx.x == 0) s.job.cutoffs = cutoffs;
  __syncthreads();
}

// Selects the job's row into staging: the primary cutoff (unless known short), the secondary,
// then the exact route over the row. Kept candidates go to shared memory, then to the slice.
__device__ __forceinline__ int SelectJobRow(SharedStorage& s, const FilteredLaunch& launch,
                                            bool primary_known_short) {
  const int k = launch.problem.k;
  const CandidateSink keep{false, kSharedCandidates, WorkerSlice(launch), launch.slice_entries};
  for (int attempt = primary_known_short ? 1 : 0; attempt < 2; ++attempt) {
    const uint32_t cutoff = attempt == 0 ? s.job.cutoffs.primary : s.job.cutoffs.secondary;
    if (attempt == 1 && cutoff == s.job.cutoffs.primary) break;  // same band: known short
    const RowSource whole_row{JobScores(s, launch.problem), 0, s.job.length};
    const int kept = OrderedSelect<false>(s, whole_row, cutoff, 0, keep);
    if (kept > keep.Capacity()) break;  // overflow: the exact route re-reads the row
    if (kept >= k || cutoff == 0) return SelectIntoStaging(s, KeptCandidates(s, keep, kept), k);
  }
  const RowSource whole_row{JobScores(s, launch.problem), 0, s.job.length};
  return SelectIntoStaging(s, whole_row, k);
}

// Writes the m staged results (then -1s), by key when sorted, page-transformed, coalesced.
__device__ __forceinline__ void WriteRow(SharedStorage& s, const TopkProblem& problem, int64_t row, int m) {
  const int k = problem.k;
  int32_t* out = problem.out + row * k;
  const int32_t* page_row = nullptr;
  if (problem.page_table != nullptr && m > 0) {
    page_row = problem.page_table +
               TableRowFor(row, problem.table_rows, problem.table_count) * problem.pages;
  }
  if (problem.sorted && m > 1) {
    uint32_t keys[kSortItemsPerThread];
    int32_t cols[kSortItemsPerThread];
#pragma unroll
    for (int j = 0; j < kSortItemsPerThread; ++j) {  // column order in, blocked: ties stay stable
      const int slot = threadIdx.x * kSortItemsPerThread + j;
      keys[j] = slot < m ? s.staging_key[slot] : 0;  // 0 is below every non-NaN key
      cols[j] = slot < m ? s.staging_col[slot] : kEmptySlot;
    }
    ResultSort(s.region.sort).SortDescendingBlockedToStriped(keys, cols, 0, 32);
#pragma unroll
    for (int j = 0; j < kSortItemsPerThread; ++j) {
      const int slot = threadIdx.x + kThreadsPerBlock * j;
      if (slot < k) {
        out[slot] = cols[j] == kEmptySlot ? kEmptySlot
                                          : PageTransform(cols[j], page_row, problem.log2_page_size);
      }
    }
  } else {
    for (int slot = threadIdx.x; slot < k; slot += kThreadsPerBlock) {
      out[slot] = slot < m ? PageTransform(s.staging_col[slot], page_row, problem.log2_page_size)
                           : kEmptySlot;
    }
  }
  __syncthreads();  // staging and the sort storage are reused by the next row
}

// A whole row by one block.
__device__ __forceinline__ void RunWholeRow(SharedStorage& s, const FilteredLaunch& launch, int64_t row) {
  StartJob(s, launch.problem, row);
  int m = 0;
  if (s.job.length >= 0) {
    SampleJobCutoffs(s, launch.problem);
    m = SelectJobRow(s, launch, false);
  }
  WriteRow(s, launch.problem, s.job.row, m);
}

// Split mode: block `item` keeps the candidates of part `item % parts` of row `item / parts`
// in its slice; the last part of the row to arrive merges them (part order is column order)
// when they settle the row, or else does the row whole. Masked and short rows: part 0 alone.
__device__ __forceinline__ bool CollectSplitPart(SharedStorage& s, const FilteredLaunch& launch);
__device__ __forceinline__ int MergeSplitParts(SharedStorage& s, const FilteredLaunch& launch);

__device__ __forceinline__ void RunSplitPart(SharedStorage& s, const FilteredLaunch& launch, int64_t item) {
  StartJob(s, launch.problem, item / launch.parts);
  const int part = static_cast<int>(item % launch.parts);
  const int64_t useful_parts = (s.job.length + kFilteredSplitPartColumns - 1) / kFilteredSplitPartColumns;
  const int parts = static_cast<int>(useful_parts < launch.parts ? useful_parts : launch.parts);
  if (part >= (parts > 1 ? parts : 1)) return;
  int m = 0;
  if (s.job.length >= 0) {
    if (threadIdx.x == 0) s.job.parts = parts > 1 ? parts : 1;
    SampleJobCutoffs(s, launch.problem);  // identical in every part; syncs
    m = -1;
    if (s.job.parts > 1) {
      if (!CollectSplitPart(s, launch)) return;  // another part finishes the row
      m = MergeSplitParts(s, launch);
    }
    if (m < 0) m = SelectJobRow(s, launch, s.job.parts > 1 && s.flag);
  }
  WriteRow(s, launch.problem, s.job.row, m);
  if (threadIdx.x == 0 && s.job.length >= 0 && s.job.parts > 1) {
    launch.parts_arrived[s.job.row] = 0;  // leave the counters zeroed
  }
}

// Keeps this part's candidates at the primary cutoff in the slice and publishes their count.
// Returns whether this block is the last part of the row to arrive.
__device__ __forceinline__ bool CollectSplitPart(SharedStorage& s, const FilteredLaunch& launch) {
  // Part boundaries are rounded down to 32 columns so that parts keep the row's alignment.
  const int part = static_cast<int>(blockIdx.x % launch.parts);
  const int64_t length = s.job.length;
  const int parts = s.job.parts;
  const int64_t begin = (length * part / parts) & ~int64_t{31};
  const int64_t end = part + 1 == parts ? length : (length * (part + 1) / parts) & ~int64_t{31};
  const RowSource columns{JobScores(s, launch.problem), begin, end};
  const CandidateSink part_sink{false, 0, WorkerSlice(launch), launch.slice_entries};
  const int kept = OrderedSelect<false>(s, columns, s.job.cutoffs.primary, 0, part_sink);
  if (threadIdx.x == 0) launch.part_kept[blockIdx.x] = kept;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned arrived = atomicAdd(&launch.parts_arrived[s.job.row], 1u);
    s.flag = arrived == static_cast<unsigned>(s.job.parts - 1);
  }
  __syncthreads();
  const bool last = s.flag;
  __syncthreads();  // flag is rewritten by MergeSplitParts
  if (last) __threadfence();
  return last;
}

// The finisher: when the parts' candidates settle the row (none dropped, they fit in shared
// memory, and at least k of them or the cutoff kept everything), merges them, selects into
// staging and returns how many. Otherwise returns -1, with s.flag telling whether the primary
// cutoff came up short.
__device__ __forceinline__ int MergeSplitParts(SharedStorage& s, const FilteredLaunch& launch) {
  const int k = launch.problem.k;
  const int64_t first_item = s.job.row * launch.parts;
  int total = 0;
  bool overflow = false;
  for (int p = 0; p < s.job.parts; ++p) {
    const int part_kept = __ldcg(launch.part_kept + first_item + p);
    overflow |= part_kept > launch.slice_entries;
    total += part_kept < launch.slice_entries ? part_kept : launch.slice_entries;
  }
  if (overflow || total > kSharedCandidates || (total < k && s.job.cutoffs.primary != 0)) {
    if (threadIdx.x == 0) s.flag = !overflow && total < k;
    __syncthreads();
    return -1;
  }
  int offset = 0;
  for (int p = 0; p < s.job.parts; ++p) {
    const int part_kept = __ldcg(launch.part_kept + first_item + p);
    const uint2* part_slice = launch.slices + (first_item + p) * launch.slice_entries;
    for (int e = threadIdx.x; e < part_kept; e += kThreadsPerBlock) {
      const uint2 pair = __ldcg(part_slice + e);
      s.region.candidates.col[offset + e] = static_cast<int32_t>(pair.x);
      s.region.candidates.key[offset + e] = pair.y;
    }
    offset += part_kept;
  }
  __syncthreads();
  const BufferSource merged{s.region.candidates.key, s.region.candidates.col, kSharedCandidates,
                            nullptr, total};
  return SelectIntoStaging(s, merged, k);
}

// One launch: split mode (kSplit: block b serves part b % parts of row b / parts) or a
// persistent pool of workers taking whole rows from the queue in completion order.
template <bool kSplit>
__global__ void __launch_bounds__(kThreadsPerBlock, kBlocksPerSm)
    TopkFilteredKernel(const FilteredLaunch launch) {
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  SharedStorage& s = *reinterpret_cast<SharedStorage*>(shared_bytes);
  if (kSplit) {
    RunSplitPart(s, launch, blockIdx.x);
    return;
  }
  const unsigned long long rows = static_cast<unsigned long long>(launch.problem.rows);
  for (;;) {
    if (threadIdx.x == 0) s.next_row = atomicAdd(launch.queue_next, 1ull);
    __syncthreads();
    const unsigned long long row = s.next_row;
    __syncthreads();
    if (row >= rows) break;
    RunWholeRow(s, launch, static_cast<int64_t>(row));
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
int SmCount(int device) {
  constexpr int kMaxDevices = 64;
  static int cached[kMaxDevices] = {};  // racing writers store the same value
  const bool cacheable = device >= 0 && device < kMaxDevices;
  int count = cacheable ? cached[device] : 0;
  if (count == 0) {
    if (cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
        count <= 0) {
      count = 1;  // still exact: a pool of kBlocksPerSm workers
    }
    if (cacheable) cached[device] = count;
  }
  return count;
}

struct WorkspacePlan {
  int parts = 1;
  int64_t grid = 0;
  size_t header_bytes = 0;
  int slice_entries = 0;
  size_t parts_arrived_offset = 0;
  size_t part_kept_offset = 0;
};

constexpr size_t kCounterBytes = 16;  // queue_next (8) + workers_done (4), padded

WorkspacePlan PlanWorkspace(int64_t rows, int parts, int pool, size_t workspace_bytes) {
  WorkspacePlan plan;
  plan.parts = parts;
  plan.grid = parts > 1 ? rows * parts : (rows < pool ? rows : pool);
  plan.parts_arrived_offset = kCounterBytes;
  plan.part_kept_offset = plan.parts_arrived_offset + (parts > 1 ? rows : 0) * sizeof(unsigned int);
  const size_t header = plan.part_kept_offset + plan.grid * sizeof(int);
  plan.header_bytes = (header + 255) / 256 * 256;
  const size_t free_bytes = workspace_bytes > plan.header_bytes ? workspace_bytes - plan.header_bytes : 0;
  const size_t entries = free_bytes / (plan.grid * sizeof(uint2));
  plan.slice_entries = static_cast<int>(entries < kFilteredSliceEntries ? entries : kFilteredSliceEntries);
  return plan;
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

  // Few rows: split each over blocks, if the workspace gives every part a useful slice.
  WorkspacePlan plan = PlanWorkspace(problem.rows, 1, pool, workspace_bytes);
  if (problem.rows * 2 <= pool) {
    const int64_t useful_parts = (problem.width + kFilteredSplitPartColumns - 1) / kFilteredSplitPartColumns;
    int64_t parts = pool / problem.rows;
    if (parts > useful_parts) parts = useful_parts;
    if (parts > kMaxParts) parts = kMaxParts;
    if (parts > 1) {
      const WorkspacePlan split = PlanWorkspace(problem.rows, static_cast<int>(parts), pool, workspace_bytes);
      if (split.slice_entries >= kMinSplitSliceEntries && split.header_bytes <= workspace_bytes) plan = split;
    }
  }
  if (plan.header_bytes > workspace_bytes) return cudaErrorInvalidValue;  // cannot happen: pool <= 480

  unsigned char* base = static_cast<unsigned char*>(workspace);
  FilteredLaunch launch;
  launch.problem = problem;
  launch.queue_next = reinterpret_cast<unsigned long long*>(base);
  launch.workers_done = reinterpret_cast<unsigned int*>(base + sizeof(unsigned long long));
  launch.parts_arrived = reinterpret_cast<unsigned int*>(base + plan.parts_arrived_offset);
  launch.part_kept = reinterpret_cast<int*>(base + plan.part_kept_offset);
  launch.slices = reinterpret_cast<uint2*>(base + plan.header_bytes);
  launch.slice_entries = plan.slice_entries;
  launch.parts = plan.parts;

  const size_t shared_bytes = sizeof(SharedStorage);
  const auto kernel = plan.parts > 1 ? TopkFilteredKernel<true> : TopkFilteredKernel<false>;
  status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(shared_bytes));
  if (status != cudaSuccess) return status;
  // The workspace is an XLA output buffer: garbage on entry. Only the counters need zeros.
  status = cudaMemsetAsync(workspace, 0, plan.header_bytes, stream);
  if (status != cudaSuccess) return status;
  kernel<<<static_cast<unsigned int>(plan.grid), kThreadsPerBlock, shared_bytes, stream>>>(launch);
  return cudaGetLastError();
}

}  // namespace jax_topk
