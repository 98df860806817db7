// Row elements: the three score types a row may hold, read at their own width (16-byte chunks of
// 4 float32 or 8 16-bit values, no cast pass), and the exact widening of each value to float32
// bits that every phase after the loaders works on. Widening is exact and order-preserving:
// distinct values stay distinct in the same total order (-0 stays -0, infinities stay, NaN stays
// NaN), so a selection over the widened bits is the selection over the 16-bit ordered key, ties
// included, and the values output narrows them back bit for bit (winners.cuh WriteValue).
// The filtering pass tests 16-bit elements two at a time without widening them, against the
// smallest element value >= its float32 threshold (PackedThreshold): a 16-bit IEEE compare
// (AtLeast) then keeps exactly the elements whose widened value is >= the threshold.
//
// Contract: constants and pure functions only; every loader takes one RowElements<type> as its
// template argument Elements.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "common/topk_problem.h"
#include "kernels/filtered/layout.cuh"
#include "kernels/widen_exact.cuh"

namespace jax_topk {
namespace {

template <ScoreType kType>
struct RowElements;

template <>
struct RowElements<ScoreType::kFloat32> {
  using Storage = float;
  // Distinct widened keys of one sign lie at least 2^kKeyStepBits apart (the zero low bits a
  // 16-bit value widens to; float32: none). selection.cuh's relative bins use it.
  static constexpr int kKeyStepBits = 0;
  __device__ __forceinline__ static uint32_t Widen(float value) { return __float_as_uint(value); }
};
template <>
struct RowElements<ScoreType::kBfloat16> {
  using Storage = unsigned short;
  static constexpr int kKeyStepBits = 16;  // 8 significant bits of 24
  __device__ __forceinline__ static uint32_t Widen(unsigned short bits) {
    return WidenBf16Bits(bits);
  }
  // The two elements of a 32-bit word (the lower column in the low half), widened: one
  // instruction each.
  __device__ __forceinline__ static uint32_t WidenLow(uint32_t word) { return word << 16; }
  __device__ __forceinline__ static uint32_t WidenHigh(uint32_t word) { return word & 0xFFFF0000u; }
  // The smallest bfloat16 >= threshold (a float32, not NaN), in both halves: a positive value
  // between two bfloat16 rounds its magnitude up, a negative one truncates it.
  __device__ __forceinline__ static uint32_t PackedThreshold(float threshold) {
    const uint32_t bits = __float_as_uint(threshold);
    const uint32_t rounded = (bits >> 16) + ((bits & 0xFFFFu) != 0 && (bits >> 31) == 0);
    return rounded | (rounded << 16);
  }
  // 0xFFFF in each half of `word` whose element is >= the packed threshold's (an IEEE compare:
  // NaN never, -0 == +0); one instruction for two elements on sm_90.
  __device__ __forceinline__ static uint32_t AtLeast(uint32_t word, uint32_t packed_threshold) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    uint32_t mask;
    asm("set.ge.u32.bf16x2 %0, %1, %2;" : "=r"(mask) : "r"(word), "r"(packed_threshold));
    return mask;
#else
    const float low = __uint_as_float(WidenLow(packed_threshold));
    return (__uint_as_float(WidenLow(word)) >= low ? 0x0000FFFFu : 0u) |
           (__uint_as_float(WidenHigh(word)) >= low ? 0xFFFF0000u : 0u);
#endif
  }
};
template <>
struct RowElements<ScoreType::kFloat16> {
  using Storage = unsigned short;
  static constexpr int kKeyStepBits = 13;  // 11 significant bits of 24, subnormals included
  __device__ __forceinline__ static uint32_t Widen(unsigned short bits) {
    return WidenF16Bits(bits);
  }
  __device__ __forceinline__ static uint32_t WidenLow(uint32_t word) {
    return Widen(static_cast<unsigned short>(word & 0xFFFFu));
  }
  __device__ __forceinline__ static uint32_t WidenHigh(uint32_t word) {
    return Widen(static_cast<unsigned short>(word >> 16));
  }
  // The smallest float16 >= threshold (a float32, not NaN; rounding up is exact and keeps
  // subnormals), in both halves.
  __device__ __forceinline__ static uint32_t PackedThreshold(float threshold) {
    const uint32_t rounded = __half_as_ushort(__float2half_ru(threshold));
    return rounded | (rounded << 16);
  }
  // 0xFFFF in each half of `word` whose element is >= the packed threshold's (an IEEE compare).
  __device__ __forceinline__ static uint32_t AtLeast(uint32_t word, uint32_t packed_threshold) {
    uint32_t mask;
    asm("set.ge.u32.f16x2 %0, %1, %2;" : "=r"(mask) : "r"(word), "r"(packed_threshold));
    return mask;
  }
};

// A 16-byte chunk's elements and the column stride between a thread's chunks of one tile (each
// warp load covers 512 contiguous bytes); a thread holds kFilterItems (kScanItems) values of a
// tile in kFilterChunks (kScanChunks) chunks; a filtering tile is kFilterTile columns, and the
// filtering pass prefetches kPrefetchAhead columns ahead (layout.cuh: the same bytes every type).
template <class Elements>
constexpr int kChunkElems = 16 / static_cast<int>(sizeof(typename Elements::Storage));
template <class Elements>
constexpr int kChunkStride = kChunkElems<Elements> * kThreadsPerBlock;
template <class Elements>
constexpr int kFilterItems = kFilterChunks * kChunkElems<Elements>;
template <class Elements>
constexpr int kFilterTile = kFilterItems<Elements> * kThreadsPerBlock;
template <class Elements>
constexpr int kPrefetchAhead = kPrefetchTiles * kFilterTile<Elements>;
template <class Elements>
constexpr int kScanChunks = kScanItems / kChunkElems<Elements>;

// The widened value of one element.
template <class Elements>
__device__ __forceinline__ float WidenedValue(typename Elements::Storage element) {
  return __uint_as_float(Elements::Widen(element));
}

}  // namespace
}  // namespace jax_topk
