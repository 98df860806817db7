// LaunchIndexerLogits: the one place that picks the kernel of indexer_logits (and of
// indexer_topk's logits). For one problem on one device the choice is fixed, so the same
// inputs give the same bits run to run, which indexer_topk's bit-exactness relies on.
#include <cuda_runtime.h>

#include "kernels/indexer_cuda.h"

namespace jax_topk {

cudaError_t LaunchIndexerLogits(const IndexerProblem& problem, cudaStream_t stream) {
  // The tensor-core kernel where it applies (bf16, H = 64, D = 128 on an sm_90 GPU).
  int device = 0;
  if (cudaGetDevice(&device) == cudaSuccess && IndexerLogitsWgmmaSupports(problem, device))
    return LaunchIndexerLogitsWgmma(problem, stream);
  return LaunchIndexerLogitsSimt(problem, stream);
}

}  // namespace jax_topk
