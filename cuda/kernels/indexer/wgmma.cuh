// wgmma.mma_async m64nNkK into f32 accumulators, both operands K-major in shared memory
// (sm_90a only): bf16 x bf16 and f16 x f16 (k16), e4m3 x e4m3 (k32). PTX takes the accumulators as
// N/2 separate registers, so one macro an N writes the operand list out and each input type names
// its instruction. `accumulate` = 0 overwrites the accumulators (the first k-step of a chain).
#pragma once

#include <cstdint>

namespace jax_topk {
namespace indexer {

// How the kernel takes its input type (q and keys share one): `Bits` in memory, operands of
// kOperandBytes in shared memory (kConvert: fp8 codes widened to exact f16 on the way in).
// kFp8Values: every value is an e4m3 value (|dot| <= 128 x 448^2 over D = 128).
struct Bf16Input {
  using Bits = uint16_t;
  static constexpr int kOperandBytes = 2;
  static constexpr int kKStep = 16;  // wgmma's K
  static constexpr bool kConvert = false;
  static constexpr bool kFp8Values = false;
};
struct Fp8E4M3Input {  // e4m3 wgmma: twice the rate, 14-bit aligned sums (below)
  using Bits = uint8_t;
  static constexpr int kOperandBytes = 1;
  static constexpr int kKStep = 32;
  static constexpr bool kConvert = false;
  static constexpr bool kFp8Values = true;
};
struct Fp8AsF16Input {  // e4m3 widened to f16 (exact, NaN kept): bf16's rate and accuracy
  using Bits = uint8_t;
  static constexpr int kOperandBytes = 2;
  static constexpr int kKStep = 16;
  static constexpr bool kConvert = true;
  static constexpr bool kFp8Values = true;
};
struct Fp8WidenedInput {  // e4m3 widened to f16 before the kernel (common/indexer_widened.h)
  using Bits = uint16_t;
  static constexpr int kOperandBytes = 2;
  static constexpr int kKStep = 16;
  static constexpr bool kConvert = false;
  static constexpr bool kFp8Values = true;
};

template <typename Input, int kCols>
__device__ __forceinline__ void Wgmma(float (&acc)[kCols / 2], uint64_t desc_a, uint64_t desc_b,
                                      int accumulate);

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// `instruction` ends in the types; bf16 takes two more immediates (no transposes) than fp8.

#define JAX_TOPK_WGMMA_N64(instruction, immediates)                                                \
  asm volatile(                                                                                    \
      "{\n.reg .pred p;\n"                                                                         \
      "setp.ne.b32 p, %34, 0;\n" instruction                                                       \
      " {"                                                                                         \
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24," \
      "%25,%26,%27,%28,%29,%30,%31"                                                                \
      "}, %32, %33, p, 1, 1" immediates ";\n}\n"                                                   \
      : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3]), "+f"(acc[4]), "+f"(acc[5]),        \
        "+f"(acc[6]), "+f"(acc[7]), "+f"(acc[8]), "+f"(acc[9]), "+f"(acc[10]), "+f"(acc[11]),      \
        "+f"(acc[12]), "+f"(acc[13]), "+f"(acc[14]), "+f"(acc[15]), "+f"(acc[16]), "+f"(acc[17]),  \
        "+f"(acc[18]), "+f"(acc[19]), "+f"(acc[20]), "+f"(acc[21]), "+f"(acc[22]), "+f"(acc[23]),  \
        "+f"(acc[24]), "+f"(acc[25]), "+f"(acc[26]), "+f"(acc[27]), "+f"(acc[28]), "+f"(acc[29]),  \
        "+f"(acc[30]), "+f"(acc[31])                                                               \
      : "l"(desc_a), "l"(desc_b), "r"(accumulate))

#define JAX_TOPK_WGMMA_N128(instruction, immediates)                                               \
  asm volatile(                                                                                    \
      "{\n.reg .pred p;\n"                                                                         \
      "setp.ne.b32 p, %66, 0;\n" instruction                                                       \
      " {"                                                                                         \
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24," \
      "%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%"  \
      "47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"                         \
      "}, %64, %65, p, 1, 1" immediates ";\n}\n"                                                   \
      : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3]), "+f"(acc[4]), "+f"(acc[5]),        \
        "+f"(acc[6]), "+f"(acc[7]), "+f"(acc[8]), "+f"(acc[9]), "+f"(acc[10]), "+f"(acc[11]),      \
        "+f"(acc[12]), "+f"(acc[13]), "+f"(acc[14]), "+f"(acc[15]), "+f"(acc[16]), "+f"(acc[17]),  \
        "+f"(acc[18]), "+f"(acc[19]), "+f"(acc[20]), "+f"(acc[21]), "+f"(acc[22]), "+f"(acc[23]),  \
        "+f"(acc[24]), "+f"(acc[25]), "+f"(acc[26]), "+f"(acc[27]), "+f"(acc[28]), "+f"(acc[29]),  \
        "+f"(acc[30]), "+f"(acc[31]), "+f"(acc[32]), "+f"(acc[33]), "+f"(acc[34]), "+f"(acc[35]),  \
        "+f"(acc[36]), "+f"(acc[37]), "+f"(acc[38]), "+f"(acc[39]), "+f"(acc[40]), "+f"(acc[41]),  \
        "+f"(acc[42]), "+f"(acc[43]), "+f"(acc[44]), "+f"(acc[45]), "+f"(acc[46]), "+f"(acc[47]),  \
        "+f"(acc[48]), "+f"(acc[49]), "+f"(acc[50]), "+f"(acc[51]), "+f"(acc[52]), "+f"(acc[53]),  \
        "+f"(acc[54]), "+f"(acc[55]), "+f"(acc[56]), "+f"(acc[57]), "+f"(acc[58]), "+f"(acc[59]),  \
        "+f"(acc[60]), "+f"(acc[61]), "+f"(acc[62]), "+f"(acc[63])                                 \
      : "l"(desc_a), "l"(desc_b), "r"(accumulate))

