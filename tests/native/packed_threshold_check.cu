// Exhaustive check of the 16-bit filtering pass's packed compare (kernels/filtered/elements.cuh):
// for every bfloat16 and float16 bit pattern e and every threshold t of a set that holds each
// widened 16-bit value, its float32 neighbours on both sides, +-0, +-inf, float32 subnormals and
// the largest finite floats, AtLeast(e, PackedThreshold(t)) must say exactly what the widened
// float32 compare `widen(e) >= t` says (NaN never kept). Build and run on a GPU:
//   nvcc -std=c++17 -arch=sm_90a -I cuda tests/native/packed_threshold_check.cu -o /tmp/check &&
//   /tmp/check
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "kernels/filtered/elements.cuh"

namespace jax_topk {
namespace {

// Grid-stride over thresholds; each thread tests every element pair of the 16-bit space.
template <ScoreType kType>
__global__ void CountMismatches(const float* thresholds, int count,
                                unsigned long long* mismatches) {
  using Elements = RowElements<kType>;
  for (int t = blockIdx.x; t < count; t += gridDim.x) {
    const float threshold = thresholds[t];
    const uint32_t packed = Elements::PackedThreshold(threshold);
    unsigned long long wrong = 0;
    for (uint32_t low = threadIdx.x; low < 65536u; low += blockDim.x) {
      // Every pattern once in each half.
      const uint32_t word = low | ((low ^ 0x5A5Au) << 16);
      const uint32_t mask = Elements::AtLeast(word, packed);
      const bool want_low = __uint_as_float(Elements::WidenLow(word)) >= threshold;
      const bool want_high = __uint_as_float(Elements::WidenHigh(word)) >= threshold;
      wrong += ((mask & 0xFFFFu) == 0xFFFFu) != want_low;
      wrong += ((mask >> 16) == 0xFFFFu) != want_high;
      wrong += (mask & 0xFFFFu) != 0 && (mask & 0xFFFFu) != 0xFFFFu;  // a half is all or none
      wrong += (mask >> 16) != 0 && (mask >> 16) != 0xFFFFu;
    }
    if (wrong) atomicAdd(mismatches, wrong);
  }
}

}  // namespace
}  // namespace jax_topk

template <jax_topk::ScoreType kType>
unsigned long long Check(uint32_t (*widen)(uint32_t)) {
  std::vector<float> thresholds;
  const auto add = [&](uint32_t bits) {
    float f;
    memcpy(&f, &bits, 4);
    if (f == f) thresholds.push_back(f);  // never NaN: KeepThreshold clamps
  };
  for (uint32_t e = 0; e < 65536; ++e) {
    const uint32_t w = widen(e);
    add(w);
    if (e % 16 == 0 || (e & 0x7FFFu) < 64 ||
        (e & 0x7FFFu) > 0x7BC0) {  // in between, near 0, near inf
      add(w + 1);
      add(w - 1);
      add(w + 4096);
      add(w - 4096);
    }
  }
  for (uint32_t bits :
       {0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x00000001u, 0x80000001u, 0x007FFFFFu,
        0x807FFFFFu, 0x7F7FFFFFu, 0xFF7FFFFFu, 0x477FE000u, 0x477FF000u, 0x477FF001u, 0xC77FF000u,
        0xC77FF001u, 0x33800000u, 0x33000000u, 0x33000001u, 0xB3000001u})
    add(bits);
  float* device_thresholds = nullptr;
  unsigned long long* mismatches = nullptr;
  cudaMalloc(&device_thresholds, thresholds.size() * sizeof(float));
  cudaMalloc(&mismatches, sizeof(unsigned long long));
  cudaMemcpy(device_thresholds, thresholds.data(), thresholds.size() * sizeof(float),
             cudaMemcpyHostToDevice);
  cudaMemset(mismatches, 0, sizeof(unsigned long long));
  jax_topk::CountMismatches<kType>
      <<<1024, 512>>>(device_thresholds, static_cast<int>(thresholds.size()), mismatches);
  unsigned long long wrong = ~0ull;
  if (cudaMemcpy(&wrong, mismatches, sizeof(wrong), cudaMemcpyDeviceToHost) != cudaSuccess) {
    std::printf("CUDA error: %s\n", cudaGetErrorString(cudaGetLastError()));
  }
  std::printf("%zu thresholds x 131072 elements: %llu mismatches\n", thresholds.size(), wrong);
  cudaFree(device_thresholds);
  cudaFree(mismatches);
  return wrong;
}

uint32_t WidenBf16(uint32_t e) {
  return e << 16;
}
uint32_t WidenF16(uint32_t e) {  // IEEE half to float, by hand (host side)
  const uint32_t sign = (e & 0x8000u) << 16;
  const uint32_t exponent = (e >> 10) & 0x1Fu;
  uint32_t mantissa = e & 0x3FFu;
  if (exponent == 0x1F) return sign | 0x7F800000u | (mantissa << 13);
  if (exponent != 0) return sign | ((exponent + 112) << 23) | (mantissa << 13);
  if (mantissa == 0) return sign;
  int shift = 0;  // a subnormal: normalise
  while (!(mantissa & 0x400u)) {
    mantissa <<= 1;
    ++shift;
  }
  return sign | ((113 - shift) << 23) | ((mantissa & 0x3FFu) << 13);
}

int main() {
  std::printf("bfloat16: ");
  const unsigned long long bf16 = Check<jax_topk::ScoreType::kBfloat16>(WidenBf16);
  std::printf("float16: ");
  const unsigned long long f16 = Check<jax_topk::ScoreType::kFloat16>(WidenF16);
  const bool ok = bf16 == 0 && f16 == 0;
  std::printf(ok ? "packed threshold check: OK\n" : "packed threshold check: FAILED\n");
  return ok ? 0 : 1;
}
