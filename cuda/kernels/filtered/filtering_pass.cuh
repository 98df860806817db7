// The filtering pass: the hot loop. One read of columns [begin, end) of a row (16-byte loads of
// its own element type, widened to float32; as the job's PassReads says, the row pulled into L2
// kPrefetchAhead columns ahead, every other tile staged through shared memory, or neither)
// appends every value >= a threshold to a sink: s.candidates first, then this block's workspace
// slice, counted past the slice's end so that the caller sees the overflow. Every thread tests its
// 16 (float32, one compare each) or 32 (16-bit, two a packed compare) values into a bit mask; only
// a warp with a hit counts and appends, and only a thread's hits cost more.
//
// Contract: FilterColumns is called by every thread of the block with block-uniform arguments.
// It owns s.kept (zeroed, then one atomic per warp), writes s.candidates and, reading staged,
// uses s.work (every copy waited for before the closing barriers); a barrier opens it,
// two close it (the count is read by all, then may be reset by a retry). The order of the kept
// candidates is unspecified.
#pragma once

#include "kernels/filtered/probe.cuh"
#include "kernels/filtered/sources.cuh"
#include "kernels/topk_scan.cuh"

namespace jax_topk {
namespace {

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
__device__ __forceinline__ bool KeepsAll(uint32_t cutoff) {
  return cutoff <= OrderedKeyF32(0xFF800000u);
}

// values[i] for a runtime i, by a tree of selects over the bits of i (halving the candidates per
// bit): a dynamic index into a register array would put the array in local memory.
template <class Item, int kItems>
__device__ __forceinline__ Item SelectItem(const Item (&values)[kItems], int i) {
  if constexpr (kItems == 1) {
    return values[0];
  } else {
    static_assert(kItems % 2 == 0, "a power of two");
    Item halved[kItems / 2];
    const bool odd = i & 1;
#pragma unroll
    for (int j = 0; j < kItems / 2; ++j) halved[j] = odd ? values[2 * j + 1] : values[2 * j];
    return SelectItem(halved, i >> 1);
  }
}

// Appends this warp's hits (bit i of `hits`: this thread's item i is kept; candidate_of(i) gives
// its (value bits, column)). One shared atomic per warp; then each thread walks only its own
// hits, so a tile costs its compares plus a few instructions per hit, and nothing past the vote
// when the warp has none.
template <class CandidateOf>
__device__ __forceinline__ void AppendHitMask(SharedStorage& s, const CandidateSink& sink,
                                              uint32_t hits, const CandidateOf& candidate_of) {
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
    const uint2 candidate = candidate_of(__ffs(hits) - 1);
    if (in_shared) {
      s.candidates[position++] = candidate;
    } else {
      sink.Put(s, position++, candidate);
    }
  }
}

// Appends this warp's values >= threshold; item i of a thread is column
// first_col + (i / kElems) * kStride + i % kElems (kElems elements a chunk, kStride apart).
template <int kElems, int kStride, int kItems>
__device__ __forceinline__ void AppendHits(SharedStorage& s, const CandidateSink& sink,
                                           const float (&values)[kItems], uint32_t first_col,
                                           float threshold) {
  static_assert(kItems <= 32, "one bit per item");
  uint32_t hits = 0;
#pragma unroll
  for (int i = 0; i < kItems; ++i) hits |= static_cast<uint32_t>(values[i] >= threshold) << i;
  AppendHitMask(s, sink, hits, [&](int i) {
    return make_uint2(__float_as_uint(SelectItem(values, i)),
                      first_col + (i / kElems) * kStride + i % kElems);
  });
}

// A 16-bit element that is missing (past the row's end): a NaN of bfloat16 and of float16, which
// widens to a float32 NaN.
constexpr unsigned short kMissing16 = 0x7FFFu;

// The four 32-bit words (two 16-bit elements each, the lower column in the low half) of the
// 16-byte chunk at `at`; with kBounded, elements past the `available` ones read as kMissing16.
template <class Elements, bool kBounded>
__device__ __forceinline__ void LoadWords(const typename Elements::Storage* at, int64_t available,
                                          uint32_t (&words)[4]) {
  constexpr int kElems = kChunkElems<Elements>;
  if constexpr (kBounded) {
    if (available < kElems) {
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const uint32_t low = 2 * w < available ? __ldcs(at + 2 * w) : kMissing16;
        const uint32_t high = 2 * w + 1 < available ? __ldcs(at + 2 * w + 1) : kMissing16;
        words[w] = low | (high << 16);
      }
      return;
    }
  }
  const uint4 chunk = __ldcs(reinterpret_cast<const uint4*>(at));
  words[0] = chunk.x;
  words[1] = chunk.y;
  words[2] = chunk.z;
  words[3] = chunk.w;
}

