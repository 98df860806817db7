// merge_topk on the CPU: plain C++ over a MergeProblem, no XLA; the reference the CUDA
// kernel (kernels/merge_topk.cu) is tested against bit for bit.
#pragma once

#include <cstdint>

#include "common/merge_problem.h"
#include "cpu/parallel_rows.h"

namespace jax_topk {

// Rows are spread over the calling thread and up to `pool_threads` scheduled helpers.
void MergeCpu(const MergeProblem& problem, const ScheduleTask& schedule, int64_t pool_threads);

}  // namespace jax_topk
