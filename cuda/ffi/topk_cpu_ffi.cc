// XLA FFI bindings of the CPU handlers, and the nanobind module that hands them to JAX.
#include <cstdint>
#include <functional>
#include <utility>

#include "common/indexer_topk_workspace.h"
#include "common/indexer_widened.h"
#include "common/topk_common.h"
#include "common/topk_filtered_workspace.h"
#include "cpu/indexer_cpu.h"
#include "cpu/merge_cpu.h"
#include "cpu/topk_cpu.h"
#include "ffi/indexer_ffi.h"
#include "ffi/merge_ffi.h"
#include "ffi/topk_ffi.h"
#include "nanobind/nanobind.h"
#include "nanobind/stl/pair.h"

namespace nb = nanobind;

namespace jax_topk {
namespace {

// The rows run on XLA's CPU thread pool (its intra-op threads) and the calling thread.
ScheduleTask ScheduleOn(ffi::ThreadPool& thread_pool) {
  return [&thread_pool](std::function<void()> task) { thread_pool.Schedule(std::move(task)); };
}

ffi::Error RunOnThreadPool(ffi::ThreadPool thread_pool, const TopkProblem& problem) {
  TopkCpu(problem, ScheduleOn(thread_pool), thread_pool.num_threads());
  return ffi::Error::Success();
}

ffi::Error IndexerLogitsOnThreadPool(ffi::ThreadPool thread_pool, const IndexerCall& call) {
  IndexerLogitsCpu(call.logits, ScheduleOn(thread_pool), thread_pool.num_threads());
  return ffi::Error::Success();
}

ffi::Error IndexerTopkOnThreadPool(ffi::ThreadPool thread_pool, const IndexerCall& call) {
  IndexerTopkCpu(call.logits, call.selection, ScheduleOn(thread_pool), thread_pool.num_threads());
  return ffi::Error::Success();
}

ffi::Error MergeOnThreadPool(ffi::ThreadPool thread_pool, const MergeProblem& problem) {
  MergeCpu(problem, ScheduleOn(thread_pool), thread_pool.num_threads());
  return ffi::Error::Success();
}

}  // namespace

// One CPU algorithm serves every target (each with its own checks): the reference each
// kernel is tested against.
XLA_FFI_DEFINE_HANDLER_SYMBOL(TopkBf16CpuHandler,
                              (TopkHandler<kTopkBf16Target, RunOnThreadPool>::Call),
                              BindTopkOperands(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(TopkFilteredCpuHandler,
                              (TopkHandler<kTopkFilteredTarget, RunOnThreadPool>::Call),
                              BindTopkOperands(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(TopkSmallRowsCpuHandler,
                              (TopkHandler<kTopkSmallRowsTarget, RunOnThreadPool>::Call),
                              BindTopkOperands(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(MergeTopkCpuHandler, (MergeHandler<MergeOnThreadPool>::Call),
                              BindMergeOperands(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    IndexerLogitsCpuHandler,
    (IndexerHandler<kIndexerLogitsTarget, Float32Buffer, IndexerLogitsOnThreadPool>::Call),
    BindIndexerOperands<Float32Buffer>(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    IndexerTopkCpuHandler,
    (IndexerHandler<kIndexerTopkTarget, Int32Buffer, IndexerTopkOnThreadPool>::Call),
    BindIndexerOperands<Int32Buffer>(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()));

}  // namespace jax_topk

NB_MODULE(_jax_topk_cpu, m) {
  m.def("registrations", []() {
    nb::dict targets;
    targets[jax_topk::kTopkBf16Target.name] =
        nb::capsule(reinterpret_cast<void*>(jax_topk::TopkBf16CpuHandler));
    targets[jax_topk::kTopkFilteredTarget.name] =
        nb::capsule(reinterpret_cast<void*>(jax_topk::TopkFilteredCpuHandler));
    targets[jax_topk::kTopkSmallRowsTarget.name] =
        nb::capsule(reinterpret_cast<void*>(jax_topk::TopkSmallRowsCpuHandler));
    targets[jax_topk::kMergeTopkTarget.name] =
        nb::capsule(reinterpret_cast<void*>(jax_topk::MergeTopkCpuHandler));
    targets[jax_topk::kIndexerLogitsTarget.name] =
        nb::capsule(reinterpret_cast<void*>(jax_topk::IndexerLogitsCpuHandler));
    targets[jax_topk::kIndexerTopkTarget.name] =
        nb::capsule(reinterpret_cast<void*>(jax_topk::IndexerTopkCpuHandler));
    return targets;
  });
  m.attr("MAX_K") = jax_topk::kMaxK;
  m.attr("MAX_BF16_WIDTH") = jax_topk::kMaxBf16Width;
  m.attr("SMALL_ROWS_MAX_WIDTH") = jax_topk::kSmallRowsMaxWidth;
  m.attr("SMALL_ROWS_MAX_K") = jax_topk::kSmallRowsMaxK;
  m.attr("SMALL_ROWS_MAX_K_BY_ROUNDS") = jax_topk::kSmallRowsMaxKByRounds;
  m.attr("MAX_MERGE_WIDTH") = jax_topk::kMaxMergeWidth;
  m.def("filtered_workspace_bytes", &jax_topk::FilteredWorkspaceBytes, nb::arg("rows"),
        nb::arg("width"), nb::arg("k"),
        "Bytes of device workspace topk_filtered's CUDA kernel takes for this shape.");
  m.def(
      "indexer_topk_workspace_bytes",
      [](int64_t rows, int64_t width, int32_t k) {
        return std::make_pair(jax_topk::IndexerTopkLogitsWorkspaceBytes(rows, width),
                              jax_topk::IndexerTopkSelectionWorkspaceBytes(rows, width, k));
      },
      nb::arg("rows"), nb::arg("width"), nb::arg("k"),
      "Bytes of indexer_topk's two CUDA workspaces (logits, selection) for this shape.");
  m.def("indexer_widened_bytes", &jax_topk::IndexerWidenedBytes, nb::arg("fp8"), nb::arg("batch"),
        nb::arg("queries"), nb::arg("heads"), nb::arg("head_dim"), nb::arg("keys_count"),
        "Bytes of the f16 copies of fp8 q and keys the CUDA indexer kernel reads (0: none).");
  m.def("indexer_widened_offset_after_logits", &jax_topk::IndexerWidenedOffsetAfterLogits,
        nb::arg("rows"), nb::arg("keys_count"),
        "Where those copies start in indexer_topk's logits workspace.");
}
