// merge_topk on the CPU, per row: the candidates (column >= 0, value not NaN) as (ordered
// key, column) pairs, std::nth_element to the k best by (key descending, column
// ascending), then a sort of those k into the requested order. O(m) per row on average.
// The values written back are rebuilt from the keys (common/value_traits.h).
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

template <typename Values>
void MergeRows(const MergeProblem& p) {
  const auto* values = static_cast<const typename Values::Bits*>(p.values);
  auto* out_values = static_cast<typename Values::Bits*>(p.out_values);
  std::vector<Candidate> candidates;
  for (int64_t r = 0; r < p.rows; ++r) {
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

}  // namespace

void MergeCpu(const MergeProblem& problem) {
  switch (problem.score_type) {
    case ScoreType::kFloat32:
      return MergeRows<F32Values>(problem);
    case ScoreType::kBfloat16:
      return MergeRows<Bf16Values>(problem);
    case ScoreType::kFloat16:
      return MergeRows<F16Values>(problem);
  }
}

}  // namespace jax_topk
