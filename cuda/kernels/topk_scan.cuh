// Prefix sums for the CUDA kernels: across the lanes of a warp by shuffles, and across a block
// by one shared word per warp and a warp reduction over them (one barrier, where a generic
// block scan takes two and several times the instructions).
#pragma once

#include <cstdint>

namespace jax_topk {

// Inclusive prefix sum over the lanes of a warp; every lane calls it.
__device__ __forceinline__ int WarpInclusiveSum(int value) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int offset = 1; offset < 32; offset *= 2) {
    const int other = __shfl_up_sync(0xFFFFFFFFu, value, offset);
    if (lane >= offset) value += other;
  }
  return value;
}

// Exclusive prefix sum over a block of kWarps full warps, and the block's total; every thread
// calls it. The caller puts a barrier between two calls (warp_sums is rewritten).
template <int kWarps>
__device__ __forceinline__ uint32_t BlockExclusiveSum(uint32_t (&warp_sums)[kWarps], uint32_t value,
                                                      uint32_t& total) {
  static_assert(kWarps <= 32, "one warp reduces the per-warp sums");
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const uint32_t inclusive = static_cast<uint32_t>(WarpInclusiveSum(static_cast<int>(value)));
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  const uint32_t warp_sum = lane < kWarps ? warp_sums[lane] : 0;
  total = __reduce_add_sync(0xFFFFFFFFu, warp_sum);
  return __reduce_add_sync(0xFFFFFFFFu, lane < warp ? warp_sum : 0) + inclusive - value;
}

}  // namespace jax_topk
