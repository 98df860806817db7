// Pushing words into the other blocks of a thread block cluster, each receiver counting the bytes
// it is owed on an mbarrier of its own (sm_90): a sender's st.async writes the receiver's shared
// memory and completes that many bytes of the receiver's mbarrier, so a receiver waits one
// one-way trip for what it needs, with no cluster barrier and no remote load round trip.
//
// Contract (the mbarrier calls are kernels/mbarrier.cuh's): a receiver initialises its mbarrier
// (MbarrierInit) and makes that visible to the cluster (FenceMbarrierInit, then a cluster
// barrier) before any block pushes to it, and arms it with the bytes it is owed
// (MbarrierExpectBytes, once, by one thread) before or after they land: bytes that land first
// take the transaction count below zero, and the phase cannot complete before the arming
// arrival. Each mbarrier here is used for one phase only (parity 0): one exchange, never reused.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/mbarrier.cuh"

namespace jax_topk {

// The same offset in the shared memory of cluster block `rank` (a shared::cluster address).
__device__ __forceinline__ uint32_t MapToBlock(uint32_t local, uint32_t rank) {
  uint32_t remote = local;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
#endif
  return remote;
}

// Waits for the first (and here only) phase of a receiving mbarrier; the pushed words are then
// visible.
__device__ __forceinline__ void MbarrierWaitFirstPhase(uint64_t* barrier) {
  MbarrierWait</*kCluster=*/true>(barrier, 0);
}

// Writes `word` at `remote` (a shared::cluster address) and completes 4 bytes of the receiver's
// mbarrier at `remote_barrier`.
__device__ __forceinline__ void PushWord(uint32_t remote, uint32_t remote_barrier, uint32_t word) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.u32 [%0], %1, [%2];" ::"r"(remote),
      "r"(word), "r"(remote_barrier)
      : "memory");
#endif
}

// Two words (8-byte aligned `remote`), completing 8 bytes.
__device__ __forceinline__ void PushWords(uint32_t remote, uint32_t remote_barrier, uint32_t first,
                                          uint32_t second) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.u32 [%0], {%1, %2}, [%3];" ::"r"(
          remote),
      "r"(first), "r"(second), "r"(remote_barrier)
      : "memory");
#endif
}

}  // namespace jax_topk
