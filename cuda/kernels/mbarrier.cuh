// Shared-memory mbarriers (sm_90): a 64-bit counter in shared memory that completes a phase once
// its expected arrivals and bytes are in. The bytes come from the copy engine (cp.async.bulk,
// merge_in_registers.cuh) or from other blocks of a cluster (st.async, cluster_push.cuh); a
// waiter polls the phase's parity (0 for the first phase, then 1, 0, ... as it is reused).
//
// Before first use one thread initialises it (MbarrierInit) and makes that visible
// (FenceMbarrierInit, then a block or cluster barrier), then each phase is armed once
// (MbarrierExpectBytes: one arrival, plus the bytes that phase waits for).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace jax_topk {

// The shared-memory (shared::cta) address of a pointer into this block's shared memory.
__device__ __forceinline__ uint32_t SharedAddress(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

__device__ __forceinline__ void MbarrierInit(uint64_t* barrier, uint32_t arrivals) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(SharedAddress(barrier)),
               "r"(arrivals)
               : "memory");
#endif
}

// Makes this block's mbarrier initialisations visible to the cluster's async proxy and blocks
// (before the barrier that precedes the first arrival).
__device__ __forceinline__ void FenceMbarrierInit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

// One arrival on `barrier`, whose current phase then also waits for `bytes` bytes.
__device__ __forceinline__ void MbarrierExpectBytes(uint64_t* barrier, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(SharedAddress(barrier)),
      "r"(bytes)
      : "memory");
#endif
}

// Waits until the phase of `barrier` with this parity completes. kCluster: what other blocks
// of the cluster wrote into this block (st.async) is visible afterwards; otherwise what this
// block's copies brought.
template <bool kCluster>
__device__ __forceinline__ void MbarrierWait(uint64_t* barrier, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint32_t address = SharedAddress(barrier);
  uint32_t done = 0;
  while (!done) {
    if constexpr (kCluster) {
      asm volatile(
          "{\n"
          ".reg .pred complete;\n"
          "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 complete, [%1], %2;\n"
          "selp.u32 %0, 1, 0, complete;\n"
          "}\n"
          : "=r"(done)
          : "r"(address), "r"(parity)
          : "memory");
    } else {
      asm volatile(
          "{\n"
          ".reg .pred complete;\n"
          "mbarrier.try_wait.parity.shared::cta.b64 complete, [%1], %2;\n"
          "selp.u32 %0, 1, 0, complete;\n"
          "}\n"
          : "=r"(done)
          : "r"(address), "r"(parity)
          : "memory");
    }
  }
#endif
}

}  // namespace jax_topk
