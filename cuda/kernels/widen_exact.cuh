// Exact widening of 16-bit scores to float32 bits and back. Every bfloat16 and float16 value
// (subnormals included) is a float32, and widening keeps the IEEE total order: distinct values
// stay distinct (-0 stays -0, infinities stay, NaN stays NaN). So a kernel may select over the
// widened bits' ordered keys (common/topk_common.h) and narrow a winner back bit for bit.
//
// Contract: pure device functions; the kernels that read 16-bit rows (the filtered kernel's
// loaders, the register kernels of kernels/f32_rows/) and write 16-bit values call these.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

namespace jax_topk {
namespace {

// bfloat16 is the top half of a float32.
__device__ __forceinline__ uint32_t WidenBf16Bits(unsigned short bits) {
  return static_cast<uint32_t>(bits) << 16;
}
__device__ __forceinline__ unsigned short NarrowToBf16Bits(uint32_t widened) {
  return static_cast<unsigned short>(widened >> 16);
}

// A float16 NaN widens to a NaN; narrowing a widened float16 rounds nothing.
__device__ __forceinline__ uint32_t WidenF16Bits(unsigned short bits) {
  return __float_as_uint(__half2float(__ushort_as_half(bits)));
}
__device__ __forceinline__ unsigned short NarrowToF16Bits(uint32_t widened) {
  return __half_as_ushort(__float2half_rn(__uint_as_float(widened)));
}

}  // namespace
}  // namespace jax_topk
