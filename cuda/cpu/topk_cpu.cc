// CPU top-k for every target and score type: per row, an exact radix select on the ordered key (a
// histogram pass over the row for the top digit, a pass that keeps the keys in the
// boundary's bin, then digits over that shrinking set), then one pass that takes every key
// above the k-th largest and, of the keys equal to it, the lowest columns; for small k, one
// pass with a heap of the best k instead. Never a sort of the row; rows are spread over the
// host's cores.
#include "cpu/topk_cpu.h"

#include <algorithm>
#include <iterator>
#include <vector>

#include "common/topk_common.h"
#include "common/value_traits.h"

namespace jax_topk {
namespace {

// The radix digits (high to low) that cover a key of each width.
template <int kKeyBits>
struct RadixDigits;
template <>
struct RadixDigits<16> {
  static constexpr int kBits[] = {8, 8};
};
template <>
struct RadixDigits<32> {
  static constexpr int kBits[] = {11, 11, 10};
};

// Walks a histogram from the top bin down to the bin holding the `needed`-th largest key;
// returns that bin and leaves in `needed` how many to take from it.
uint32_t BoundaryBin(const std::vector<uint32_t>& histogram, int64_t* needed) {
  uint32_t bin = static_cast<uint32_t>(histogram.size()) - 1;
  for (; histogram[bin] < *needed; --bin) *needed -= histogram[bin];
  return bin;
}

// Writes the selected (key, column) pairs' columns in the output order (rank order when
// sorted, else ascending columns), then kEmptySlot up to k.
void WriteSelected(std::vector<TopkRowScratch::Selected>& selected, int32_t k, bool sorted,
                   bool in_column_order, int32_t* columns_out) {
  using Selected = TopkRowScratch::Selected;
  if (sorted) {  // rank order: key descending, equal keys by ascending column
    std::sort(selected.begin(), selected.end(), [](const Selected& a, const Selected& b) {
      return a.key > b.key || (a.key == b.key && a.column < b.column);
    });
  } else if (!in_column_order) {
    std::sort(selected.begin(), selected.end(),
              [](const Selected& a, const Selected& b) { return a.column < b.column; });
  }
  int32_t slot = 0;
  for (const Selected& s : selected) columns_out[slot++] = s.column;
  for (; slot < k; ++slot) columns_out[slot] = kEmptySlot;
}

// Small k: one pass over the row keeping the k best values seen so far in a binary heap whose
// root is the worst of them (the smallest key; of equal keys, the later column). Columns come
// in ascending order, so a later value enters only with a key above the root's: an equal key
// at a later column ranks below it. O(n + insertions x log k): a row in random order makes
// about k (1 + ln(n / k)) insertions, but a rising row one a value, so past a budget of
// insertions the row goes to the radix select instead (returns false, nothing written).
// Measured against the radix select (benches/NOTES.md "the CPU handler's small k"): faster
// for k <= 32, and for k <= n / 256.
constexpr bool HeapServes(int64_t length, int32_t k) {
  return k <= 32 || k <= length / 256;
}

template <typename Scores>
bool SelectRowByHeap(const typename Scores::Bits* row, int64_t length, int32_t k, bool sorted,
                     TopkRowScratch& scratch, int32_t* columns_out) {
  using Selected = TopkRowScratch::Selected;
  // The heap's order: `a` sits below `b` (nearer the root) when it ranks below b.
  const auto ranks_below = [](const Selected& a, const Selected& b) {
    return a.key < b.key || (a.key == b.key && a.column > b.column);
  };
  const auto heap_order = [&](const Selected& a, const Selected& b) { return ranks_below(b, a); };
  std::vector<Selected>& heap = scratch.selected;
  heap.clear();
  int64_t j = 0;
  for (; j < length && static_cast<int32_t>(heap.size()) < k; ++j) {  // the first k candidates
    if (Scores::IsNan(row[j])) continue;
    heap.push_back({Scores::Key(row[j]), static_cast<int32_t>(j)});
  }
  std::make_heap(heap.begin(), heap.end(), heap_order);
  uint32_t worst = heap.empty() ? 0 : heap.front().key;  // entry needs a larger key
  // Insertions before giving up: above a random row's k (1 + ln(n / k)) wherever the heap
  // serves (k <= n / 256: at most 6.6 k against 8 k; k <= 32: at most 32 (1 + ln(n / 32)),
  // under n / 64 + 256 for every n); a rising row spends the budget and then the radix
  // select's time (measured: at most ~1.5x the radix select alone).
  int64_t budget = length / 64 + 8 * int64_t{k};
  for (; j < length; ++j) {
    const typename Scores::Bits bits = row[j];
    if (Scores::IsNan(bits)) continue;
    const uint32_t key = Scores::Key(bits);
    if (key <= worst) continue;
    if (--budget < 0) return false;
    std::pop_heap(heap.begin(), heap.end(), heap_order);
    heap.back() = {key, static_cast<int32_t>(j)};
    std::push_heap(heap.begin(), heap.end(), heap_order);
    worst = heap.front().key;
  }
  WriteSelected(heap, k, sorted, /*in_column_order=*/false, columns_out);
  return true;
}

// Any k: the radix select of the file's opening comment.
template <typename Scores>
void SelectRowByRadix(const typename Scores::Bits* row, int64_t length, int32_t k, bool sorted,
                      TopkRowScratch& scratch, int32_t* columns_out) {
  // Pass 1 over the row: histogram of the top digit of every candidate's key.
  constexpr auto& kDigitBits = RadixDigits<Scores::kKeyBits>::kBits;
  constexpr int kTopBits = kDigitBits[0];
  constexpr int kTopShift = Scores::kKeyBits - kTopBits;
  scratch.histogram.assign(size_t{1} << kTopBits, 0);
  int64_t candidates = 0;
  for (int64_t j = 0; j < length; ++j) {
    if (Scores::IsNan(row[j])) continue;
    ++scratch.histogram[Scores::Key(row[j]) >> kTopShift];
    ++candidates;
  }
  const bool take_all = candidates <= k;
  uint32_t boundary_key = 0;
  int64_t equal_quota = 0;  // how many keys equal to boundary_key are taken
  if (!take_all) {
    // Pass 2: keep the keys in the boundary bin, then refine digit by digit among them.
    int64_t needed = k;
    const uint32_t top_bin = BoundaryBin(scratch.histogram, &needed);
    std::vector<uint32_t>& keys = scratch.boundary_keys;
    keys.clear();
    for (int64_t j = 0; j < length; ++j) {
      if (Scores::IsNan(row[j])) continue;
      const uint32_t key = Scores::Key(row[j]);
      if ((key >> kTopShift) == top_bin) keys.push_back(key);
    }
    int shift = kTopShift;
    for (size_t d = 1; d < std::size(kDigitBits); ++d) {
      const int digit_bits = kDigitBits[d];
      const uint32_t mask = (1u << digit_bits) - 1;
      shift -= digit_bits;
      scratch.histogram.assign(size_t{1} << digit_bits, 0);
      for (uint32_t key : keys) ++scratch.histogram[(key >> shift) & mask];
      const uint32_t bin = BoundaryBin(scratch.histogram, &needed);
      size_t kept = 0;
      for (uint32_t key : keys) {
        if (((key >> shift) & mask) == bin) keys[kept++] = key;
      }
      keys.resize(kept);
    }
    boundary_key = keys.front();  // every key left is the k-th largest
    equal_quota = needed;
  }

  // Pass 3: everything above the boundary, and the lowest columns equal to it.
  std::vector<TopkRowScratch::Selected>& selected = scratch.selected;
  selected.clear();
  for (int64_t j = 0; j < length; ++j) {
    if (Scores::IsNan(row[j])) continue;
    const uint32_t key = Scores::Key(row[j]);
    if (take_all || key > boundary_key || (key == boundary_key && equal_quota-- > 0)) {
      selected.push_back({key, static_cast<int32_t>(j)});
    }
  }
  WriteSelected(selected, k, sorted, /*in_column_order=*/true, columns_out);
}

template <typename Scores>
void SelectRow(const typename Scores::Bits* row, int64_t length, int32_t k, bool sorted,
               TopkRowScratch& scratch, int32_t* columns_out) {
  if (HeapServes(length, k) &&
      SelectRowByHeap<Scores>(row, length, k, sorted, scratch, columns_out)) {
    return;
  }
  SelectRowByRadix<Scores>(row, length, k, sorted, scratch, columns_out);
}

// Row r's results from its scores `row` (read only when the row is valid).
template <typename Scores>
void TopkRow(const TopkProblem& p, int64_t r, const typename Scores::Bits* row,
             TopkRowScratch& scratch) {
  int32_t* out = p.out + r * p.k;
  auto* values =
      p.values == nullptr ? nullptr : static_cast<typename Scores::Bits*>(p.values) + r * p.k;
  if (!RowIsValid(r, p.num_valid_rows, p.rows_per_group)) {
    std::fill(out, out + p.k, kEmptySlot);
    if (values != nullptr) std::fill(values, values + p.k, Scores::kEmpty);
    return;
  }
  const int64_t length = p.lengths == nullptr ? p.width : ClampLength(p.lengths[r], p.width);
  SelectRow<Scores>(row, length, p.k, p.sorted, scratch, out);
  if (values != nullptr) {  // before the page transform: the slots still hold columns
    for (int32_t s = 0; s < p.k; ++s)
      values[s] = out[s] == kEmptySlot ? Scores::kEmpty : row[out[s]];
  }
  if (p.page_table == nullptr) return;
  const int32_t* table_row = PageTableRow(p, r);
  for (int32_t s = 0; s < p.k && out[s] != kEmptySlot; ++s) {
    out[s] = PageTransform(out[s], table_row, p.log2_page_size);
  }
}

template <typename Scores>
void TopkRows(const TopkProblem& p, int64_t first_row, int64_t end_row, TopkRowScratch& scratch) {
  const auto* scores = static_cast<const typename Scores::Bits*>(p.scores);
  for (int64_t r = first_row; r < end_row; ++r)
    TopkRow<Scores>(p, r, scores + r * p.width, scratch);
}

template <typename Scores>
void TopkParallel(const TopkProblem& p, const ScheduleTask& schedule, int64_t pool_threads) {
  ParallelRows<TopkRowScratch>(p.rows, p.width, schedule, pool_threads,
                               [&p](TopkRowScratch& scratch, int64_t first, int64_t end) {
                                 TopkRows<Scores>(p, first, end, scratch);
                               });
}

}  // namespace

void TopkCpuFloat32Row(const TopkProblem& problem, int64_t row, const float* scores_row,
                       TopkRowScratch& scratch) {
  TopkRow<F32Values>(problem, row, reinterpret_cast<const uint32_t*>(scores_row), scratch);
}

void TopkCpu(const TopkProblem& problem, const ScheduleTask& schedule, int64_t pool_threads) {
  switch (problem.score_type) {
    case ScoreType::kFloat32:
      return TopkParallel<F32Values>(problem, schedule, pool_threads);
    case ScoreType::kBfloat16:
      return TopkParallel<Bf16Values>(problem, schedule, pool_threads);
    case ScoreType::kFloat16:
      return TopkParallel<F16Values>(problem, schedule, pool_threads);
  }
}

}  // namespace jax_topk
