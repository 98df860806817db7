// The CPU algorithms: plain C++ over a TopkProblem, no XLA. They are the reference the CUDA
// kernels are tested against bit for bit, and the CPU handlers of both operators.
#pragma once

#include <cstdint>
#include <functional>

#include "common/topk_problem.h"

namespace jax_topk {

// Runs a task on one of the host's worker threads (XLA's pool) or, failing that, inline.
using ScheduleTask = std::function<void(std::function<void()>)>;

// Rows are spread over the calling thread and up to `pool_threads` scheduled helpers.
// Serves every target: the result depends only on the problem (its score_type included),
// which is what makes each kernel's output checkable against it bit for bit.
void TopkCpu(const TopkProblem& problem, const ScheduleTask& schedule, int64_t pool_threads);

}  // namespace jax_topk
