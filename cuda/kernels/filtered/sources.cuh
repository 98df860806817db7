// Sources: where a phase reads its items from (a row in global memory, kept candidates, a
// selection's frontier, the sample in registers), all behind one ForEach(visit(bits, col, valid))
// so that one histogram or compaction serves every source; and the projections that turn an item
// into the 32-bit value a radix selection ranks.
//
// Contract: every thread of the block calls ForEach with block-uniform sources; every thread
// visits the same number of items (invalid ones padded), so visitors may use warp collectives.
// No barriers, no shared memory of their own: a source only reads.
#pragma once

#include "kernels/filtered/layout.cuh"

namespace jax_topk {
namespace {

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
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(first),
                 "r"(static_cast<uint32_t>(last - first))
                 : "memory");
  }
#else
  const int offset = kPrefetchLineElems * static_cast<int>(threadIdx.x);
  if (offset < columns && from + offset < end)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(row + from + offset));
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
    for (int base = aligned; base<end; base += end - base> kScanTile ? kScanTile : end - base) {
      const uint32_t first = base + kChunkElems * threadIdx.x;  // no wrap: base < 2^31
      float4 chunks[kScanChunks];
#pragma unroll
      for (int c = 0; c < kScanChunks; ++c) {  // all loads first, for memory-level parallelism
        chunks[c] = LoadChunk<true>(row + first + kChunkStride * c,
                                    int64_t{end} - first - kChunkStride * c);
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
