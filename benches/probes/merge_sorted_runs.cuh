// A sorted-runs merge for merge_topk (a probe, not in the product): a row that is a few runs
// each in rank order (the lists of top_k(sorted=True) calls, -1 slots last) merged instead of
// selected. The top k of a union is the top k of the union of each part's top k, so:
// 1. The caller finds the runs: a place whose 64-bit rank key (ordered key << 32 | ~column,
//    0 for no candidate) is above its left neighbour's starts one. At most kMaxRuns.
// 2. MergeRuns: the runs, cut to k, merged in pairs level by level, each output cut to k,
//    as 16-bit places into the rank keys, ping-ponged between two buffers. Within a level all
//    pairs' outputs form one range split over the block's threads (an odd count each); each
//    finds its first output's sources by a binary search (co-rank; ties to the left run:
//    equal rank keys are equal (value, column) pairs, whose bits are the same whichever goes
//    first), then merges its share.
// The merge of benches/probes/merge_runs.cu (tried inside the register kernel too and taken
// out again: benches/NOTES.md); no CUDA-only call, so host_simt.h can run it on the host.
#pragma once

#include <cstdint>

namespace jax_topk {
namespace sorted_runs {

constexpr int kMaxRuns = 16;

// A level's sequences (level 0: runs of the rank keys themselves; later: ranges of a places
// buffer), double-buffered by level parity.
struct Sequences {
  int32_t start[2][kMaxRuns];
  int32_t length[2][kMaxRuns];
  int32_t count[2];
};

// One level: the sequences of parity `level % 2` merged in pairs into places[1 - level % 2];
// thread 0 records the next level's sequences. Every thread calls it; no barrier inside.
// rank(place): the place's 64-bit rank key.
template <int kThreads, class RankOf>
__device__ void MergeLevel(const RankOf& rank, uint16_t* const (&places)[2], Sequences& seq,
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
      if (rank(place_a(mid - 1)) >= rank(place_b(p - mid))) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    int i = lo, j = p - lo;
    int next_a = i < a ? place_a(i) : 0, next_b = j < b ? place_b(j) : 0;
    uint64_t rank_a = i < a ? rank(next_a) : 0, rank_b = j < b ? rank(next_b) : 0;
    uint16_t* const out = places[dst] + pair_start[pair];
    for (int o = p; o < stop; ++o) {
      const bool take_a = j >= b || (i < a && rank_a >= rank_b);
      out[o] = static_cast<uint16_t>(take_a ? next_a : next_b);
      if (take_a) {
        ++i;
        if (i < a) next_a = place_a(i), rank_a = rank(next_a);
      } else {
        ++j;
        if (j < b) next_b = place_b(j), rank_b = rank(next_b);
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

// Where the merged row lies: slot s of the output is the row's place Place(s), s < length.
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
template <int kThreads, class RankOf>
__device__ Merged MergeRuns(const RankOf& rank, uint16_t* const (&places)[2], Sequences& seq,
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
    MergeLevel<kThreads>(rank, places, seq, level, k);
    __syncthreads();
  }
  const int src = level % 2;
  return {level == 0 ? nullptr : places[src], seq.start[src][0], seq.length[src][0]};
}

}  // namespace sorted_runs
}  // namespace jax_topk
