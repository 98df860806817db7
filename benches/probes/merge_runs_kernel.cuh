// The kernel of benches/probes/merge_runs.cu (see there for the algorithm), in a header of its
// own so that benches/probes/merge_runs_on_host.cc can run it on the host (host_simt.h) before
// any device time is spent on it. Its merge was tried inside merge_topk's register kernel too
// and taken out again (benches/NOTES.md). Each level's share a thread is odd, so that a warp's
// sequential walks start in different banks (measured: no faster).
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

// A level's sequences (level 0: runs of the rank keys themselves; later: ranges of a places
// buffer), double-buffered by level parity.
struct Sequences {
  int32_t start[2][kMaxRuns];
  int32_t length[2][kMaxRuns];
  int32_t count[2];
};

// One level: the sequences of parity `level % 2` merged in pairs into places[1 - level % 2];
// thread 0 records the next level's sequences. Every thread calls it; no barrier inside.
__device__ void MergeLevel(const uint64_t* rank, uint16_t* const (&places)[2], Sequences& seq,
                           int level, int k) {
  const int src = level % 2, dst = 1 - src;
  const bool implicit = level == 0;  // level 0's sequences are runs of `rank` itself
  const int count = seq.count[src];
  const int pairs = (count + 1) / 2;
  int pair_start[kMaxRuns / 2 + 1];
  pair_start[0] = 0;
  for (int pair = 0; pair < pairs; ++pair) {
    const int a = seq.length[src][2 * pair];
    const int b = 2 * pair + 1 < count ? seq.length[src][2 * pair + 1] : 0;
    pair_start[pair + 1] = pair_start[pair] + min(k, a + b);
  }
  const int total = pair_start[pairs];
  // An odd share: a warp's threads then start their sequential walks in different banks
  // (an even one, 16 at 8 x 2048, put every lane's 8-byte key reads in one bank pair).
  const int share = (total + kThreads - 1) / kThreads | 1;
  int first = static_cast<int>(threadIdx.x) * share;
  const int end = min(total, first + share);
  const uint16_t* const from = places[src];
  int pair = 0;
  while (first < end) {  // a share may span the end of one pair and the start of the next
    while (pair_start[pair + 1] <= first) ++pair;
    const int a_start = seq.start[src][2 * pair];
    const int a = seq.length[src][2 * pair];
    const bool has_b = 2 * pair + 1 < count;
    const int b_start = has_b ? seq.start[src][2 * pair + 1] : 0;
    const int b = has_b ? seq.length[src][2 * pair + 1] : 0;
    const auto place_a = [&](int e) {
      return implicit ? a_start + e : static_cast<int>(from[a_start + e]);
    };
    const auto place_b = [&](int e) {
      return implicit ? b_start + e : static_cast<int>(from[b_start + e]);
    };
    const int p = first - pair_start[pair];
    const int stop = min(end, pair_start[pair + 1]) - pair_start[pair];
    // Co-rank: the largest i in [lo, hi] with i == lo or A[i - 1] >= B[p - i] (ties left);
    // mid > lo >= p - b, so B[p - mid] exists.
    int lo = max(0, p - b), hi = min(p, a);
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (rank[place_a(mid - 1)] >= rank[place_b(p - mid)]) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    int i = lo, j = p - lo;
    int next_a = i < a ? place_a(i) : 0, next_b = j < b ? place_b(j) : 0;
    uint64_t rank_a = i < a ? rank[next_a] : 0, rank_b = j < b ? rank[next_b] : 0;
    uint16_t* const out = places[dst] + pair_start[pair];
    for (int o = p; o < stop; ++o) {
      const bool take_a = j >= b || (i < a && rank_a >= rank_b);
      out[o] = static_cast<uint16_t>(take_a ? next_a : next_b);
      if (take_a) {
        ++i;
        if (i < a) next_a = place_a(i), rank_a = rank[next_a];
      } else {
        ++j;
        if (j < b) next_b = place_b(j), rank_b = rank[next_b];
      }
    }
    first = pair_start[pair] + stop;
  }
  if (threadIdx.x == 0) {
    seq.count[dst] = pairs;
    for (int q = 0; q < pairs; ++q) {
      seq.start[dst][q] = pair_start[q];
      seq.length[dst][q] = pair_start[q + 1] - pair_start[q];
    }
  }
}

// Where the merged row lies: slot s of the output is rank[Place(s)] for s < length.
struct Merged {
  const uint16_t* places;  // null: the row was one run, place(s) = start + s
  int start, length;
  __device__ __forceinline__ int Place(int slot) const {
    return places == nullptr ? start + slot : static_cast<int>(places[start + slot]);
  }
};

// The runs of a row of `width` rank keys merged to its top k in rank order. On entry (after a
// barrier): seq.start[0][1 .. runs - 1] hold the places that start a run after place 0, in any
// order, runs <= kMaxRuns. Every thread calls it; it ends after a barrier.
__device__ Merged MergeRuns(const uint64_t* rank, uint16_t* const (&places)[2], Sequences& seq,
                            int runs, int width, int k) {
  if (threadIdx.x == 0) {  // the run starts in place order (the caller's atomics' order is not)
    int32_t* const starts = seq.start[0];
    starts[0] = 0;
    for (int r = 2; r < runs; ++r) {  // insertion sort of at most kMaxRuns - 1 places
      const int place = starts[r];
      int q = r;
      for (; q > 1 && starts[q - 1] > place; --q) starts[q] = starts[q - 1];
      starts[q] = place;
    }
    for (int r = 0; r < runs; ++r) {
      const int end = r + 1 < runs ? starts[r + 1] : width;
      seq.length[0][r] = min(k, end - starts[r]);
    }
    seq.count[0] = runs;
  }
  __syncthreads();
  int level = 0;
  for (; seq.count[level % 2] > 1; ++level) {
    MergeLevel(rank, places, seq, level, k);
    __syncthreads();
  }
  const int src = level % 2;
  return {level == 0 ? nullptr : places[src], seq.start[src][0], seq.length[src][0]};
}

struct Shared {
  uint64_t rank[kMaxWidth];       // the row's rank keys, by place
  uint16_t places[2][kMaxWidth];  // a level's sequences: places into `rank`, ping-ponged
  Sequences sequences;
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
    const Merged merged = MergeRuns(s.rank, places, s.sequences, runs, width, k);
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
