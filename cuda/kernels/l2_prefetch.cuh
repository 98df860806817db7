// Asking the copy engine to pull a range of global memory into L2 (sm_90's bulk prefetch): one
// instruction from one thread, no registers held and nothing waited for, so that later loads of
// the range find L2 instead of HBM.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace jax_topk {

// The 16-byte-aligned inside of [begin, begin + bytes) into L2 (the instruction's alignment);
// nothing before sm_90.
__device__ __forceinline__ void PrefetchRangeToL2(const void* begin, size_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uintptr_t first = (reinterpret_cast<uintptr_t>(begin) + 15) & ~uintptr_t{15};
  const uintptr_t last = (reinterpret_cast<uintptr_t>(begin) + bytes) & ~uintptr_t{15};
  if (first < last) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(first),
                 "r"(static_cast<uint32_t>(last - first))
                 : "memory");
  }
#else
  (void)begin;
  (void)bytes;
#endif
}

}  // namespace jax_topk
