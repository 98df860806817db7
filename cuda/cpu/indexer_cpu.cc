// The lightning indexer's CPU handler. The keys of each sequence are widened to float32 once
// and transposed to [D, N]; then each query row t, with L = its clamped length:
//   1. for each head h in order: dot[s] = sum over d in order of q[t,h,d] * keys[s,d]
//      (float32; a product of two bfloat16 or float8 values is exact in float32), scaled by
//      key_scales[s], relu, and logits[s] += weights[t,h] * relu (from logits[s] = 0);
//   2. logits[s] = -inf for s >= L.
// The loops run over s innermost (vectorisable without reordering any sum), so the order of
// every addition is fixed: the same bits every run, whatever the thread count. Rows are
// spread over the host's cores; indexer_topk selects from a row buffer as topk_filtered does.
#include "cpu/indexer_cpu.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "common/indexer_inputs.h"
#include "common/topk_common.h"
#include "cpu/topk_cpu.h"

namespace jax_topk {
namespace {

float FloatOfBits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// Element `index` of q or keys, widened exactly.
float InputAt(const IndexerProblem& p, const void* data, int64_t index) {
  if (p.input == IndexerInput::kBfloat16)
    return FloatOfBits(Float32BitsOfBf16(static_cast<const uint16_t*>(data)[index]));
  return FloatOfBits(Float32BitsOfFp8E4M3(static_cast<const uint8_t*>(data)[index]));
}

// Every sequence's keys as float32 [batch, D, N].
std::vector<float> TransposedKeys(const IndexerProblem& p) {
  const int64_t n = p.keys_count, d_count = p.head_dim;
  std::vector<float> transposed(static_cast<size_t>(p.batch * d_count * n));
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t s = 0; s < n; ++s)
      for (int64_t d = 0; d < d_count; ++d)
        transposed[(b * d_count + d) * n + s] = InputAt(p, p.keys, (b * n + s) * d_count + d);
  return transposed;
}

// One thread's buffers, reused across its rows.
struct IndexerScratch {
  std::vector<float> q_row;   // [H, D] of the current row
  std::vector<float> dots;    // [N] of the current head
  std::vector<float> logits;  // [N]: indexer_topk's row buffer
  TopkRowScratch selection;
};

// Row `row` (= b * M + t) of the logits into `logits` [N].
void LogitsRow(const IndexerProblem& p, const std::vector<float>& keys_t, int64_t row,
               IndexerScratch& scratch, float* logits) {
  const int64_t n = p.keys_count, heads = p.heads, d_count = p.head_dim;
  const int64_t b = row / p.queries;
  const int64_t length = p.lengths == nullptr ? n : ClampLength(p.lengths[row], n);
  scratch.q_row.resize(static_cast<size_t>(heads * d_count));
  for (int64_t i = 0; i < heads * d_count; ++i)
    scratch.q_row[i] = InputAt(p, p.q, row * heads * d_count + i);
  scratch.dots.resize(static_cast<size_t>(n));
  float* dots = scratch.dots.data();
  const float* scales = p.key_scales == nullptr ? nullptr : p.key_scales + b * n;
  const float* weights = p.weights + row * heads;
  std::fill(logits, logits + length, 0.0f);
  for (int64_t h = 0; h < heads; ++h) {
    std::fill(dots, dots + length, 0.0f);
    for (int64_t d = 0; d < d_count; ++d) {
      const float q_value = scratch.q_row[h * d_count + d];
      const float* keys_d = keys_t.data() + (b * d_count + d) * n;
      for (int64_t s = 0; s < length; ++s) dots[s] += q_value * keys_d[s];
    }
    const float weight = weights[h];
    for (int64_t s = 0; s < length; ++s) {
      const float scaled = scales == nullptr ? dots[s] : dots[s] * scales[s];
      logits[s] += weight * std::max(scaled, 0.0f);  // max(NaN, 0) is NaN, as in JAX
    }
  }
  std::fill(logits + length, logits + n, -std::numeric_limits<float>::infinity());
}

}  // namespace

void IndexerLogitsCpu(const IndexerProblem& p, const ScheduleTask& schedule, int64_t pool_threads) {
  const std::vector<float> keys_t = TransposedKeys(p);
  ParallelRows<IndexerScratch>(
      p.batch * p.queries, p.keys_count * p.heads * p.head_dim, schedule, pool_threads,
      [&](IndexerScratch& scratch, int64_t first, int64_t end) {
        for (int64_t row = first; row < end; ++row)
          LogitsRow(p, keys_t, row, scratch, p.logits + row * p.keys_count);
      });
}

void IndexerTopkCpu(const IndexerProblem& p, const TopkProblem& selection,
                    const ScheduleTask& schedule, int64_t pool_threads) {
  const std::vector<float> keys_t = TransposedKeys(p);
  ParallelRows<IndexerScratch>(
      p.batch * p.queries, p.keys_count * p.heads * p.head_dim, schedule, pool_threads,
      [&](IndexerScratch& scratch, int64_t first, int64_t end) {
        scratch.logits.resize(static_cast<size_t>(p.keys_count));
        for (int64_t row = first; row < end; ++row) {
          // An invalid row (num_valid_rows) is all -1 and its logits are never computed.
          if (RowIsValid(row, selection.num_valid_rows, selection.rows_per_group))
            LogitsRow(p, keys_t, row, scratch, scratch.logits.data());
          TopkCpuFloat32Row(selection, row, scratch.logits.data(), scratch.selection);
        }
      });
}

}  // namespace jax_topk
