// The CPU algorithms: plain C++ over a TopkProblem, no XLA. They are the reference the CUDA
// kernels are tested against bit for bit, and the CPU handlers of both operators.
#pragma once

#include "topk_problem.h"

namespace jax_topk {

// problem.scores holds bf16 bits (uint16) per element.
void TopkBf16Cpu(const TopkProblem& problem);
// problem.scores holds float32 per element.
void TopkFilteredCpu(const TopkProblem& problem);

}  // namespace jax_topk
