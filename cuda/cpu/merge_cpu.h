// merge_topk on the CPU: plain C++ over a MergeProblem, no XLA; the reference the CUDA
// kernel (kernels/merge_topk.cu) is tested against bit for bit.
#pragma once

#include "common/merge_problem.h"

namespace jax_topk {

void MergeCpu(const MergeProblem& problem);

}  // namespace jax_topk
