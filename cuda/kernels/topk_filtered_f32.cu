// The filtered kernel instantiated for float32 rows (see kernels/topk_filtered.cu).
#include "kernels/filtered/launch_rows.cuh"

namespace jax_topk {

cudaError_t LaunchFilteredFloat32Rows(const TopkProblem& problem, void* workspace,
                                      size_t workspace_bytes, cudaStream_t stream) {
  return LaunchRowsOf<ScoreType::kFloat32>(problem, workspace, workspace_bytes, stream);
}

}  // namespace jax_topk
