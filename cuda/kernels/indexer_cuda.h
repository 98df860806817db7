// The lightning indexer's CUDA entry points (docs/contract.md section 9), called by the CUDA
// FFI bindings. Device pointers only; nothing here synchronises the host or allocates.
#pragma once

#include <cuda_runtime.h>

#include "common/indexer_problem.h"
#include "common/topk_problem.h"

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

// One pass of the tensor-core kernel over `problem` (problem.logits unused) for indexer_topk:
// the same logits bits as LaunchIndexerLogitsWgmma element for element, handed to one sink.
struct IndexerWgmmaPass {
  // false: write the logits of the pass's key tiles (the t-th to columns 64 t.. of rows of
  // logits_pitch floats); true: keep each row's values >= thresholds[row] at columns below its
  // length (NaN never) as (value bits, column) pairs in candidates [rows][capacity], counting
  // them in counts[row] (past the capacity too; zero before the pass).
  bool keeps_candidates = false;
  int32_t key_tile_stride = 1;  // the pass takes every key_tile_stride-th key tile
  // Or nullptr: every (sequence, query tile); else only the *tile_count listed ones
  // (sequence * query tiles + query tile, IndexerWgmmaQueriesPerTile queries a tile).
  const int32_t* tile_list = nullptr;
  const int32_t* tile_count = nullptr;
  float* logits = nullptr;
  int64_t logits_pitch = 0;
  const float* thresholds = nullptr;
  int32_t* counts = nullptr;
  void* candidates = nullptr;  // uint2 pairs
  int32_t capacity = 0;
};
int IndexerWgmmaQueriesPerTile(const IndexerProblem& problem);
cudaError_t LaunchIndexerWgmmaPass(const IndexerProblem& problem, const IndexerWgmmaPass& pass,
                                   cudaStream_t stream);

// indexer_topk (kernels/indexer_topk.cu): the indices of topk_filtered over the logits of
// LaunchIndexerLogits, into selection.out (selection.scores unused). By default the unfused
// path: the logits into logits_workspace, then the filtered kernel over them. The fused path
// where JAX_TOPK_INDEXER_TOPK=fused, the tensor-core kernel runs the problem and the workspaces
// have the sizes of common/indexer_topk_workspace.h.
cudaError_t LaunchIndexerTopk(const IndexerProblem& logits, const TopkProblem& selection,
                              void* logits_workspace, size_t logits_bytes,
                              void* selection_workspace, size_t selection_bytes,
                              cudaStream_t stream);

// How many LaunchIndexerTopk calls in this process took the fused path: tests check with it
// that the path they asked for ran (the handler falls back to the unfused one silently). One
// relaxed atomic add a fused call; a call XLA captures into a CUDA graph counts at the capture.
int64_t IndexerTopkFusedLaunches();

}  // namespace jax_topk
