// Pushing words into the other blocks of a thread block cluster, each receiver counting the bytes
// it is owed on an mbarrier of its own (sm_90): a sender's st.async writes the receiver's shared
// memory and completes that many bytes of the receiver's mbarrier, so a receiver waits one
// one-way trip for what it needs, with no cluster barrier and no remote load round trip.
//
// Contract: a receiver initialises its mbarrier (MbarrierInit), arms it with the bytes it is owed
// (MbarrierExpectBytes, once, by one thread) and makes the initialisation visible to the cluster
// (FenceMbarrierInit, then a cluster barrier) before any block pushes to it. Each mbarrier here is
// used for one phase only (parity 0): one exchange, never reused.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace jax_topk {

// The shared-memory (shared::cta) address of a pointer into this block's shared memory.
__device__ __forceinline__ uint32_t SharedAddress(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

// The same offset in the shared memory of cluster block `rank` (a shared::cluster address).
__device__ __forceinline__ uint32_t MapToBlock(uint32_t local, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  return remote;
}

__device__ __forceinline__ void MbarrierInit(uint64_t* barrier, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(SharedAddress(barrier)),
               "r"(arrivals)
               : "memory");
}

// Makes this block's mbarrier initialisations visible to the cluster (before a cluster barrier).
__device__ __forceinline__ void FenceMbarrierInit() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// One arrival on `barrier`, which then also waits for `bytes` bytes of pushes.
__device__ __forceinline__ void MbarrierExpectBytes(uint64_t* barrier, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(
                   SharedAddress(barrier)),
               "r"(bytes)
               : "memory");
}

// Waits for the first phase of `barrier` to complete; the pushed words are then visible.
__device__ __forceinline__ void MbarrierWaitFirstPhase(uint64_t* barrier) {
  const uint32_t address = SharedAddress(barrier);
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n"
        ".reg .pred complete;\n"
        "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 complete, [%1], 0;\n"
        "selp.u32 %0, 1, 0, complete;\n"
        "}\n"
        : "=r"(done)
        : "r"(address)
        : "memory");
  }
}

// Writes `word` at `remote` (a shared::cluster address) and completes 4 bytes of the receiver's
// mbarrier at `remote_barrier`.
__device__ __forceinline__ void PushWord(uint32_t remote, uint32_t remote_barrier, uint32_t word) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.u32 [%0], %1, [%2];" ::"r"(remote),
      "r"(word), "r"(remote_barrier)
      : "memory");
}

// Two words (8-byte aligned `remote`), completing 8 bytes.
__device__ __forceinline__ void PushWords(uint32_t remote, uint32_t remote_barrier, uint32_t first,
                                          uint32_t second) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.u32 [%0], {%1, %2}, [%3];" ::"r"(
          remote),
      "r"(first), "r"(second), "r"(remote_barrier)
      : "memory");
}

}  // namespace jax_topk
