// The lightning indexer on the CPU (docs/contract.md section 9): plain C++ over an
// IndexerProblem, no XLA. The CPU handlers of indexer_logits and indexer_topk.
#pragma once

#include <cstdint>

#include "common/indexer_problem.h"
#include "common/topk_problem.h"
#include "cpu/parallel_rows.h"

namespace jax_topk {

// Writes problem.logits [batch, M, N], spans of 1024 keys of the rows spread over the host's
// cores (so a single long row uses them all).
void IndexerLogitsCpu(const IndexerProblem& problem, const ScheduleTask& schedule,
                      int64_t pool_threads);

// indexer_topk: each query row's logits into a row buffer (never the whole [M, N]; with
// fewer rows than pool threads, a buffer of those rows filled span by span over the cores),
// then topk_filtered's CPU selection of that row (TopkCpuFloat32Row), so the result is bit for bit
// topk_filtered(indexer_logits(...)). `selection` is the float32 TopkProblem over the
// [batch * M, N] logits (its scores pointer unused), its out the result.
void IndexerTopkCpu(const IndexerProblem& problem, const TopkProblem& selection,
                    const ScheduleTask& schedule, int64_t pool_threads);

}  // namespace jax_topk
