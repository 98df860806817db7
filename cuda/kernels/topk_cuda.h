// The CUDA kernels' entry points, called by the CUDA FFI bindings (ffi/topk_cuda_ffi.cc).
// All pointers in the problem are device pointers; nothing here synchronises the host
// or allocates memory, so both launches can be captured into a CUDA graph.
#pragma once

#include <cuda_runtime.h>

#include "common/topk_common.h"
#include "common/topk_filtered_workspace.h"
#include "common/topk_problem.h"

namespace jax_topk {

// topk_bf16: width <= kMaxBf16Width, bfloat16 or float16 scores; writes `values` when not null.
cudaError_t LaunchTopkBf16(const TopkProblem& problem, cudaStream_t stream);
// topk_filtered's calls that LaunchTopkBf16 serves instead: 16-bit rows of at most
// kMaxBf16Width columns (measured faster at every shape); JAX_TOPK_SHORT_16BIT=own, read at each
// launch, keeps them on topk_filtered's own kernels (benchmarks, tests).
bool TopkBf16TakesFilteredRows(const TopkProblem& problem);

// topk_filtered: float32, bfloat16 or float16 scores of any width; values when asked.
// `workspace` is a device buffer of `workspace_bytes` (an extra output of the custom call,
// contents undefined on entry); the kernel adapts to its size, which must be at least
// kFilteredMinWorkspaceBytes.
constexpr size_t kFilteredMinWorkspaceBytes = kFilteredHeaderBytes;
cudaError_t LaunchTopkFiltered(const TopkProblem& problem, void* workspace, size_t workspace_bytes,
                               cudaStream_t stream);

// topk_small_rows: one warp per row, the row in its registers; float32, bfloat16 or float16
// scores, width <= kSmallRowsMaxWidth and k <= kSmallRowsMaxK (common/topk_common.h; else
// cudaErrorInvalidValue). Writes `values` too when it is not null.
cudaError_t LaunchTopkSmallRows(const TopkProblem& problem, cudaStream_t stream);

// topk_f32_rows: a block per float32 row of width <= kF32RowsMaxWidth, the row in its registers
// (1024 threads; 256 for more than kF32RowsManyMinRows rows of at most kF32RowsManyMaxWidth
// columns or kF32RowsNarrowMinRows of kF32RowsNarrowWidth, which also takes such bfloat16 and
// float16 rows); LaunchTopkFiltered hands it the calls TopkF32RowsServes, LaunchTopkBf16 those
// TopkF32RowsBeatsTopkBf16 (the row counts and widths where it measured faster; the environment
// variable JAX_TOPK_F32_ROWS=off, =always, =wide or =many overrides that at each launch, for
// benchmarks and tests).
constexpr int kF32RowsMaxWidth = 32768;
constexpr int kF32RowsManyMaxWidth = 8192;
constexpr int kF32RowsManyMinRows = 132;
constexpr int kF32RowsNarrowWidth = 4096;  // rows this short take the 256-thread block from
constexpr int kF32RowsNarrowMinRows = 48;  // this many rows
bool TopkF32RowsServes(const TopkProblem& problem);
bool TopkF32RowsForced();  // JAX_TOPK_F32_ROWS=always, =wide or =many
// LaunchTopkBf16's 16-bit rows it takes instead of topk_bf16's own kernel: hundreds to
// thousands of rows of at most kF32RowsNarrowWidth columns (or forced).
bool TopkF32RowsBeatsTopkBf16(const TopkProblem& problem);
cudaError_t LaunchTopkF32Rows(const TopkProblem& problem, cudaStream_t stream);

// topk_f32_cluster: a thread block cluster of 8 to 16 blocks per row of width <=
// kF32ClusterMaxWidth float32 or kF32ClusterMaxWidth16 bfloat16 / float16 scores (16 blocks past
// 8's 131072 / 98304 columns), each block a slice of the row in its registers as float32 keys;
// needs sm_90. LaunchTopkFiltered hands it the calls TopkF32ClusterServes (few rows: every row's
// cluster on its own SMs at once); JAX_TOPK_F32_CLUSTER=off or =always overrides that at each
// launch, JAX_TOPK_F32_CLUSTER_PARTS=2 to 16 the cluster size (benchmarks, tests). =only is
// =always, and a call it cannot take fails (TopkF32ClusterRequired): a test that forces it then
// cannot pass on another kernel's bits.
// topk_argmax: k = 1 of float32, bfloat16 or float16 rows of any width, a 256-thread block a row
// reading it once. LaunchTopkFiltered and LaunchTopkBf16 hand it the k = 1 calls
// TopkArgmaxServes (rows of at most kArgmaxAnyRowsWidth columns, or at least kArgmaxMinRows
// float32 rows); JAX_TOPK_ARGMAX=off or =always overrides that at each launch (benchmarks,
// tests). LaunchTopkFiltered asks it only when no sibling is forced (TopkF32ClusterForced,
// TopkF32RowsForced), so their tests get their own kernel at k = 1 too.
constexpr int64_t kArgmaxMinRows = 128;
constexpr int64_t kArgmaxAnyRowsWidth = 16384;
bool TopkArgmaxServes(const TopkProblem& problem);
cudaError_t LaunchTopkArgmax(const TopkProblem& problem, cudaStream_t stream);

constexpr int64_t kF32ClusterMaxWidth = 262144;
constexpr int64_t kF32ClusterMaxWidth16 = 196608;
bool TopkF32ClusterServes(const TopkProblem& problem);
bool TopkF32ClusterRequired();
bool TopkF32ClusterForced();  // JAX_TOPK_F32_CLUSTER=always or =only
cudaError_t LaunchTopkF32Cluster(const TopkProblem& problem, cudaStream_t stream);

}  // namespace jax_topk
