// merge_topk on the CPU, per row: the candidates (column >= 0, value not NaN) as (ordered
// key, column) pairs, std::nth_element to the k best by (key descending, column
// ascending), then a sort of those k into the requested order. O(m) per row on average;
// rows are spread over the host's cores. The values written back are rebuilt from the keys
// (common/value_traits.h).
#include "cpu/merge_cpu.h"

#include <algorithm>
#include <vector>

#include "common/topk_common.h"
#include "common/value_traits.h"

namespace jax_topk {
namespace {

struct Candidate {
  uint32_t key;
  int32_t column;
};

bool ByRank(const Candidate& a, const Candidate& b) {
  return RanksBefore(a.key, a.column, b.key, b.column);
}
bool ByColumn(const Candidate& a, const Candidate& b) {
  return a.column != b.column ? a.column < b.column : a.key > b.key;
}

// Rows [first_row, end_row), `candidates` a thread's own buffer.
template <typename Values>
void MergeRows(const MergeProblem& p, int64_t first_row, int64_t end_row,
               std::vector<Candidate>& candidates) {
  const auto* values = static_cast<const typename Values::Bits*>(p.values);
  auto* out_values = static_cast<typename Values::Bits*>(p.out_values);
  for (int64_t r = first_row; r < end_row; ++r) {
    candidates.clear();
    for (int64_t j = r * p.width; j < (r + 1) * p.width; ++j) {
      if (p.indices[j] < 0 || Values::IsNan(values[j])) continue;
      candidates.push_back({Values::Key(values[j]), p.indices[j]});
    }
    if (candidates.size() > static_cast<size_t>(p.k)) {
      std::nth_element(candidates.begin(), candidates.begin() + p.k, candidates.end(), ByRank);
      candidates.resize(p.k);
    }
    std::sort(candidates.begin(), candidates.end(), p.sorted ? ByRank : ByColumn);
    for (int32_t s = 0; s < p.k; ++s) {
      const bool filled = s < static_cast<int32_t>(candidates.size());
      p.out_indices[r * p.k + s] = filled ? candidates[s].column : kEmptySlot;
      out_values[r * p.k + s] = filled ? Values::FromKey(candidates[s].key) : Values::kEmpty;
    }
  }
}

template <typename Values>
void MergeParallel(const MergeProblem& p, const ScheduleTask& schedule, int64_t pool_threads) {
  ParallelRows<std::vector<Candidate>>(
      p.rows, p.width, schedule, pool_threads,
      [&p](std::vector<Candidate>& candidates, int64_t first, int64_t end) {
        MergeRows<Values>(p, first, end, candidates);
      });
}

}  // namespace

void MergeCpu(const MergeProblem& problem, const ScheduleTask& schedule, int64_t pool_threads) {
  switch (problem.score_type) {
    case ScoreType::kFloat32:
      return MergeParallel<F32Values>(problem, schedule, pool_threads);
    case ScoreType::kBfloat16:
      return MergeParallel<Bf16Values>(problem, schedule, pool_threads);
    case ScoreType::kFloat16:
      return MergeParallel<F16Values>(problem, schedule, pool_threads);
  }
}

}  // namespace jax_topk
