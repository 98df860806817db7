// CPU top-k for every target and score type: per row, an exact radix select on the ordered key (a
// histogram pass over the row for the top digit, a pass that keeps the keys in the
// boundary's bin, then digits over that shrinking set), then one pass that takes every key
// above the k-th largest and, of the keys equal to it, the lowest columns. O(n) per row,
// never a sort of the row; rows are spread over the host's cores.
#include "cpu/topk_cpu.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <iterator>
#include <memory>
#include <mutex>
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

struct Selected {
  uint32_t key;
  int32_t column;
};

// Per-thread buffers, reused across the rows a thread handles.
struct RowScratch {
  std::vector<uint32_t> boundary_keys;  // keys sharing the boundary's prefix so far
  std::vector<uint32_t> histogram;
  std::vector<Selected> selected;
};

// Walks a histogram from the top bin down to the bin holding the `needed`-th largest key;
// returns that bin and leaves in `needed` how many to take from it.
uint32_t BoundaryBin(const std::vector<uint32_t>& histogram, int64_t* needed) {
  uint32_t bin = static_cast<uint32_t>(histogram.size()) - 1;
  for (; histogram[bin] < *needed; --bin) *needed -= histogram[bin];
  return bin;
}

template <typename Scores>
void SelectRow(const typename Scores::Bits* row, int64_t length, int32_t k, bool sorted,
               RowScratch& scratch, int32_t* columns_out) {
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
  std::vector<Selected>& selected = scratch.selected;
  selected.clear();
  for (int64_t j = 0; j < length; ++j) {
    if (Scores::IsNan(row[j])) continue;
    const uint32_t key = Scores::Key(row[j]);
    if (take_all || key > boundary_key || (key == boundary_key && equal_quota-- > 0)) {
      selected.push_back({key, static_cast<int32_t>(j)});
    }
  }
  if (sorted) {  // rank order: key descending; stable keeps equal keys by ascending column
    std::stable_sort(selected.begin(), selected.end(),
                     [](const Selected& a, const Selected& b) { return a.key > b.key; });
  }
  int32_t slot = 0;
  for (const Selected& s : selected) columns_out[slot++] = s.column;
  for (; slot < k; ++slot) columns_out[slot] = kEmptySlot;
}

template <typename Scores>
void TopkRows(const TopkProblem& p, int64_t first_row, int64_t end_row, RowScratch& scratch) {
  const auto* scores = static_cast<const typename Scores::Bits*>(p.scores);
  for (int64_t r = first_row; r < end_row; ++r) {
    int32_t* out = p.out + r * p.k;
    if (!RowIsValid(r, p.num_valid_rows, p.rows_per_group)) {
      std::fill(out, out + p.k, kEmptySlot);
      if (p.values != nullptr) {
        auto* values = static_cast<typename Scores::Bits*>(p.values) + r * p.k;
        std::fill(values, values + p.k, Scores::kEmpty);
      }
      continue;
    }
    const int64_t length = ClampLength(p.lengths[r], p.width);
    const typename Scores::Bits* row = scores + r * p.width;
    SelectRow<Scores>(row, length, p.k, p.sorted, scratch, out);
    if (p.values != nullptr) {  // before the page transform: the slots still hold columns
      auto* values = static_cast<typename Scores::Bits*>(p.values) + r * p.k;
      for (int32_t s = 0; s < p.k; ++s)
        values[s] = out[s] == kEmptySlot ? Scores::kEmpty : row[out[s]];
    }
    if (p.page_table == nullptr) continue;
    const int32_t* table_row = p.page_table + TableRowFor(r, p.table_rows, p.table_count) * p.pages;
    for (int32_t s = 0; s < p.k && out[s] != kEmptySlot; ++s) {
      out[s] = PageTransform(out[s], table_row, p.log2_page_size);
    }
  }
}

// Rows handed out in small chunks from an atomic counter, so uneven lengths balance. Shared
// with the helper tasks through a shared_ptr: a task that starts after the call returned
// finds no rows left and touches nothing else.
struct RowQueue {
  explicit RowQueue(const TopkProblem& problem) : problem(problem) {}
  const TopkProblem problem;
  std::atomic<int64_t> next_row{0};
  std::atomic<int64_t> rows_done{0};
  std::mutex mutex;
  std::condition_variable all_done;
};

template <typename Scores>
void DrainRows(RowQueue& queue) {
  constexpr int64_t kRowsPerChunk = 4;
  const TopkProblem& p = queue.problem;
  RowScratch scratch;
  for (;;) {
    const int64_t first = queue.next_row.fetch_add(kRowsPerChunk);
    if (first >= p.rows) return;
    const int64_t end = std::min(first + kRowsPerChunk, p.rows);
    TopkRows<Scores>(p, first, end, scratch);
    if (queue.rows_done.fetch_add(end - first) + (end - first) == p.rows) {
      std::lock_guard<std::mutex> lock(queue.mutex);
      queue.all_done.notify_all();
    }
  }
}

// The calling thread always works too and waits only for rows other threads have started,
// never for a task the pool has not run: no deadlock when the pool is busy.
template <typename Scores>
void TopkParallel(const TopkProblem& p, const ScheduleTask& schedule, int64_t pool_threads) {
  constexpr int64_t kMinElementsPerThread = 1 << 16;
  const int64_t work = p.rows * std::max<int64_t>(p.width, 1);
  const int64_t helpers = std::clamp<int64_t>(work / kMinElementsPerThread - 1, 0, pool_threads);
  auto queue = std::make_shared<RowQueue>(p);
  for (int64_t t = 0; t < helpers; ++t) {
    schedule([queue]() { DrainRows<Scores>(*queue); });
  }
  DrainRows<Scores>(*queue);
  std::unique_lock<std::mutex> lock(queue->mutex);
  queue->all_done.wait(lock, [&]() { return queue->rows_done.load() == p.rows; });
}

}  // namespace

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
