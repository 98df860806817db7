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
// problem.scores holds bf16 bits (uint16) per element.
void TopkBf16Cpu(const TopkProblem& problem, const ScheduleTask& schedule, int64_t pool_threads);
// problem.scores holds float32 per element.
void TopkFilteredCpu(const TopkProblem& problem, const ScheduleTask& schedule,
                     int64_t pool_threads);

}  // namespace jax_topk
