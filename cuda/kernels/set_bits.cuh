// Visiting the few flagged slots of a thread's register array. A loop unrolled over every slot
// with a branch a slot (`if (flags >> i & 1) ...`) costs a warp ~45 ns a slot even where no lane
// takes the branch (each slot is a BSSY / BSYNC pair and a branch; timed per warp by
// benches/probes/f32_cluster_stamps.cu). Where few slots are flagged, a loop over the set bits
// costs a bit-find and one select tree a visit instead.
//
// Contract: device code, no shared memory, no barriers; the visit order is ascending slot.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace jax_topk {

// One step of SlotAt's tree: level[j] becomes level[2j + bit kBit of i] for the first
// ceil(kCount / 2) entries, then the next bit's step. After step b, level[j] holds
// slots[j * 2^(b+1) + (i mod 2^(b+1))] wherever that index is below kSlots. An unpaired last
// entry keeps level[2j]: wrong only when i's bit is 1, and then the index it stands for is past
// kSlots, which no valid i reaches. Each step reads entries 2j and 2j + 1 >= j: safe in place.
template <int kCount, int kBit, class T, int kSlots>
__device__ __forceinline__ T SelectStep(T (&level)[kSlots], int i) {
  if constexpr (kCount == 1) {
    return level[0];
  } else {
    const bool odd = (i >> kBit) & 1;
#pragma unroll
    for (int j = 0; 2 * j < kCount; ++j) {
      if (2 * j + 1 < kCount)
        level[j] = odd ? level[2 * j + 1] : level[2 * j];
      else
        level[j] = level[2 * j];
    }
    return SelectStep<(kCount + 1) / 2, kBit + 1>(level, i);
  }
}

// slots[i] for an i known only at run time (0 <= i < kSlots): a tree of selects on i's bits, so
// that the array stays in registers (indexing it at run time would move it to local memory).
// About kSlots selects, log2(kSlots) deep.
template <int kSlots, class T>
__device__ __forceinline__ T SlotAt(const T (&slots)[kSlots], int i) {
  static_assert(kSlots >= 1 && kSlots <= 32, "a slot mask is 32 bits");
  T level[kSlots];
#pragma unroll
  for (int j = 0; j < kSlots; ++j) level[j] = slots[j];
  return SelectStep<kSlots, 0>(level, i);
}

// Slot counts below this take the unrolled loop. Measured in topk_f32_cluster (benches/NOTES.md
// "set-bit loops"): 0.5-1.6 us a launch gained at 16 and 24 keys a thread; at 4 the callers keep
// their own loops (the bit loop's code, even unused, compiled to slower SASS there).
constexpr int kBitLoopMinSlots = 16;

// Calls visit(i) for each set bit i of `flags` (bits >= kSlots must be clear), in ascending i.
// From kBitLoopMinSlots slots, a thread with at most a quarter of them flagged loops over its set
// bits (visit sees a run-time i: read the slots with SlotAt); any other takes the unrolled loop,
// where i is a compile-time constant and SlotAt folds to the register itself. (The kernels'
// callers under kBitLoopMinSlots slots keep loops of their own: see kBitLoopMinSlots.)
template <int kSlots, class Visit>
__device__ __forceinline__ void ForEachSetBit(uint32_t flags, const Visit& visit) {
  // Each lane chooses for itself: a warp-uniform choice (__all_sync) measured no faster.
  if (kSlots >= kBitLoopMinSlots && __popc(flags) * 4 <= kSlots) {
    while (flags != 0) {
      const int i = __ffs(flags) - 1;
      flags &= flags - 1;
      visit(i);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      if ((flags >> i) & 1u) visit(i);
    }
  }
}

// The lowest `count` set bits of mask (all of them when it has no more; none when count <= 0):
// a quota of tied values taken lowest column first.
__device__ __forceinline__ uint32_t LowestSetBits(uint32_t mask, int count) {
  if (count >= __popc(mask)) return mask;
  uint32_t taken = 0;
  for (; count > 0; --count) {
    const uint32_t lowest = mask & (0u - mask);
    taken |= lowest;
    mask ^= lowest;
  }
  return taken;
}

}  // namespace jax_topk