#define JAX_TOPK_WGMMA_N256(instruction, immediates)                                               \
  asm volatile(                                                                                    \
      "{\n.reg .pred p;\n"                                                                         \
      "setp.ne.b32 p, %130, 0;\n" instruction                                                      \
      " {"                                                                                         \
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24," \
      "%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%"  \
      "47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%"   \
      "69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%"   \
      "91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110," \
      "%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127"       \
      "}, %128, %129, p, 1, 1" immediates ";\n}\n"                                                 \
      : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3]), "+f"(acc[4]), "+f"(acc[5]),        \
        "+f"(acc[6]), "+f"(acc[7]), "+f"(acc[8]), "+f"(acc[9]), "+f"(acc[10]), "+f"(acc[11]),      \
        "+f"(acc[12]), "+f"(acc[13]), "+f"(acc[14]), "+f"(acc[15]), "+f"(acc[16]), "+f"(acc[17]),  \
        "+f"(acc[18]), "+f"(acc[19]), "+f"(acc[20]), "+f"(acc[21]), "+f"(acc[22]), "+f"(acc[23]),  \
        "+f"(acc[24]), "+f"(acc[25]), "+f"(acc[26]), "+f"(acc[27]), "+f"(acc[28]), "+f"(acc[29]),  \
        "+f"(acc[30]), "+f"(acc[31]), "+f"(acc[32]), "+f"(acc[33]), "+f"(acc[34]), "+f"(acc[35]),  \
        "+f"(acc[36]), "+f"(acc[37]), "+f"(acc[38]), "+f"(acc[39]), "+f"(acc[40]), "+f"(acc[41]),  \
        "+f"(acc[42]), "+f"(acc[43]), "+f"(acc[44]), "+f"(acc[45]), "+f"(acc[46]), "+f"(acc[47]),  \
        "+f"(acc[48]), "+f"(acc[49]), "+f"(acc[50]), "+f"(acc[51]), "+f"(acc[52]), "+f"(acc[53]),  \
        "+f"(acc[54]), "+f"(acc[55]), "+f"(acc[56]), "+f"(acc[57]), "+f"(acc[58]), "+f"(acc[59]),  \
        "+f"(acc[60]), "+f"(acc[61]), "+f"(acc[62]), "+f"(acc[63]), "+f"(acc[64]), "+f"(acc[65]),  \
        "+f"(acc[66]), "+f"(acc[67]), "+f"(acc[68]), "+f"(acc[69]), "+f"(acc[70]), "+f"(acc[71]),  \
        "+f"(acc[72]), "+f"(acc[73]), "+f"(acc[74]), "+f"(acc[75]), "+f"(acc[76]), "+f"(acc[77]),  \
        "+f"(acc[78]), "+f"(acc[79]), "+f"(acc[80]), "+f"(acc[81]), "+f"(acc[82]), "+f"(acc[83]),  \
        "+f"(acc[84]), "+f"(acc[85]), "+f"(acc[86]), "+f"(acc[87]), "+f"(acc[88]), "+f"(acc[89]),  \
        "+f"(acc[90]), "+f"(acc[91]), "+f"(acc[92]), "+f"(acc[93]), "+f"(acc[94]), "+f"(acc[95]),  \
        "+f"(acc[96]), "+f"(acc[97]), "+f"(acc[98]), "+f"(acc[99]), "+f"(acc[100]),                \
        "+f"(acc[101]), "+f"(acc[102]), "+f"(acc[103]), "+f"(acc[104]), "+f"(acc[105]),            \
        "+f"(acc[106]), "+f"(acc[107]), "+f"(acc[108]), "+f"(acc[109]), "+f"(acc[110]),            \
        "+f"(acc[111]), "+f"(acc[112]), "+f"(acc[113]), "+f"(acc[114]), "+f"(acc[115]),            \
        "+f"(acc[116]), "+f"(acc[117]), "+f"(acc[118]), "+f"(acc[119]), "+f"(acc[120]),            \
        "+f"(acc[121]), "+f"(acc[122]), "+f"(acc[123]), "+f"(acc[124]), "+f"(acc[125]),            \
        "+f"(acc[126]), "+f"(acc[127])                                                             \
      : "l"(desc_a), "l"(desc_b), "r"(accumulate))

