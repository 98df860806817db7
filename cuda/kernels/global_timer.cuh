// The GPU's global timer in nanoseconds, for the kernels' probe builds (phase stamps): the same
// clock on every SM, so stamps of different blocks compare (its steps are coarse: 32 ns or more).
#pragma once

#include <cuda_runtime.h>

namespace jax_topk {

__device__ __forceinline__ unsigned long long GlobalTimerNs() {
  unsigned long long ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  return ns;
}

}  // namespace jax_topk
