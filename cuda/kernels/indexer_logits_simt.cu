// The lightning indexer's portable CUDA-core kernel (LaunchIndexerLogitsSimt): the simple
// exact reference of the GPU path, for any sm_80+ GPU and any H and D.
// Algorithm: a block of 128 threads per query row (grid.x) and tile of 128 keys (grid.y,
// grid-stride past 65535 tiles); each thread computes one logit in the CPU handler's order:
// for h in order, dot = sum over d in order of q * key (fma: the product of two bf16 or fp8
// values is exact, so this rounds as the CPU's add), times key_scales, relu, then
// logit += weights * relu with separate rounded multiply and add; past kIndexerDotBlock d or
// kIndexerHeadBlock heads, in the CPU's blocks (common/indexer_inputs.h). So its bits equal the
// CPU handler's (not a promise of the contract: another kernel may order the sums differently).
// Memory: q and weights read as warp-uniform broadcasts, each key row re-read from L1/L2 once
// a head; writes [M, N] float32 once. Limits: far from the tensor-core rate (no tiling).
#include <cuda_runtime.h>

#include <cstdint>

#include "common/indexer_inputs.h"
#include "common/topk_common.h"
#include "kernels/indexer_cuda.h"

namespace jax_topk {
namespace {

constexpr int kKeysPerBlock = 128;  // one key a thread
constexpr int64_t kMaxGridY = 65535;

struct Bf16Input {
  using Bits = uint16_t;
  static __device__ __forceinline__ float Widen(Bits bits) {
    return __uint_as_float(Float32BitsOfBf16(bits));
  }
};
struct Fp8E4M3Input {
  using Bits = uint8_t;
  static __device__ __forceinline__ float Widen(Bits bits) {
    return __uint_as_float(Float32BitsOfFp8E4M3(bits));
  }
};

template <typename Input>
__global__ void __launch_bounds__(kKeysPerBlock)
    IndexerLogitsSimtKernel(IndexerProblem p, int64_t key_tiles) {
  using Bits = typename Input::Bits;
  const int64_t row = blockIdx.x;  // b * M + t
  const int64_t batch_index = row / p.queries;
  const int64_t n = p.keys_count, heads = p.heads, head_dim = p.head_dim;
  const int64_t length = p.lengths == nullptr ? n : ClampLength(p.lengths[row], n);
  const Bits* q = static_cast<const Bits*>(p.q) + row * heads * head_dim;
  const Bits* keys = static_cast<const Bits*>(p.keys) + batch_index * n * head_dim;
  const float* weights = p.weights + row * heads;
  const float* scales = p.key_scales == nullptr ? nullptr : p.key_scales + batch_index * n;
  float* out = p.logits + row * n;
  for (int64_t tile = blockIdx.y; tile < key_tiles; tile += gridDim.y) {
    const int64_t s = tile * kKeysPerBlock + threadIdx.x;
    if (s >= n) continue;
    if (s >= length) {
      out[s] = __uint_as_float(kNegInfF32Bits);
      continue;
    }
    const Bits* key = keys + s * head_dim;
    float logit = 0.0f;
#pragma unroll 1
    for (int64_t first_head = 0; first_head < heads; first_head += kIndexerHeadBlock) {
      const int64_t end_head = min(first_head + kIndexerHeadBlock, heads);
      float head_sum = 0.0f;  // this block of heads, in order from 0
      for (int64_t h = first_head; h < end_head; ++h) {
        float dot = 0.0f;
#pragma unroll 1
        for (int64_t first = 0; first < head_dim; first += kIndexerDotBlock) {
          const int64_t end = min(first + kIndexerDotBlock, head_dim);
          float partial = 0.0f;  // this block of d, in order from 0
          for (int64_t d = first; d < end; ++d)
            partial = __fmaf_rn(Input::Widen(q[h * head_dim + d]), Input::Widen(key[d]), partial);
          dot = first == 0 ? partial : __fadd_rn(dot, partial);
        }
        const float scaled = scales == nullptr ? dot : __fmul_rn(dot, scales[s]);
        const float relu = scaled < 0.0f ? 0.0f : scaled;  // NaN stays NaN, as on the CPU
        head_sum = __fadd_rn(head_sum, __fmul_rn(weights[h], relu));
      }
      logit = first_head == 0 ? head_sum : __fadd_rn(logit, head_sum);
    }
    out[s] = logit;
  }
}

}  // namespace

cudaError_t LaunchIndexerLogitsSimt(const IndexerProblem& problem, cudaStream_t stream) {
  const int64_t rows = problem.batch * problem.queries;
  if (rows == 0 || problem.keys_count == 0) return cudaSuccess;
  if (rows > 0x7FFFFFFF) return cudaErrorInvalidValue;
  const int64_t key_tiles = (problem.keys_count + kKeysPerBlock - 1) / kKeysPerBlock;
  const dim3 grid(static_cast<unsigned>(rows),
                  static_cast<unsigned>(key_tiles < kMaxGridY ? key_tiles : kMaxGridY));
  if (problem.input == IndexerInput::kBfloat16)
    IndexerLogitsSimtKernel<Bf16Input><<<grid, kKeysPerBlock, 0, stream>>>(problem, key_tiles);
  else
    IndexerLogitsSimtKernel<Fp8E4M3Input><<<grid, kKeysPerBlock, 0, stream>>>(problem, key_tiles);
  return cudaGetLastError();
}

}  // namespace jax_topk
