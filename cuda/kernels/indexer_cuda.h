// The lightning indexer's CUDA entry points (docs/contract.md section 9), called by the CUDA
// FFI bindings. Device pointers only; nothing here synchronises the host or allocates.
#pragma once

#include <cuda_runtime.h>

#include "common/indexer_problem.h"

namespace jax_topk {

// Writes problem.logits. Picks the tensor-core kernel where it applies (Hopper, the shapes it
// supports) and the portable kernel elsewhere; for one problem the choice is fixed, so the
// same inputs give the same bits run to run (indexer_topk relies on it).
cudaError_t LaunchIndexerLogits(const IndexerProblem& problem, cudaStream_t stream);

// The portable CUDA-core kernel (any sm_80+ GPU, any H and D): the simple exact reference
// of the GPU path.
cudaError_t LaunchIndexerLogitsSimt(const IndexerProblem& problem, cudaStream_t stream);

// The Hopper tensor-core kernel (kernels/indexer_logits_wgmma.cu). Supports(problem, device)
// says whether it may run `problem` on `device` (an sm_90 GPU, a build with sm_90a code, the
// shapes it handles); the launch returns cudaErrorInvalidValue for a problem it does not.
bool IndexerLogitsWgmmaSupports(const IndexerProblem& problem, int device);
cudaError_t LaunchIndexerLogitsWgmma(const IndexerProblem& problem, cudaStream_t stream);

}  // namespace jax_topk
