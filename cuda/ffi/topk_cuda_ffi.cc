// XLA FFI bindings of the CUDA handlers, and the nanobind module that hands them to JAX.
// Thin: TopkHandler (ffi/topk_ffi.h) decodes and checks the call; what is here launches the
// problem on XLA's stream. The kernels live in kernels/topk_*.cu.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "ffi/indexer_ffi.h"
#include "ffi/merge_ffi.h"
#include "ffi/topk_ffi.h"
#include "kernels/indexer_cuda.h"
#include "kernels/merge_cuda.h"
#include "kernels/topk_cuda.h"
#include "nanobind/nanobind.h"

namespace nb = nanobind;

namespace jax_topk {
namespace {

ffi::Error LaunchError(const char* op, cudaError_t status) {
  if (status == cudaSuccess) return ffi::Error::Success();
  return ffi::Error::Internal(std::string("jax_topk: ") + op +
                              " launch failed: " + cudaGetErrorString(status));
}

ffi::Error RunTopkBf16(cudaStream_t stream, const TopkProblem& problem) {
  return LaunchError("topk_bf16", LaunchTopkBf16(problem, stream));
}

ffi::Error RunTopkSmallRows(cudaStream_t stream, const TopkProblem& problem) {
  return LaunchError("topk_small_rows", LaunchTopkSmallRows(problem, stream));
}

ffi::Error RunTopkFiltered(cudaStream_t stream, const TopkProblem& problem,
                           ffi::Result<ffi::AnyBuffer> workspace) {
  if (workspace->size_bytes() < kFilteredMinWorkspaceBytes)
    return InvalidTopkCall(kTopkFilteredTarget, "the workspace has ", workspace->size_bytes(),
                           " bytes, below the kernel's minimum of ", kFilteredMinWorkspaceBytes);
  return LaunchError("topk_filtered", LaunchTopkFiltered(problem, workspace->untyped_data(),
                                                         workspace->size_bytes(), stream));
}

ffi::Error RunMergeTopk(cudaStream_t stream, const MergeProblem& problem) {
  return LaunchError("merge_topk", LaunchMergeTopk(problem, stream));
}

// The workspace holds fp8 q and keys widened to f16 where the shape asks for it
// (common/indexer_widened.h); smaller, the kernel widens them in shared memory.
ffi::Error RunIndexerLogits(cudaStream_t stream, const IndexerCall& call,
                            ffi::Result<ffi::AnyBuffer> workspace) {
  IndexerProblem problem = call.logits;
  problem.widened = workspace->untyped_data();
  problem.widened_capacity = workspace->size_bytes();
  return LaunchError("indexer_logits", LaunchIndexerLogits(problem, stream));
}

// kernels/indexer_topk.cu: the logits into the logits workspace and the filtered kernel over
// them, or (JAX_TOPK_INDEXER_TOPK=fused) the fused kernels that keep them out of memory:
// topk_filtered's indices over indexer_logits' bits either way.
ffi::Error RunIndexerTopk(cudaStream_t stream, const IndexerCall& call,
                          ffi::Result<ffi::AnyBuffer> logits_workspace,
                          ffi::Result<ffi::AnyBuffer> selection_workspace) {
  const size_t logits_bytes =
      static_cast<size_t>(call.selection.rows) * call.selection.width * sizeof(float);
  if (logits_workspace->size_bytes() < logits_bytes ||
      selection_workspace->size_bytes() < kFilteredMinWorkspaceBytes)
    return InvalidTopkCall(kIndexerTopkTarget, "the workspaces have ",
                           logits_workspace->size_bytes(), " and ",
                           selection_workspace->size_bytes(), " bytes, below ", logits_bytes,
                           " and ", kFilteredMinWorkspaceBytes);
  return LaunchError(
      "indexer_topk",
      LaunchIndexerTopk(call.logits, call.selection, logits_workspace->untyped_data(),
                        logits_workspace->size_bytes(), selection_workspace->untyped_data(),
                        selection_workspace->size_bytes(), stream));
}

}  // namespace

// Both handlers only enqueue work on XLA's stream (no host sync, no allocation), so XLA
// may capture them into command buffers (CUDA graphs).
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    TopkBf16CudaHandler, (TopkHandler<kTopkBf16Target, RunTopkBf16>::Call),
    BindTopkOperands(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()),
    {ffi::Traits::kCmdBufferCompatible});
// The workspace is a third result the Python lowering adds on CUDA only.
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    TopkFilteredCudaHandler, (TopkHandler<kTopkFilteredTarget, RunTopkFiltered>::Call),
    BindTopkOperands(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>())
        .Ret<ffi::AnyBuffer>(),
    {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    TopkSmallRowsCudaHandler, (TopkHandler<kTopkSmallRowsTarget, RunTopkSmallRows>::Call),
    BindTopkOperands(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()),
    {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    MergeTopkCudaHandler, (MergeHandler<RunMergeTopk>::Call),
    BindMergeOperands(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()),
    {ffi::Traits::kCmdBufferCompatible});

// The workspace (the widened fp8 copies, or a byte) is a result the Python lowering adds on CUDA.
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    IndexerLogitsCudaHandler,
    (IndexerHandler<kIndexerLogitsTarget, Float32Buffer, RunIndexerLogits>::Call),
    BindIndexerOperands<Float32Buffer>(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>())
        .Ret<ffi::AnyBuffer>(),
    {ffi::Traits::kCmdBufferCompatible});
// The two workspaces (logits, then selection) are results the Python lowering adds on CUDA.
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    IndexerTopkCudaHandler, (IndexerHandler<kIndexerTopkTarget, Int32Buffer, RunIndexerTopk>::Call),
    BindIndexerOperands<Int32Buffer>(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>())
        .Ret<ffi::AnyBuffer>()
        .Ret<ffi::AnyBuffer>(),
    {ffi::Traits::kCmdBufferCompatible});

}  // namespace jax_topk

NB_MODULE(_jax_topk_cuda, m) {
  m.def("registrations", []() {
    nb::dict targets;
    targets[jax_topk::kTopkBf16Target.name] =
        nb::capsule(reinterpret_cast<void*>(jax_topk::TopkBf16CudaHandler));
    targets[jax_topk::kTopkFilteredTarget.name] =
        nb::capsule(reinterpret_cast<void*>(jax_topk::TopkFilteredCudaHandler));
    targets[jax_topk::kTopkSmallRowsTarget.name] =
        nb::capsule(reinterpret_cast<void*>(jax_topk::TopkSmallRowsCudaHandler));
    targets[jax_topk::kMergeTopkTarget.name] =
        nb::capsule(reinterpret_cast<void*>(jax_topk::MergeTopkCudaHandler));
    targets[jax_topk::kIndexerLogitsTarget.name] =
        nb::capsule(reinterpret_cast<void*>(jax_topk::IndexerLogitsCudaHandler));
    targets[jax_topk::kIndexerTopkTarget.name] =
        nb::capsule(reinterpret_cast<void*>(jax_topk::IndexerTopkCudaHandler));
    return targets;
  });
  // Tests only: whether indexer_topk's fused path ran (kernels/indexer_cuda.h).
  m.def("indexer_topk_fused_launches", &jax_topk::IndexerTopkFusedLaunches);
}
