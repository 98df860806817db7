// XLA FFI bindings of the CUDA handlers, and the nanobind module that hands them to JAX.
// Thin: decode, check, launch on XLA's stream. The kernels live in kernels/topk_*.cu.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "nanobind/nanobind.h"
#include "kernels/topk_cuda.h"
#include "ffi/topk_ffi.h"

namespace nb = nanobind;

namespace jax_topk {
namespace {

ffi::Error LaunchError(const char* op, cudaError_t status) {
  if (status == cudaSuccess) return ffi::Error::Success();
  return ffi::Error::Internal(std::string("jax_topk: ") + op + " launch failed: " +
                              cudaGetErrorString(status));
}

ffi::Error TopkBf16Cuda(cudaStream_t stream, ffi::Buffer<ffi::BF16> scores, Int32Buffer lengths,
                        Int32Buffer page_table, Int32Buffer table_rows,
                        Int32Buffer num_valid_rows, ffi::Result<Int32Buffer> out, int32_t k,
                        int32_t log2_page_size, bool sorted, bool has_page_table,
                        bool has_table_rows, bool has_num_valid_rows) {
  TopkProblem problem;
  ffi::Error error = DecodeTopkProblem<ffi::BF16>(
      scores, lengths, page_table, table_rows, num_valid_rows, out, k, log2_page_size, sorted,
      has_page_table, has_table_rows, has_num_valid_rows, &problem);
  if (error.failure()) return error;
  return LaunchError("topk_bf16", LaunchTopkBf16(problem, stream));
}

ffi::Error TopkFilteredCuda(cudaStream_t stream, ffi::Buffer<ffi::F32> scores,
                            Int32Buffer lengths, Int32Buffer page_table, Int32Buffer table_rows,
                            Int32Buffer num_valid_rows, ffi::Result<Int32Buffer> out, int32_t k,
                            int32_t log2_page_size, bool sorted, bool has_page_table,
                            bool has_table_rows, bool has_num_valid_rows,
                            ffi::Result<ffi::AnyBuffer> workspace) {
  TopkProblem problem;
  ffi::Error error = DecodeTopkProblem<ffi::F32>(
      scores, lengths, page_table, table_rows, num_valid_rows, out, k, log2_page_size, sorted,
      has_page_table, has_table_rows, has_num_valid_rows, &problem);
  if (error.failure()) return error;
  if (workspace->size_bytes() < kFilteredMinWorkspaceBytes)
    return ffi::Error::InvalidArgument("jax_topk: topk_filtered workspace too small");
  return LaunchError("topk_filtered", LaunchTopkFiltered(problem, workspace->untyped_data(),
                                                         workspace->size_bytes(), stream));
}

}  // namespace

// Both handlers only enqueue work on XLA's stream (no host sync, no allocation), so XLA
// may capture them into command buffers (CUDA graphs).
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    TopkBf16CudaHandler, TopkBf16Cuda,
    BindTopkOperands<ffi::BF16>(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()),
    {ffi::Traits::kCmdBufferCompatible});
// The workspace is a second result the Python lowering adds on CUDA only.
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    TopkFilteredCudaHandler, TopkFilteredCuda,
    BindTopkOperands<ffi::F32>(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>())
        .Ret<ffi::AnyBuffer>(),
    {ffi::Traits::kCmdBufferCompatible});

}  // namespace jax_topk

NB_MODULE(_jax_topk_cuda, m) {
  m.def("registrations", []() {
    nb::dict targets;
    targets["jax_topk_bf16"] = nb::capsule(reinterpret_cast<void*>(jax_topk::TopkBf16CudaHandler));
    targets["jax_topk_filtered"] =
        nb::capsule(reinterpret_cast<void*>(jax_topk::TopkFilteredCudaHandler));
    return targets;
  });
}
