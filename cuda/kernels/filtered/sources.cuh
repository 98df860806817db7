// Sources: where a phase reads its items from (a row in global memory, kept candidates, a
// selection's frontier, the sample in registers), all behind one ForEach(visit(bits, col, valid))
// so that one histogram or compaction serves every source; and the projections that turn an item
// into the 32-bit value a radix selection ranks.
//
// Contract: every thread of the block calls ForEach with block-uniform sources; every thread
// visits the same number of items (invalid ones padded), so visitors may use warp collectives.
// No barriers, no shared memory of their own: a source only reads.
#pragma once

#include "kernels/filtered/elements.cuh"
#include "kernels/filtered/layout.cuh"
#include "kernels/l2_prefetch.cuh"

namespace jax_topk {
namespace {

constexpr uint32_t kNanBits = 0x7FFFFFFFu;  // stands for a missing value: never selected

// The first column of [begin, end) at a 16-byte boundary (or end): the scalar head ends there.
// A row of width n starts at element r * n, so its alignment depends on n mod the chunk's elements.
template <class Storage>
__device__ __forceinline__ int AlignedColumn(const Storage* row, int begin, int end) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(row + begin);
  const int head = static_cast<int>(((16 - (address & 15)) & 15) / sizeof(Storage));
  return end - begin > head ? begin + head : end;
}

// The widened values of the kChunkElems elements at a 16-byte aligned address, into
// values[0, kChunkElems); with kBounded, those past the `available` ones read as NaN.
template <class Elements, bool kBounded>
__device__ __forceinline__ void LoadChunk(const typename Elements::Storage* at, int64_t available,
                                          float* values) {
  constexpr int kElems = kChunkElems<Elements>;
  if constexpr (kBounded) {
    if (available < kElems) {
#pragma unroll
      for (int e = 0; e < kElems - 1; ++e) {  // the last one is missing
        values[e] =
            e < available ? WidenedValue<Elements>(__ldcs(at + e)) : __uint_as_float(kNanBits);
      }
      values[kElems - 1] = __uint_as_float(kNanBits);
      return;
    }
  }
  const uint4 chunk = __ldcs(reinterpret_cast<const uint4*>(at));
  const uint32_t words[4] = {chunk.x, chunk.y, chunk.z, chunk.w};
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    if constexpr (kElems == 4) {
      values[w] = __uint_as_float(words[w]);
    } else {  // two 16-bit elements a word, the lower column in the low half
      values[2 * w] = WidenedValue<Elements>(static_cast<unsigned short>(words[w] & 0xFFFFu));
      values[2 * w + 1] = WidenedValue<Elements>(static_cast<unsigned short>(words[w] >> 16));
    }
  }
}

// Pulls `columns` columns of the row from `from` on (none past `end`) into L2. On sm_90 one
// thread asks the copy engine for the whole range (the 16-byte-aligned inside of it: the load
// units then see no prefetch traffic); before that, a 128-byte line a thread.
template <class Storage>
__device__ __forceinline__ void PrefetchToL2(const Storage* row, int64_t from, int end,
                                             int columns) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (threadIdx.x != 0 || from >= end) return;
  const int64_t to = from + columns < end ? from + columns : end;
  PrefetchRangeToL2(row + from, static_cast<size_t>(to - from) * sizeof(Storage));
#else
  constexpr int kLineElems = kPrefetchLineBytes / static_cast<int>(sizeof(Storage));
  const int offset = kLineElems * static_cast<int>(threadIdx.x);
  if (offset < columns && from + offset < end)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(row + from + offset));
#endif
}

// Sources hand items (value bits, column, valid) to a visitor; every thread of the block
// visits the same number of items, so visitors may use warp collectives.

// kRepeats: whether a source may hold long runs of one value (histograms then add a warp's
// equal digits once, instead of serialising on one shared-memory address).

// Columns [begin, end) of a row in global memory: a scalar head up to a 16-byte boundary, then
// tiles of 16-byte loads, each value widened to float32 (elements.cuh). NaN items are invalid:
// the float32 NaN test is the row type's own, since widening maps NaN to NaN and nothing else.
template <class Elements>
struct RowSource {
  static constexpr bool kRepeats = true;
  const typename Elements::Storage* row;
  int begin;
  int end;

  template <class Visit>
  __device__ __forceinline__ void ForEach(Visit&& visit) const {
    constexpr int kElems = kChunkElems<Elements>;
    constexpr int kStride = kChunkStride<Elements>;
    constexpr int kChunks = kScanChunks<Elements>;
    const int aligned = AlignedColumn(row, begin, end);
    if (aligned > begin) {
      const bool inside = static_cast<int>(threadIdx.x) < aligned - begin;
      const int col = begin + (inside ? static_cast<int>(threadIdx.x) : 0);
      const uint32_t bits = inside ? Elements::Widen(__ldcs(row + col)) : kNanBits;
      visit(bits, col, !IsNanF32(bits));
    }
    for (int base = aligned; base<end; base += end - base> kScanTile ? kScanTile : end - base) {
      const uint32_t first = base + kElems * threadIdx.x;  // no wrap: base < 2^31
      float values[kScanItems];
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {  // all loads first, for memory-level parallelism
        LoadChunk<Elements, true>(row + first + kStride * c, int64_t{end} - first - kStride * c,
                                  values + kElems * c);
      }
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
#pragma unroll
        for (int e = 0; e < kElems; ++e) {
          const uint32_t bits = __float_as_uint(values[kElems * c + e]);
          visit(bits, static_cast<int32_t>(first + kStride * c + e), !IsNanF32(bits));
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
      const uint2 c =
          entry < count ? __ldcg(global + (entry - shared_capacity)) : make_uint2(kNanBits, 0);
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

}  // namespace
}  // namespace jax_topk
