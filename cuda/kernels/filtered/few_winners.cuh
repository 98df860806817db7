// Few winners: the top k <= kFewWinnersMaxK of a row's kept candidates (all in s.candidates) by
// sorted lists in registers, for small k (vocabulary sampling: k = 50 of ~600 kept), where the
// radix selection's histograms, searches, tie quota and gather took 3.5-5.6 us per row and these
// take ~2.4 (benches/NOTES.md "Few winners"):
//   1. each warp keeps the top 64 of its share of the candidates as a descending list, two items
//      per lane, of 64-bit composites (ordered key, reversed column): a batch of 32 is sorted by a
//      bitonic network and merged into the list (max against the reversed batch, then a bitonic
//      merge; the first batch is the list); a batch with nothing above the list's last item is
//      skipped;
//   2. the 16 lists are merged pairwise in shared memory, 8 + 4 + 2 + 1 warps, a barrier per level;
//   3. warp 0 puts the first min(k, valid) of the last list into s.work.selected, in rank order.
// The composites are a total order (key descending, then column ascending) and NaN is never one
// (its composite is 0, below every valid one), so the winners are the radix route's, bit for bit.
//
// Contract: called by every thread of the block with block-uniform arguments, where
// UsesFewWinners holds; reads s.candidates, uses s.work (the lists above s.work.selected) and
// s.selected_count, and ends with a barrier, after which s.work.selected holds the winners.
#pragma once

#include "kernels/filtered/layout.cuh"

namespace jax_topk {
namespace {

constexpr int kFewWinnersMaxK = 2 * kWarpSize;  // a list of two items per lane
// The most candidates taken this way: a warp sorts at most 8 batches even when every batch
// rises above its list (candidates in ascending order); more go to the radix route.
constexpr int kFewWinnersMaxKept = 8 * kThreadsPerBlock;
// The warps' lists, in s.work.frontier's words after s.work.selected's.
constexpr int kFewListsAt = 2 * kMaxK;
static_assert(kFewListsAt % 2 == 0, "the lists' 64-bit items are aligned");
static_assert(kFewListsAt + 2 * kWarpsPerBlock * kFewWinnersMaxK <= kFrontierCapacity,
              "the warps' lists fit in s.work");
static_assert(kFewWinnersMaxKept <= kSharedCandidates, "few winners' candidates are all shared");
static_assert((kWarpsPerBlock & (kWarpsPerBlock - 1)) == 0, "lists merge pairwise");

// Whether the few-winners route takes a selection of k from `kept` candidates, `in_shared` of
// which fit s.candidates, gathered into s.work.selected (`gathered`).
__device__ __forceinline__ bool UsesFewWinners(int k, int kept, int in_shared, bool gathered) {
  return gathered && k <= kFewWinnersMaxK && kept <= kFewWinnersMaxKept && kept <= in_shared;
}

// The rank composite of a (value bits, column) item: larger ranks first (key descending, then
// column ascending); 0 for NaN, below every other (and used as padding).
__device__ __forceinline__ uint64_t RankComposite(uint32_t bits, uint32_t col) {
  if (IsNanF32(bits)) return 0u;
  return (uint64_t{OrderedKeyF32(bits)} << 32) | (0xFFFFFFFFu - col);
}

// Puts elements [0, m) of a warp's list of composites (item r is element r * 32 + lane) into
// s.work.selected, as value bits and column. Every lane of the warp calls it.
__device__ __forceinline__ void PutRankComposites(SharedStorage& s, const uint64_t (&item)[2],
                                                  int m) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int slot = r * kWarpSize + lane;
    if (slot < m) {
      s.work.selected.bits[slot] = BitsFromOrderedKeyF32(static_cast<uint32_t>(item[r] >> 32));
      s.work.selected.col[slot] = 0xFFFFFFFFu - static_cast<uint32_t>(item[r]);
    }
  }
}

// The larger of a compare-exchange pair's two items (keep_larger) or the smaller: one compare
// and one select, where max and min would take two of each.
__device__ __forceinline__ uint64_t KeepOf(uint64_t mine, uint64_t other, bool keep_larger) {
  return (other > mine) == keep_larger ? other : mine;
}

