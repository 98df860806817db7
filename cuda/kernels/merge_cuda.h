// merge_topk's CUDA entry point, called by the CUDA FFI binding (ffi/topk_cuda_ffi.cc). All
// pointers in the problem are device pointers; the launch neither synchronises the host nor
// allocates, so it can be captured into a CUDA graph.
#pragma once

#include <cuda_runtime.h>

#include "common/merge_problem.h"

namespace jax_topk {

// width <= kMaxMergeWidth, 1 <= k <= min(width, kMaxK) (else cudaErrorInvalidValue).
cudaError_t LaunchMergeTopk(const MergeProblem& problem, cudaStream_t stream);

}  // namespace jax_topk
