// topk_bf16's CUDA kernel is not built yet: the handler reports that clearly instead of
// returning a different result. (Replaced by the register-resident radix kernel.)
#include "topk_cuda.h"

namespace jax_topk {

cudaError_t LaunchTopkBf16(const TopkProblem&, cudaStream_t) {
  return cudaErrorNotSupported;
}

}  // namespace jax_topk
