// The kernel of benches/probes/merge_runs.cu (see there for the algorithm), in a header of its
// own so that benches/probes/merge_runs_on_host.cc can run it on the host (host_simt.h) before
// any device time is spent on it.
#pragma once

#include <cstdint>

#include "benches/probes/merge_sorted_runs.cuh"
#include "common/topk_common.h"
#include "common/value_traits.h"

#ifdef __CUDACC__
#include "kernels/l2_prefetch.cuh"

namespace merge_runs {
using jax_topk::PrefetchRangeToL2;
__device__ __forceinline__ unsigned char* DynamicShared() {
  extern __shared__ __align__(16) unsigned char bytes[];
  return bytes;
}
}  // namespace merge_runs
#endif

namespace merge_runs {

constexpr int kThreads = 512;
constexpr int kMaxWidth = 16384;
using jax_topk::sorted_runs::kMaxRuns;
constexpr int32_t kNotRuns = -2;  // the probe's mark of a row with more than kMaxRuns runs

struct Shared {
  uint64_t rank[kMaxWidth];       // the row's rank keys, by place
  uint16_t places[2][kMaxWidth];  // a level's sequences: places into `rank`, ping-ponged
  jax_topk::sorted_runs::Sequences sequences;
  int32_t boundaries;  // places that start a run (after place 0)
};

template <typename Values>
__device__ __forceinline__ uint64_t RankKey(typename Values::Bits bits, int32_t column) {
  if (column < 0 || Values::IsNan(bits)) return 0;
  return (static_cast<uint64_t>(Values::Key(bits)) << 32) | static_cast<uint32_t>(~column);
}

// Places [4 quad, 4 quad + 4) of a row as rank keys: one 16-byte load of columns and one of
// 16 (float32) or 8 (16-bit) bytes of values.
template <typename Values>
__device__ __forceinline__ void RankKeysOfQuad(const typename Values::Bits* values,
                                               const int32_t* indices, int quad, uint64_t* rank) {
  using Bits = typename Values::Bits;
  const int4 columns = reinterpret_cast<const int4*>(indices)[quad];
  Bits bits[4];
  if constexpr (sizeof(Bits) == 4) {
    const uint4 v = reinterpret_cast<const uint4*>(values)[quad];
    bits[0] = v.x, bits[1] = v.y, bits[2] = v.z, bits[3] = v.w;
  } else {
    const uint2 v = reinterpret_cast<const uint2*>(values)[quad];
    bits[0] = static_cast<Bits>(v.x), bits[1] = static_cast<Bits>(v.x >> 16);
    bits[2] = static_cast<Bits>(v.y), bits[3] = static_cast<Bits>(v.y >> 16);
  }
  rank[4 * quad] = RankKey<Values>(bits[0], columns.x);
  rank[4 * quad + 1] = RankKey<Values>(bits[1], columns.y);
  rank[4 * quad + 2] = RankKey<Values>(bits[2], columns.z);
  rank[4 * quad + 3] = RankKey<Values>(bits[3], columns.w);
}

template <typename Values>
__global__ void __launch_bounds__(kThreads, 1)
    MergeRunsKernel(const typename Values::Bits* values, const int32_t* indices, int64_t rows,
                    int width, int k, bool prefetch, typename Values::Bits* out_values,
                    int32_t* out_indices) {
  using Bits = typename Values::Bits;
  Shared& s = *reinterpret_cast<Shared*>(DynamicShared());
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    if (prefetch && threadIdx.x == 0 && row + gridDim.x < rows) {
      PrefetchRangeToL2(values + (row + gridDim.x) * width, width * sizeof(Bits));
      PrefetchRangeToL2(indices + (row + gridDim.x) * width, width * sizeof(int32_t));
    }
    // 1. Rank keys (four places a load where the row allows), then the run boundaries.
    const Bits* row_values = values + row * width;
    const int32_t* row_indices = indices + row * width;
    const bool quads = width % 4 == 0 &&
                       reinterpret_cast<uintptr_t>(row_values) % (4 * sizeof(Bits)) == 0 &&
                       reinterpret_cast<uintptr_t>(row_indices) % 16 == 0;
    if (quads) {
#pragma unroll 4
      for (int quad = threadIdx.x; quad < width / 4; quad += kThreads)
        RankKeysOfQuad<Values>(row_values, row_indices, quad, s.rank);
    } else {
#pragma unroll 8
      for (int place = threadIdx.x; place < width; place += kThreads)
        s.rank[place] = RankKey<Values>(row_values[place], row_indices[place]);
    }
    if (threadIdx.x == 0) s.boundaries = 0;
    __syncthreads();
    for (int place = threadIdx.x + 1; place < width; place += kThreads) {
      if (s.rank[place] > s.rank[place - 1]) {
        const int slot = atomicAdd(&s.boundaries, 1);
        if (slot < kMaxRuns - 1) s.sequences.start[0][slot + 1] = place;
      }
    }
    __syncthreads();
    const int runs = s.boundaries + 1;
    if (runs > kMaxRuns) {
      if (threadIdx.x == 0) out_indices[row * k] = kNotRuns;
      __syncthreads();  // the next row rewrites `rank` and `boundaries`
      continue;
    }
    // 2. The merge tree, then the winners in rank order; no-candidate entries (R = 0) rank last.
    uint16_t* const places[2] = {s.places[0], s.places[1]};
    const jax_topk::sorted_runs::Merged merged = jax_topk::sorted_runs::MergeRuns<kThreads>(
        [&](int place) { return s.rank[place]; }, places, s.sequences, runs, width, k);
    for (int slot = threadIdx.x; slot < k; slot += kThreads) {
      const uint64_t rank = slot < merged.length ? s.rank[merged.Place(slot)] : 0;
      out_values[row * k + slot] =
          rank != 0 ? Values::FromKey(static_cast<uint32_t>(rank >> 32)) : Values::kEmpty;
      out_indices[row * k + slot] =
          rank != 0 ? static_cast<int32_t>(~static_cast<uint32_t>(rank)) : jax_topk::kEmptySlot;
    }
    __syncthreads();  // the next row rewrites `rank` and the sequences
  }
}

}  // namespace merge_runs
