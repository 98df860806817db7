// merge_topk on the CPU, per row: the candidates (column >= 0, value not NaN) as (ordered
// key, column) pairs, std::nth_element to the k best by (key descending, column
// ascending), then a sort of those k into the requested order. O(m) per row on average.
// The values written back come from the keys (the key transform is a bijection on the
// bits), so a winner's value has exactly its input bits.
#include "cpu/merge_cpu.h"

#include <algorithm>
#include <vector>

#include "common/topk_common.h"

namespace jax_topk {
namespace {

// How each value type reads as a 32-bit ordered key and back; 16-bit keys keep their own
// 16-bit range (bfloat16 and float16 share the transform and differ in NaN and -inf).
struct F32Values {
  using Bits = uint32_t;
  static bool IsNan(Bits bits) { return IsNanF32(bits); }
  static uint32_t Key(Bits bits) { return OrderedKeyF32(bits); }
  static Bits FromKey(uint32_t key) { return BitsFromOrderedKeyF32(key); }
  static constexpr Bits kEmpty = kNegInfF32Bits;
};
struct Bf16Values {
  using Bits = uint16_t;
  static bool IsNan(Bits bits) { return IsNanBf16(bits); }
  static uint32_t Key(Bits bits) { return OrderedKeyBf16(bits); }
  static Bits FromKey(uint32_t key) { return BitsFromOrderedKeyBf16(key); }
  static constexpr Bits kEmpty = kNegInfBf16Bits;
};
struct F16Values : Bf16Values {
  static bool IsNan(Bits bits) { return IsNanF16(bits); }
  static constexpr Bits kEmpty = kNegInfF16Bits;
};

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
