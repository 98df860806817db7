// XLA FFI bindings of the CPU handlers, and the nanobind module that hands them to JAX.
#include <cstdint>
#include <functional>
#include <utility>

#include "nanobind/nanobind.h"
#include "common/topk_common.h"
#include "cpu/topk_cpu.h"
#include "ffi/topk_ffi.h"
#include "common/topk_filtered_workspace.h"

namespace nb = nanobind;

namespace jax_topk {
namespace {

using CpuAlgorithm = void (*)(const TopkProblem&, const ScheduleTask&, int64_t);

// The rows run on XLA's CPU thread pool (its intra-op threads) and the calling thread.
template <ffi::DataType ScoreType, CpuAlgorithm Algorithm>
ffi::Error TopkCpu(ffi::ThreadPool thread_pool, ffi::Buffer<ScoreType> scores, Int32Buffer lengths, Int32Buffer page_table,
                   Int32Buffer table_rows, Int32Buffer num_valid_rows,
                   ffi::Result<Int32Buffer> out, int32_t k, int32_t log2_page_size, bool sorted,
                   bool has_page_table, bool has_table_rows, bool has_num_valid_rows) {
  TopkProblem problem;
  ffi::Error error = DecodeTopkProblem<ScoreType>(
      scores, lengths, page_table, table_rows, num_valid_rows, out, k, log2_page_size, sorted,
      has_page_table, has_table_rows, has_num_valid_rows, &problem);
  if (error.failure()) return error;
  Algorithm(problem, [&](std::function<void()> task) { thread_pool.Schedule(std::move(task)); },
            thread_pool.num_threads());
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(TopkBf16CpuHandler, (TopkCpu<ffi::BF16, TopkBf16Cpu>),
                              BindTopkOperands<ffi::BF16>(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(TopkFilteredCpuHandler, (TopkCpu<ffi::F32, TopkFilteredCpu>),
                              BindTopkOperands<ffi::F32>(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()));

}  // namespace jax_topk

NB_MODULE(_jax_topk_cpu, m) {
  m.def("registrations", []() {
    nb::dict targets;
    targets["jax_topk_bf16"] = nb::capsule(reinterpret_cast<void*>(jax_topk::TopkBf16CpuHandler));
    targets["jax_topk_filtered"] =
        nb::capsule(reinterpret_cast<void*>(jax_topk::TopkFilteredCpuHandler));
    return targets;
  });
  m.attr("MAX_K") = jax_topk::kMaxK;
  m.attr("MAX_BF16_WIDTH") = jax_topk::kMaxBf16Width;
  m.def("filtered_workspace_bytes", &jax_topk::FilteredWorkspaceBytes, nb::arg("rows"),
        nb::arg("width"), nb::arg("k"),
        "Bytes of device workspace topk_filtered's CUDA kernel takes for this shape.");
}
