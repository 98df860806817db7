// The filtered kernel's launch for each score type, one translation unit each
// (kernels/topk_filtered_<type>.cu); LaunchTopkFiltered (kernels/topk_filtered.cu) checks the
// problem and picks one.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "common/topk_problem.h"

namespace jax_topk {

cudaError_t LaunchFilteredFloat32Rows(const TopkProblem& problem, void* workspace,
                                      size_t workspace_bytes, cudaStream_t stream);
cudaError_t LaunchFilteredBfloat16Rows(const TopkProblem& problem, void* workspace,
                                       size_t workspace_bytes, cudaStream_t stream);
cudaError_t LaunchFilteredFloat16Rows(const TopkProblem& problem, void* workspace,
                                      size_t workspace_bytes, cudaStream_t stream);

}  // namespace jax_topk
