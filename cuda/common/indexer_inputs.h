// The indexer's input elements widened to float32, exactly (every bfloat16 and every
// float8_e4m3fn value is a float32 value): one decoding for the CPU handler and the CUDA
// kernels, so both read the same numbers. Header-only; compiled by g++ and nvcc alike.
#pragma once

#include <cstdint>

#include "common/topk_common.h"

namespace jax_topk {

// The logits' float32 sums in blocks (docs/contract.md section 9): a dot's terms over d summed
// in order kIndexerDotBlock at a time, those sums added in order; the heads' terms likewise,
// kIndexerHeadBlock at a time. Keeps every logit within the contract's accuracy bound for D and
// H in the thousands, where sums in order of D + H >~ 335 terms could leave it.
constexpr int64_t kIndexerDotBlock = 128;
constexpr int64_t kIndexerHeadBlock = 64;

TOPK_HOST_DEVICE uint32_t Float32BitsOfBf16(uint16_t bits) {
  return static_cast<uint32_t>(bits) << 16;  // bfloat16 is float32's top half
}

// float8_e4m3fn: sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities, and
// S.1111.111 is NaN. Normal values move their fields into float32's; subnormals (exponent 0,
// m * 2^-9) are normalised by hand so no float arithmetic is involved.
TOPK_HOST_DEVICE uint32_t Float32BitsOfFp8E4M3(uint8_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x80u) << 24;
  const uint32_t exponent = (bits >> 3) & 0xFu;
  uint32_t mantissa = bits & 0x7u;
  if (exponent == 0xFu && mantissa == 0x7u) return sign | 0x7FC00000u;
  if (exponent != 0) return sign | ((exponent + 120u) << 23) | (mantissa << 20);
  if (mantissa == 0) return sign;  // +-0
  int32_t unbiased = -6;  // m * 2^-9 = (m / 4) * 2^-7 ...: shift the leading one into place
  while (!(mantissa & 0x4u)) {
    mantissa <<= 1;
    --unbiased;
  }
  return sign | (static_cast<uint32_t>(unbiased - 1 + 127) << 23) | ((mantissa & 0x3u) << 21);
}

}  // namespace jax_topk