#define JAX_TOPK_WGMMA_BODY(n, instruction, immediates) JAX_TOPK_WGMMA_N##n(instruction, immediates)
#else
#define JAX_TOPK_WGMMA_BODY(n, instruction, immediates) \
  __trap() /* built without sm_90a: Supports() never lets a launch reach here */
#endif

template <>
__device__ __forceinline__ void Wgmma<Bf16Input, 64>(float (&acc)[32], uint64_t desc_a,
                                                     uint64_t desc_b, int accumulate) {
  JAX_TOPK_WGMMA_BODY(64, "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16", ", 0, 0");
}

template <>
__device__ __forceinline__ void Wgmma<Fp8E4M3Input, 64>(float (&acc)[32], uint64_t desc_a,
                                                        uint64_t desc_b, int accumulate) {
  JAX_TOPK_WGMMA_BODY(64, "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3", "");
}

template <>
__device__ __forceinline__ void Wgmma<Bf16Input, 128>(float (&acc)[64], uint64_t desc_a,
                                                      uint64_t desc_b, int accumulate) {
  JAX_TOPK_WGMMA_BODY(128, "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16", ", 0, 0");
}

template <>
__device__ __forceinline__ void Wgmma<Fp8E4M3Input, 128>(float (&acc)[64], uint64_t desc_a,
                                                         uint64_t desc_b, int accumulate) {
  JAX_TOPK_WGMMA_BODY(128, "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3", "");
}

template <>
__device__ __forceinline__ void Wgmma<Bf16Input, 256>(float (&acc)[128], uint64_t desc_a,
                                                      uint64_t desc_b, int accumulate) {
  JAX_TOPK_WGMMA_BODY(256, "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16", ", 0, 0");
}

template <>
__device__ __forceinline__ void Wgmma<Fp8E4M3Input, 256>(float (&acc)[128], uint64_t desc_a,
                                                         uint64_t desc_b, int accumulate) {
  JAX_TOPK_WGMMA_BODY(256, "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3", "");
}

template <>
__device__ __forceinline__ void Wgmma<Fp8AsF16Input, 64>(float (&acc)[32], uint64_t desc_a,
                                                         uint64_t desc_b, int accumulate) {
  JAX_TOPK_WGMMA_BODY(64, "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16", ", 0, 0");
}

template <>
__device__ __forceinline__ void Wgmma<Fp8AsF16Input, 128>(float (&acc)[64], uint64_t desc_a,
                                                          uint64_t desc_b, int accumulate) {
  JAX_TOPK_WGMMA_BODY(128, "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16", ", 0, 0");
}

template <>
__device__ __forceinline__ void Wgmma<Fp8AsF16Input, 256>(float (&acc)[128], uint64_t desc_a,
                                                          uint64_t desc_b, int accumulate) {
  JAX_TOPK_WGMMA_BODY(256, "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16", ", 0, 0");
}

// Widened before the kernel or in shared memory: the same f16 operands, the same instruction.
template <>
__device__ __forceinline__ void Wgmma<Fp8WidenedInput, 64>(float (&acc)[32], uint64_t desc_a,
                                                           uint64_t desc_b, int accumulate) {
  Wgmma<Fp8AsF16Input, 64>(acc, desc_a, desc_b, accumulate);
}

template <>
__device__ __forceinline__ void Wgmma<Fp8WidenedInput, 128>(float (&acc)[64], uint64_t desc_a,
                                                            uint64_t desc_b, int accumulate) {
  Wgmma<Fp8AsF16Input, 128>(acc, desc_a, desc_b, accumulate);
}

template <>
__device__ __forceinline__ void Wgmma<Fp8WidenedInput, 256>(float (&acc)[128], uint64_t desc_a,
                                                            uint64_t desc_b, int accumulate) {
  Wgmma<Fp8AsF16Input, 256>(acc, desc_a, desc_b, accumulate);
}

#undef JAX_TOPK_WGMMA_BODY
#undef JAX_TOPK_WGMMA_N64
#undef JAX_TOPK_WGMMA_N128
#undef JAX_TOPK_WGMMA_N256

}  // namespace indexer
}  // namespace jax_topk