// Sorts one item per lane descending over the warp (lane 0 the largest).
__device__ __forceinline__ uint64_t SortWarpDescending(uint64_t item) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
#pragma unroll
  for (int size = 2; size <= kWarpSize; size <<= 1) {
#pragma unroll
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      const uint64_t other = __shfl_xor_sync(kFullMask, item, stride);
      const bool lower = (lane & stride) == 0;
      const bool descending = (lane & size) == 0;  // all of it at size 32
      item = KeepOf(item, other, lower == descending);
    }
  }
  return item;
}

// Sorts a bitonic list of 64 (item r is element r * 32 + lane) descending.
__device__ __forceinline__ void MergeBitonicDescending(uint64_t (&item)[2]) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  if (item[1] > item[0]) {  // stride 32: the lane's own two
    const uint64_t high = item[1];
    item[1] = item[0];
    item[0] = high;
  }
#pragma unroll
  for (int stride = kWarpSize / 2; stride > 0; stride >>= 1) {
    const bool lower = (lane & stride) == 0;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const uint64_t other = __shfl_xor_sync(kFullMask, item[r], stride);
      item[r] = KeepOf(item[r], other, lower);
    }
  }
}

// list = the top 64 of list (descending) and `ascending`, 64 items in ascending order whose
// element r * 32 + lane is ascending_item[r]; descending again.
__device__ __forceinline__ void MergeIntoList(uint64_t (&list)[2], const uint64_t (&ascending)[2]) {
  // max(list[i], ascending[i]) holds the top 64 of both, in a bitonic order.
  list[0] = max(list[0], ascending[0]);
  list[1] = max(list[1], ascending[1]);
  MergeBitonicDescending(list);
}

__device__ __forceinline__ int SelectFewWinners(SharedStorage& s, int kept, int k) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  uint64_t list[2] = {0u, 0u};  // this warp's top 64 so far, descending; 0: empty
  bool empty = true;            // warp-uniform
  for (int base = warp * kWarpSize; base < kept; base += kThreadsPerBlock) {
    const int entry = base + lane;
    const uint2 candidate = s.candidates[entry < kept ? entry : 0];
    const uint64_t item = entry < kept ? RankComposite(candidate.x, candidate.y) : 0u;
    const uint64_t last = __shfl_sync(kFullMask, list[1], kWarpSize - 1);
    if (!__any_sync(kFullMask, item > last)) continue;  // warp-uniform
    const uint64_t batch = SortWarpDescending(item);
    if (empty) {  // the first batch is the list
      list[0] = batch;
      empty = false;
      continue;
    }
    // The batch ascending, padded below with 0 to 64: elements 32 + lane take batch[31 - lane].
    const uint64_t ascending[2] = {0u, __shfl_sync(kFullMask, batch, kWarpSize - 1 - lane)};
    MergeIntoList(list, ascending);
  }
  uint64_t* const lists = reinterpret_cast<uint64_t*>(s.work.frontier + kFewListsAt);
#pragma unroll
  for (int r = 0; r < 2; ++r) lists[warp * kFewWinnersMaxK + r * kWarpSize + lane] = list[r];
  for (int active = kWarpsPerBlock / 2; active > 0; active /= 2) {
    __syncthreads();  // the lists of the level before are in
    if (warp < active) {
      const uint64_t* const other = lists + (warp + active) * kFewWinnersMaxK;
      // The other list reversed, so ascending: element r * 32 + lane is other[63 - that].
      const uint64_t ascending[2] = {other[kFewWinnersMaxK - 1 - lane],
                                     other[kWarpSize - 1 - lane]};
      MergeIntoList(list, ascending);
#pragma unroll
      for (int r = 0; r < 2; ++r) lists[warp * kFewWinnersMaxK + r * kWarpSize + lane] = list[r];
    }
  }
  if (warp == 0) {
    const int valid = __popc(__ballot_sync(kFullMask, list[0] != 0u)) +
                      __popc(__ballot_sync(kFullMask, list[1] != 0u));
    const int m = valid < k ? valid : k;
    PutRankComposites(s, list, m);
    if (lane == 0) s.selected_count = m;
  }
  __syncthreads();
  return s.selected_count;
}

}  // namespace
}  // namespace jax_topk
