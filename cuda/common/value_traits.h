// How each score or value type reads as an ordered key (common/topk_common.h) and back, and
// what an empty slot's value holds: for the CPU top-k, the CPU merge and the merge kernel. bfloat16
// and float16 share the 16-bit key transform and differ in NaN and -inf. The key transform is a
// bijection on the bits, so a value rebuilt from its key has exactly its input bits.
#pragma once

#include <cstdint>

#include "common/topk_common.h"

namespace jax_topk {

struct F32Values {
  using Bits = uint32_t;
  static constexpr int kKeyBits = 32;
  static constexpr Bits kEmpty = kNegInfF32Bits;
  static TOPK_HOST_DEVICE bool IsNan(Bits bits) { return IsNanF32(bits); }
  static TOPK_HOST_DEVICE uint32_t Key(Bits bits) { return OrderedKeyF32(bits); }
  static TOPK_HOST_DEVICE Bits FromKey(uint32_t key) { return BitsFromOrderedKeyF32(key); }
};
struct Bf16Values {
  using Bits = uint16_t;
  static constexpr int kKeyBits = 16;
  static constexpr Bits kEmpty = kNegInfBf16Bits;
  static TOPK_HOST_DEVICE bool IsNan(Bits bits) { return IsNanBf16(bits); }
  static TOPK_HOST_DEVICE uint32_t Key(Bits bits) { return OrderedKeyBf16(bits); }
  static TOPK_HOST_DEVICE Bits FromKey(uint32_t key) { return BitsFromOrderedKeyBf16(key); }
};
struct F16Values : Bf16Values {
  static constexpr Bits kEmpty = kNegInfF16Bits;
  static TOPK_HOST_DEVICE bool IsNan(Bits bits) { return IsNanF16(bits); }
};

}  // namespace jax_topk
