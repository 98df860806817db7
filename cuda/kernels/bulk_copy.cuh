// The copy engine bringing a range of global memory into this block's shared memory (sm_90's
// cp.async.bulk), counted on an mbarrier in bytes: one instruction from one thread, no registers
// or load slots held by the threads while the bytes travel.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/mbarrier.cuh"

namespace jax_topk {

// `bytes` (a multiple of 16; both addresses 16-byte aligned) from `from` into `to`, completing
// that many bytes of `barrier`'s transaction count (armed by MbarrierExpectBytes). Nothing before
// sm_90.
__device__ __forceinline__ void BulkCopyToShared(void* to, const void* from, uint32_t bytes,
                                                 uint64_t* barrier) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(SharedAddress(to)),
      "l"(from), "r"(bytes), "r"(SharedAddress(barrier))
      : "memory");
#else
  (void)to;
  (void)from;
  (void)bytes;
  (void)barrier;
#endif
}

}  // namespace jax_topk
