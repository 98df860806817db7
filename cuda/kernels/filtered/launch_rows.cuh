// The launch of the filtered kernel for rows of one score type: the kernel (queue worker or
// cluster part) and the host's plan (launch_plan.cuh) that picks the mode, the cluster size and
// the workspace slices. Included once per score type by kernels/topk_filtered_<type>.cu, so the
// three types compile in parallel; kernels/topk_filtered.cu dispatches to them.
#pragma once

#include <cuda_runtime.h>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "common/topk_filtered_workspace.h"
#include "common/topk_problem.h"
#include "kernels/filtered/cluster_split.cuh"
#include "kernels/filtered/elements.cuh"
#include "kernels/filtered/launch_plan.cuh"
#include "kernels/filtered/layout.cuh"
#include "kernels/filtered/probe.cuh"
#include "kernels/filtered/queue_worker.cuh"
#include "kernels/filtered/row_runner.cuh"
#include "kernels/filtered/typed_launches.h"

namespace jax_topk {
namespace {

// One launch over rows of kType: split mode (kSplit) or a persistent pool of workers taking
// whole rows from the queue in completion order.
template <bool kSplit, ScoreType kType>
__global__ void __launch_bounds__(kThreadsPerBlock, kBlocksPerSm)
    TopkFilteredKernel(const FilteredLaunch launch) {
  using Elements = RowElements<kType>;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  SharedStorage& s = *reinterpret_cast<SharedStorage*>(shared_bytes);
  for (int bin = threadIdx.x; bin < kDigitBins; bin += kThreadsPerBlock) s.hist[bin] = 0;
#if JAX_TOPK_FILTERED_PROBE
  ProbeStart(s, launch.probe);
#endif
  __syncthreads();
  if (kSplit) {
#if JAX_TOPK_HAS_CLUSTERS
    RunClusterPart<Elements>(s, launch);
#endif
  } else {
    RunQueueWorker<Elements>(s, launch);
  }
  ProbeFinish(s);
}

// The launch for rows of kType (checked by LaunchTopkFiltered).
template <ScoreType kType>
cudaError_t LaunchRowsOf(const TopkProblem& problem, void* workspace, size_t workspace_bytes,
                         cudaStream_t stream) {
  using Elements = RowElements<kType>;
  constexpr auto split_kernel_of_type = TopkFilteredKernel<true, kType>;
  constexpr auto queue_kernel_of_type = TopkFilteredKernel<false, kType>;
  int device = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) return status;
  const void* const split_kernel = reinterpret_cast<const void*>(split_kernel_of_type);
  const int sm_pool = kBlocksPerSm * SmCount(device);
  const int pool = sm_pool < kMaxPoolBlocks ? sm_pool : kMaxPoolBlocks;
  const size_t shared_bytes = sizeof(SharedStorage);
  status = cudaFuncSetAttribute(queue_kernel_of_type, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(shared_bytes));
  if (status != cudaSuccess) return status;
  status = cudaFuncSetAttribute(split_kernel_of_type, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                SpreadSharedBytes(device));
  if (status != cudaSuccess) return status;

  // Few rows: a cluster of blocks per row, if the workspace gives every part a useful slice (rows
  // of at most kSharedCandidates columns are done by one block either way).
  WorkspacePlan plan = PlanWorkspace(problem.rows, 1, pool, workspace_bytes);
  bool spread = false;
  // Benchmarks and tests: JAX_TOPK_FILTERED_SPLIT=off keeps every row on one block (read at each
  // launch).
  const char* const split_mode = std::getenv("JAX_TOPK_FILTERED_SPLIT");
  const bool may_split = split_mode == nullptr || std::strcmp(split_mode, "off") != 0;
  if (may_split && problem.rows * 2 <= pool && problem.width > kSharedCandidates) {
    const int64_t useful_parts = FilteredUsefulParts(problem.width);
    constexpr int64_t kElementBytes = sizeof(typename Elements::Storage);
    spread = problem.rows * problem.width * kElementBytes <= kSpreadBytesPerSm * SmCount(device);
    int parts =
        spread ? SplitParts<Elements>(split_kernel, device, problem.rows, useful_parts, true) : 1;
    if (parts <= 1) {  // too many rows to spread them
      spread = false;
      parts = SplitParts<Elements>(split_kernel, device, problem.rows, useful_parts, false);
    }
    // Measured (benches/NOTES.md "split or queue"): a row in two parts sharing their SMs is
    // slower than the row on one block for 16-bit rows and float32 rows past 65536 columns (128 x
    // 65536-152064: 16-18 %), faster for float32 rows of 65536 (the indexer's 128 x 65536 causal:
    // 25.4 against 31.7 us); two parts with an SM each (spread) stay faster (64 x 152064 bf16).
    if (!spread && parts == 2 && (kElementBytes == 2 || problem.width > 65536)) parts = 1;
    if (parts > 1) {
      const WorkspacePlan split = PlanWorkspace(problem.rows, parts, pool, workspace_bytes);
      if (split.slice_entries >= kMinSplitSliceEntries) plan = split;
    }
  }

  unsigned char* base = static_cast<unsigned char*>(workspace);
  FilteredLaunch launch;
  launch.problem = problem;
  launch.queue_next = reinterpret_cast<unsigned long long*>(base);
  // Measured (benches/NOTES.md "the queue pass's reads"): staged tiles speed a long queue's
  // passes 1-3.5 %; with a block a row and more rows than SMs, every block streams at once and
  // dropping the pass's L2 prefetches gains 5-8 % ([256, 152064]).
  launch.queue_reads = plan.grid < problem.rows         ? PassReads::kStaged
                       : problem.rows > SmCount(device) ? PassReads::kPlain
                                                        : PassReads::kPrefetched;
  launch.slices = reinterpret_cast<uint2*>(base + kFilteredHeaderBytes);
  launch.slice_entries = plan.slice_entries;
#if JAX_TOPK_FILTERED_PROBE
  const char* const probe_flags = std::getenv("JAX_TOPK_FILTERED_PROBE");
  launch.probe = probe_flags != nullptr ? std::atoi(probe_flags) : 0;
#endif

  if (plan.parts > 1) {  // split mode needs no counters
    cudaLaunchAttribute attribute;
    const cudaLaunchConfig_t config =
        ClusterConfig(plan.grid, plan.parts, SplitSharedBytes(device, spread), stream, attribute);
    status = cudaLaunchKernelEx(&config, split_kernel_of_type, launch);
    return status != cudaSuccess ? status : cudaGetLastError();
  }
  // The one reset of the queue's counter, for a launch with fewer blocks than rows (with a block
  // for every row, block b takes row b and no counter is read: RunQueueWorker). The workspace is
  // an XLA output buffer whose contents are undefined on entry: XLA may hand this launch any
  // buffer, or one another op has written since the last launch, so a kernel that zeroed the
  // counter on its way out would leave the next launch nothing to rely on. A memset on the
  // stream before each launch is the only reset that holds (one 8-byte write, captured in a
  // CUDA graph like the launch, but a node of its own).
  if (plan.grid < problem.rows) {
    status = cudaMemsetAsync(workspace, 0, kCounterBytes, stream);
    if (status != cudaSuccess) return status;
  }
  queue_kernel_of_type<<<static_cast<unsigned int>(plan.grid), kThreadsPerBlock, shared_bytes,
                         stream>>>(launch);
  return cudaGetLastError();
}

}  // namespace
}  // namespace jax_topk
