// topk_filtered: exact top-k of long float32, bfloat16 or float16 rows, with an optional values
// output (docs/contract.md section 2). Per row (one header per phase in kernels/filtered/):
//  1. Sample (sample.cuh): a regular 1/s sample of whole lines proposes a cutoff keeping ~k
//     candidates (+ slack) and a deeper secondary.
//  2. Filtering pass (filtering_pass.cuh): one read of the row in 16-byte loads of its own type,
//     each value widened exactly to float32 (elements.cuh: all later phases see float32 bits),
//     with a bulk L2 prefetch ahead; keeps the values >= cutoff in shared memory, then a slice.
//  3. Selection (selection.cuh): bins relative to the cutoff, one warp ranking the k-th key's few
//     members (else 11+11+10-bit radix digits); the tied columns give the quota.
//  4. Winners (winners.cuh): a bitmap read in column order, or a block radix sort carrying each
//     winner's value, written with its index. Routes (row_runner.cuh): short of k, the secondary
//     cutoff; still short, or more kept than fits, the exact route (radix passes over the row).
// Modes (launch_plan.cuh picks): a queue of rows for a pool of workers (queue_worker.cuh), or a
// thread block cluster per row whose blocks add up their histograms (cluster_split.cuh).
// Traffic: the sample (<= 1/8 of the row) + one read. Limits: width < 2^31, k <= kMaxK.
// k = 1 goes to topk_argmax.cu where TopkArgmaxServes says so, 16-bit rows of at most
// kMaxBf16Width columns to topk_bf16.cu (TopkBf16TakesFilteredRows). Few rows of at most
// kF32ClusterMaxWidth float32 (kF32ClusterMaxWidth16 16-bit) columns go to
// topk_f32_cluster.cu instead, and some more rows of at most kF32RowsMaxWidth columns (16-bit:
// many rows of at most kF32RowsManyMaxWidth) to topk_f32_rows.cu.
#include <climits>

#include "common/topk_problem.h"
#include "kernels/filtered/typed_launches.h"
#include "kernels/topk_cuda.h"

namespace jax_topk {

cudaError_t LaunchTopkFiltered(const TopkProblem& problem, void* workspace, size_t workspace_bytes,
                               cudaStream_t stream) {
  if (problem.rows <= 0) return cudaSuccess;
  if (problem.k < 1 || problem.k > kMaxK || problem.width < 1 || problem.width > INT_MAX ||
      problem.rows_per_group < 1 || problem.scores == nullptr || problem.out == nullptr ||
      workspace == nullptr || workspace_bytes < kFilteredMinWorkspaceBytes) {
    return cudaErrorInvalidValue;
  }
  // A sibling forced by the environment (its tests, benchmarks) takes k = 1 calls too.
  const bool sibling_forced = TopkF32ClusterForced() || TopkF32RowsForced();
  if (!sibling_forced && TopkArgmaxServes(problem)) return LaunchTopkArgmax(problem, stream);
  if (!sibling_forced && TopkBf16TakesFilteredRows(problem)) return LaunchTopkBf16(problem, stream);
  if (TopkF32ClusterServes(problem)) return LaunchTopkF32Cluster(problem, stream);
  if (TopkF32ClusterRequired()) return cudaErrorNotSupported;  // tests: it alone, or an error
  if (TopkF32RowsServes(problem)) return LaunchTopkF32Rows(problem, stream);
  switch (problem.score_type) {
    case ScoreType::kFloat32:
      return LaunchFilteredFloat32Rows(problem, workspace, workspace_bytes, stream);
    case ScoreType::kBfloat16:
      return LaunchFilteredBfloat16Rows(problem, workspace, workspace_bytes, stream);
    case ScoreType::kFloat16:
      return LaunchFilteredFloat16Rows(problem, workspace, workspace_bytes, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace jax_topk