// One tile of kFilterTile<Elements> columns from `tile` (16-byte aligned), bounded by `end` if
// kBounded. float32 rows keep their 16 values in flight as floats and compare each; 16-bit rows
// keep their 32 as 16 packed words (the same 64 bytes and registers) and compare two elements an
// instruction against `packed_threshold` (elements.cuh AtLeast), folding each mask into the hit
// bits with one more: bit j is the low element of word j, bit 16 + j its high element. Only a
// hit is widened. (kWidened16: the probe build's previous 16-bit loop, a widening and a float
// compare an element, kept for timing against.)
template <class Elements, bool kBounded, bool kWidened16 = false>
__device__ __forceinline__ void FilterTile(SharedStorage& s, const typename Elements::Storage* row,
                                           int tile, int end, float threshold,
                                           uint32_t packed_threshold, const CandidateSink& sink) {
  constexpr int kElems = kChunkElems<Elements>;
  constexpr int kStride = kChunkStride<Elements>;
  const uint32_t first = tile + kElems * threadIdx.x;  // no wrap: tile < 2^31
  const typename Elements::Storage* at = row + first;
  if constexpr (kElems == 4) {
    float values[kFilterItems<Elements>];
#pragma unroll
    for (int c = 0; c < kFilterChunks; ++c) {
      LoadChunk<Elements, kBounded>(at + kStride * c, int64_t{end} - first - kStride * c,
                                    values + kElems * c);
    }
    AppendHits<kElems, kStride>(s, sink, values, first, threshold);
  } else {
    constexpr int kWords = 4 * kFilterChunks;  // word j holds items 2j and 2j + 1
    static_assert(2 * kWords == 32, "one hit bit per item");
    uint32_t words[kFilterChunks][4];
#pragma unroll
    for (int c = 0; c < kFilterChunks; ++c) {
      LoadWords<Elements, kBounded>(at + kStride * c, int64_t{end} - first - kStride * c, words[c]);
    }
    uint32_t packed[kWords];
#pragma unroll
    for (int c = 0; c < kFilterChunks; ++c) {
#pragma unroll
      for (int w = 0; w < 4; ++w) packed[4 * c + w] = words[c][w];
    }
    // The column of word j's low element.
    const auto column_of_word = [&](int j) { return first + (j / 4) * kStride + 2 * (j % 4); };
    uint32_t hits = 0;
    if constexpr (kWidened16) {  // bits 2j and 2j + 1: word j's elements
#pragma unroll
      for (int j = 0; j < kWords; ++j) {
        hits |= static_cast<uint32_t>(__uint_as_float(Elements::WidenLow(packed[j])) >= threshold)
                << (2 * j);
        hits |= static_cast<uint32_t>(__uint_as_float(Elements::WidenHigh(packed[j])) >= threshold)
                << (2 * j + 1);
      }
      AppendHitMask(s, sink, hits, [&](int i) {
        const uint32_t word = SelectItem(packed, i >> 1);
        return make_uint2((i & 1) ? Elements::WidenHigh(word) : Elements::WidenLow(word),
                          column_of_word(i >> 1) + (i & 1));
      });
    } else {
#pragma unroll
      for (int j = 0; j < kWords; ++j)
        hits |= Elements::AtLeast(packed[j], packed_threshold) & (0x00010001u << j);
      AppendHitMask(s, sink, hits, [&](int i) {
        const int j = i % kWords;
        const uint32_t word = SelectItem(packed, j);
        const bool high = i >= kWords;
        return make_uint2(high ? Elements::WidenHigh(word) : Elements::WidenLow(word),
                          column_of_word(j) + high);
      });
    }
  }
}

