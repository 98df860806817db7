// The kernel of benches/probes/merge_runs.cu (see there for the algorithm), in a header of its
// own so that benches/probes/merge_runs_on_host.cc can run it on the host (host_simt.h) before
// any device time is spent on it.
#pragma once

#include <cstdint>

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
constexpr int kMaxRuns = 16;
constexpr int32_t kNotRuns = -2;  // the probe's mark of a row with more than kMaxRuns runs

struct Shared {
  uint64_t rank[kMaxWidth];              // the row's rank keys, by place
  uint16_t places[2][kMaxWidth];         // a level's sequences: places into `rank`, ping-ponged
  int32_t sequence_start[2][kMaxRuns];   // where each sequence of a level starts (level 0: in
  int32_t sequence_length[2][kMaxRuns];  // `rank`, later: in places[level % 2])
  int32_t sequences[2];
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

// One level: sequences of `source` (places[src], or `rank` itself at level 0) merged in pairs,
// each output cut to k, into places[dst]; thread 0 records the next level's sequences.
__device__ void MergeLevel(Shared& s, int level, int k) {
  const int src = level % 2, dst = 1 - src;
  const bool implicit = level == 0;  // level 0's sequences are runs of `rank` itself
  const int count = s.sequences[src];
  const int pairs = (count + 1) / 2;
  int pair_start[kMaxRuns / 2 + 1];
  pair_start[0] = 0;
  for (int pair = 0; pair < pairs; ++pair) {
    const int a = s.sequence_length[src][2 * pair];
    const int b = 2 * pair + 1 < count ? s.sequence_length[src][2 * pair + 1] : 0;
    pair_start[pair + 1] = pair_start[pair] + min(k, a + b);
  }
  const int total = pair_start[pairs];
  const int share = (total + kThreads - 1) / kThreads;
  int first = threadIdx.x * share;
  const int end = min(total, first + share);
  int pair = 0;
  while (first < end) {  // a share may span the end of one pair and the start of the next
    while (pair_start[pair + 1] <= first) ++pair;
    const int a_start = s.sequence_start[src][2 * pair];
    const int a = s.sequence_length[src][2 * pair];
    const bool has_b = 2 * pair + 1 < count;
    const int b_start = has_b ? s.sequence_start[src][2 * pair + 1] : 0;
    const int b = has_b ? s.sequence_length[src][2 * pair + 1] : 0;
    const auto place_a = [&](int e) {
      return implicit ? a_start + e : static_cast<int>(s.places[src][a_start + e]);
    };
    const auto place_b = [&](int e) {
      return implicit ? b_start + e : static_cast<int>(s.places[src][b_start + e]);
    };
    const int p = first - pair_start[pair];
    const int stop = min(end, pair_start[pair + 1]) - pair_start[pair];
    // Co-rank: the largest i in [lo, hi] with i == lo or A[i - 1] >= B[p - i] (ties left);
    // mid > lo >= p - b, so B[p - mid] exists.
    int lo = max(0, p - b), hi = min(p, a);
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (s.rank[place_a(mid - 1)] >= s.rank[place_b(p - mid)]) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    int i = lo, j = p - lo;
    int next_a = i < a ? place_a(i) : 0, next_b = j < b ? place_b(j) : 0;
    uint64_t rank_a = i < a ? s.rank[next_a] : 0, rank_b = j < b ? s.rank[next_b] : 0;
    uint16_t* const out = &s.places[dst][pair_start[pair]];
    for (int o = p; o < stop; ++o) {
      const bool take_a = j >= b || (i < a && rank_a >= rank_b);
      out[o] = static_cast<uint16_t>(take_a ? next_a : next_b);
      if (take_a) {
        ++i;
        if (i < a) next_a = place_a(i), rank_a = s.rank[next_a];
      } else {
        ++j;
        if (j < b) next_b = place_b(j), rank_b = s.rank[next_b];
      }
    }
    first = pair_start[pair] + stop;
  }
  if (threadIdx.x == 0) {
    s.sequences[dst] = pairs;
    for (int q = 0; q < pairs; ++q) {
      s.sequence_start[dst][q] = pair_start[q];
      s.sequence_length[dst][q] = pair_start[q + 1] - pair_start[q];
    }
  }
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
        if (slot < kMaxRuns - 1) s.sequence_start[0][slot + 1] = place;
      }
    }
    __syncthreads();
    const int runs = s.boundaries + 1;
    if (runs > kMaxRuns) {
      if (threadIdx.x == 0) out_indices[row * k] = kNotRuns;
      __syncthreads();  // the next row rewrites `rank` and `boundaries`
      continue;
    }
    if (threadIdx.x == 0) {  // the run starts in place order (the atomics' order is not)
      int* const starts = s.sequence_start[0];
      starts[0] = 0;
      for (int r = 2; r < runs; ++r) {  // insertion sort of at most kMaxRuns - 1 places
        const int place = starts[r];
        int q = r;
        for (; q > 1 && starts[q - 1] > place; --q) starts[q] = starts[q - 1];
        starts[q] = place;
      }
      for (int r = 0; r < runs; ++r) {
        const int end = r + 1 < runs ? s.sequence_start[0][r + 1] : width;
        s.sequence_length[0][r] = min(k, end - s.sequence_start[0][r]);
      }
      s.sequences[0] = runs;
    }
    __syncthreads();
    // 2. The merge tree.
    int level = 0;
    for (; s.sequences[level % 2] > 1; ++level) {
      MergeLevel(s, level, k);
      __syncthreads();
    }
    // 3. The winners in rank order; no-candidate entries (R = 0) rank last.
    const int src = level % 2;
    const int length = s.sequence_length[src][0];
    const int start = s.sequence_start[src][0];
    for (int slot = threadIdx.x; slot < k; slot += kThreads) {
      uint64_t rank = 0;
      if (slot < length) rank = s.rank[level == 0 ? start + slot : s.places[src][start + slot]];
      out_values[row * k + slot] =
          rank != 0 ? Values::FromKey(static_cast<uint32_t>(rank >> 32)) : Values::kEmpty;
      out_indices[row * k + slot] =
          rank != 0 ? static_cast<int32_t>(~static_cast<uint32_t>(rank)) : jax_topk::kEmptySlot;
    }
    __syncthreads();  // the next row rewrites `rank` and the sequences
  }
}

}  // namespace merge_runs
