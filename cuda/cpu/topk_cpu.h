// The CPU algorithms: plain C++ over a TopkProblem, no XLA. They are the reference the CUDA
// kernels are tested against bit for bit, and the CPU handlers of both operators.
#pragma once

#include <cstdint>
#include <vector>

#include "common/topk_problem.h"
#include "cpu/parallel_rows.h"

namespace jax_topk {

// Rows are spread over the calling thread and up to `pool_threads` scheduled helpers.
// Serves every target: the result depends only on the problem (its score_type included),
// which is what makes each kernel's output checkable against it bit for bit.
void TopkCpu(const TopkProblem& problem, const ScheduleTask& schedule, int64_t pool_threads);

// One thread's buffers for the row selection, reused across the rows it handles.
struct TopkRowScratch {
  struct Selected {
    uint32_t key;
    int32_t column;
  };
  std::vector<uint32_t> boundary_keys;  // keys sharing the boundary's prefix so far
  std::vector<uint32_t> histogram;
  std::vector<Selected> selected;
};

// Row `row` of a float32 problem whose scores the caller makes one row at a time (the
// indexer's CPU handler): writes the row's results (out, values, page transform, an invalid
// row's -1s) from `scores_row` [width], the same selection as TopkCpu's; problem.scores is
// not read.
void TopkCpuFloat32Row(const TopkProblem& problem, int64_t row, const float* scores_row,
                       TopkRowScratch& scratch);

}  // namespace jax_topk