// The packed threshold of the row type (unused for float32 rows).
template <class Elements>
__device__ __forceinline__ uint32_t PackedThresholdOf(float threshold) {
  if constexpr (kChunkElems<Elements> == 8) {
    return Elements::PackedThreshold(threshold);
  } else {
    return 0u;
  }
}

// The staged tiles: each thread's kFilterChunks 16-byte chunks of a tile go to its own slots of
// s.work (free during a pass: the selection uses it after), so that a tile's loads are in flight
// while the previous tile is tested, without the registers a second tile would hold. A thread
// reads back only what it copied itself, so no barrier is needed; cp.async.wait_group orders it.
__device__ __forceinline__ uint4* StagedChunks(SharedStorage& s) {
  return s.work.staged_chunks;
}

// Starts the copy of this thread's chunks of the full tile at `tile` into its slots.
template <class Elements>
__device__ __forceinline__ void StageTile(SharedStorage& s, const typename Elements::Storage* row,
                                          int tile) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800  // cp.async
  const typename Elements::Storage* at = row + tile + kChunkElems<Elements> * threadIdx.x;
  uint4* slots = StagedChunks(s);
#pragma unroll
  for (int c = 0; c < kFilterChunks; ++c) {
    const uint32_t slot =
        static_cast<uint32_t>(__cvta_generic_to_shared(&slots[kThreadsPerBlock * c + threadIdx.x]));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(slot),
                 "l"(at + kChunkStride<Elements> * c)
                 : "memory");
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
#else
  (void)s;
  (void)row;
  (void)tile;
#endif
}

// Waits for this thread's staged chunks.
__device__ __forceinline__ void WaitStagedTile() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800  // cp.async
  asm volatile("cp.async.wait_group 0;" ::: "memory");
#endif
}

// FilterTile's test of a full tile, from this thread's staged chunks: the same hits (the hit
// bits of a thread's items are numbered as in FilterTile), each kept value read back from its slot.
template <class Elements>
__device__ __forceinline__ void FilterStagedTile(SharedStorage& s, int tile, float threshold,
                                                 uint32_t packed_threshold,
                                                 const CandidateSink& sink) {
  constexpr int kElems = kChunkElems<Elements>;
  constexpr int kStride = kChunkStride<Elements>;
  const uint32_t first = tile + kElems * threadIdx.x;
  const uint4* slots = StagedChunks(s);
  // Word w of chunk c (two 16-bit elements, or one float32).
  const auto word_at = [&](int c, int w) {
    return reinterpret_cast<const uint32_t*>(&slots[kThreadsPerBlock * c + threadIdx.x])[w];
  };
  uint32_t hits = 0;
#pragma unroll
  for (int c = 0; c < kFilterChunks; ++c) {
    const uint4 chunk = slots[kThreadsPerBlock * c + threadIdx.x];
    const uint32_t words[4] = {chunk.x, chunk.y, chunk.z, chunk.w};
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      if constexpr (kElems == 4) {  // item 4c + w
        hits |= static_cast<uint32_t>(__uint_as_float(words[w]) >= threshold) << (4 * c + w);
      } else {  // word j = 4c + w: items j (low element) and 16 + j (high)
        hits |= Elements::AtLeast(words[w], packed_threshold) & (0x00010001u << (4 * c + w));
      }
    }
  }
  AppendHitMask(s, sink, hits, [&](int i) {
    if constexpr (kElems == 4) {
      return make_uint2(word_at(i / 4, i % 4), first + (i / 4) * kStride + i % 4);
    } else {
      const int j = i % 16;
      const bool high = i >= 16;
      const uint32_t word = word_at(j / 4, j % 4);
      return make_uint2(high ? Elements::WidenHigh(word) : Elements::WidenLow(word),
                        first + (j / 4) * kStride + 2 * (j % 4) + high);
    }
  });
}

// The full tiles of [tile, end) in pairs: the first of a pair staged (its copy started during the
// previous pair), the second loaded into registers and tested while the copy lands, then the
// staged one tested and the next pair's copy started. Returns the first column not covered.
template <class Elements>
__device__ __forceinline__ int FilterStagedTiles(SharedStorage& s,
                                                 const typename Elements::Storage* row, int tile,
                                                 int end, float threshold,
                                                 uint32_t packed_threshold,
                                                 const CandidateSink& sink) {
  constexpr int kTile = kFilterTile<Elements>;
  const int full = (end - tile) / kTile;
  if (full > 0) StageTile<Elements>(s, row, tile);
  for (int a = 0; a < full; a += 2) {
    const int staged = tile + a * kTile;
    PrefetchToL2(row, int64_t{staged} + 2 * kTile, end, 2 * kTile);
    if (a + 1 < full) {
      FilterTile<Elements, false>(s, row, staged + kTile, end, threshold, packed_threshold, sink);
    }
    WaitStagedTile();
    FilterStagedTile<Elements>(s, staged, threshold, packed_threshold, sink);
    if (a + 2 < full) StageTile<Elements>(s, row, staged + 2 * kTile);
  }
  return tile + full * kTile;
}

// The tiles of [tile, end), full tiles unbounded, read as s.job.reads says (layout.cuh PassReads).
template <class Elements, bool kWidened16>
__device__ __forceinline__ void FilterTiles(SharedStorage& s, const typename Elements::Storage* row,
                                            int tile, int end, float threshold,
                                            const CandidateSink& sink) {
  const uint32_t packed_threshold = PackedThresholdOf<Elements>(threshold);
  const PassReads reads = s.job.reads;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800  // cp.async
  if (!kWidened16 && reads == PassReads::kStaged) {
    tile = FilterStagedTiles<Elements>(s, row, tile, end, threshold, packed_threshold, sink);
  }
#endif
  for (; end - tile >= kFilterTile<Elements>; tile += kFilterTile<Elements>) {
    if (reads != PassReads::kPlain) {
      PrefetchToL2(row, int64_t{tile} + kPrefetchAhead<Elements>, end, kFilterTile<Elements>);
    }
    FilterTile<Elements, false, kWidened16>(s, row, tile, end, threshold, packed_threshold, sink);
  }
  if (tile < end) {
    FilterTile<Elements, true, kWidened16>(s, row, tile, end, threshold, packed_threshold, sink);
  }
}

// Appends every non-NaN value >= threshold of columns [begin, end) to the sink, in no particular
// order; returns how many (also past the sink's capacity: the caller detects overflow from it).
// The NaN test is the float32 one (value >= threshold is false for NaN): widening maps the row
// type's NaN, and only it, to a float32 NaN.
template <class Elements>
__device__ __forceinline__ int FilterColumns(SharedStorage& s,
                                             const typename Elements::Storage* row, int begin,
                                             int end, float threshold, const CandidateSink& sink) {
  if (threadIdx.x == 0) s.kept = 0;
  __syncthreads();
  const int aligned = AlignedColumn(row, begin, end);
  if (aligned > begin && threadIdx.x < kWarpSize) {  // the scalar head, one column per lane
    const int offset = static_cast<int>(threadIdx.x);
    const float head[1] = {offset < aligned - begin
                               ? WidenedValue<Elements>(__ldcs(row + begin + offset))
                               : __uint_as_float(kNanBits)};
    AppendHits<1, 1>(s, sink, head, static_cast<uint32_t>(begin) + offset, threshold);
  }
  if (kChunkElems<Elements> == 8 && ProbeOn(s, kProbeOld16BitLoop)) {  // probe build only
    FilterTiles<Elements, kChunkElems<Elements> == 8>(s, row, aligned, end, threshold, sink);
  } else {
    FilterTiles<Elements, false>(s, row, aligned, end, threshold, sink);
  }
  __syncthreads();
  const int kept = s.kept;
  __syncthreads();  // a retry resets s.kept
  return kept;
}

}  // namespace
}  // namespace jax_topk
