// The lightning indexer's CPU handler. The keys of each sequence are widened to float32 once
// per call, in blocks of kKeysPerBlock keys stored [D, keys] (key-minor); then each query row
// t, with L = its clamped length, for each block of keys below L:
//   1. for each head h in order: dot[s] = sum over d in order of q[t,h,d] * keys[s,d] from 0
//      (float32; a product of two bfloat16 or float8 values is exact in float32), scaled by
//      key_scales[s], relu, and logits[s] += weights[t,h] * relu (from logits[s] = 0);
//   2. logits[s] = -inf for s >= L.
// Vectorised across keys only (the lanes hold different s; kHeadsPerPass heads share each
// key load and stay in registers), so every element's additions are in the order above:
// the same bits every run, whatever the thread count. Built without FMA contraction
// (CMakeLists.txt). Rows are spread over the host's cores; indexer_topk selects from a row
// buffer as topk_filtered does.
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

// Four float32 lanes (SSE2 on x86-64, NEON on arm64): the compiler's generic vectors, whose
// + and * are the IEEE float32 operations lane by lane, exactly as on scalars.
using Lanes = float __attribute__((vector_size(16)));
constexpr int64_t kLanes = 4;
constexpr int64_t kVectorsPerBlock = 2;
constexpr int64_t kKeysPerBlock = kLanes * kVectorsPerBlock;  // keys scored side by side
constexpr int64_t kHeadsPerPass = 4;  // heads whose dots share each load of a key block

Lanes LoadLanes(const float* from) {
  Lanes lanes;
  std::memcpy(&lanes, from, sizeof(lanes));
  return lanes;
}

Lanes Splat(float value) {
  return Lanes{value, value, value, value};
}

// Every sequence's keys as float32 in blocks of kKeysPerBlock keys, each block [D,
// kKeysPerBlock] (key-minor): [batch, blocks, D, kKeysPerBlock], the last block zero-padded.
struct BlockedKeys {
  int64_t blocks = 0;
  std::vector<float> values;
  const float* Block(const IndexerProblem& p, int64_t b, int64_t block) const {
    return values.data() + ((b * blocks + block) * p.head_dim) * kKeysPerBlock;
  }
};

BlockedKeys DecodedKeys(const IndexerProblem& p, const ScheduleTask& schedule,
                        int64_t pool_threads) {
  const int64_t n = p.keys_count, d_count = p.head_dim;
  BlockedKeys keys;
  keys.blocks = (n + kKeysPerBlock - 1) / kKeysPerBlock;
  keys.values.assign(static_cast<size_t>(p.batch * keys.blocks * d_count * kKeysPerBlock), 0.0f);
  struct NoState {};
  ParallelRows<NoState>(p.batch * keys.blocks, d_count * kKeysPerBlock, schedule, pool_threads,
                        [&](NoState&, int64_t first, int64_t end) {
                          for (int64_t unit = first; unit < end; ++unit) {
                            const int64_t b = unit / keys.blocks, block = unit % keys.blocks;
                            float* to = keys.values.data() + unit * d_count * kKeysPerBlock;
                            const int64_t s_end = std::min(n, (block + 1) * kKeysPerBlock);
                            for (int64_t s = block * kKeysPerBlock; s < s_end; ++s)
                              for (int64_t d = 0; d < d_count; ++d)
                                to[d * kKeysPerBlock + s % kKeysPerBlock] =
                                    InputAt(p, p.keys, (b * n + s) * d_count + d);
                          }
                        });
  return keys;
}

// One thread's buffers, reused across its rows.
struct IndexerScratch {
  std::vector<float> q_row;   // [H, D] of the current row
  std::vector<float> logits;  // [N]: indexer_topk's row buffer
  TopkRowScratch selection;
};

// The dots of heads [0, kHeads) of q_heads ([kHeads, D]) with one key block: each lane's sum
// over d in order from 0, exactly the scalar loop's, kHeads * kKeysPerBlock of them at once.
template <int64_t kHeads>
void BlockDots(const float* q_heads, int64_t d_count, const float* block,
               Lanes (&dots)[kHeads][kVectorsPerBlock]) {
  for (int64_t h = 0; h < kHeads; ++h)
    for (int64_t v = 0; v < kVectorsPerBlock; ++v) dots[h][v] = Splat(0.0f);
  for (int64_t d = 0; d < d_count; ++d) {
    Lanes key[kVectorsPerBlock];
    for (int64_t v = 0; v < kVectorsPerBlock; ++v)
      key[v] = LoadLanes(block + d * kKeysPerBlock + v * kLanes);
    for (int64_t h = 0; h < kHeads; ++h) {
      const Lanes q_value = Splat(q_heads[h * d_count + d]);
      for (int64_t v = 0; v < kVectorsPerBlock; ++v) dots[h][v] += q_value * key[v];
    }
  }
}

// logits += weights[h] * relu(dots[h] * scales) for heads h of this pass, in order.
template <int64_t kHeads>
void AddHeads(const Lanes (&dots)[kHeads][kVectorsPerBlock], const float* weights,
              const Lanes* scales, Lanes (&logits)[kVectorsPerBlock]) {
  for (int64_t h = 0; h < kHeads; ++h) {
    const Lanes weight = Splat(weights[h]);
    for (int64_t v = 0; v < kVectorsPerBlock; ++v) {
      const Lanes scaled = scales == nullptr ? dots[h][v] : dots[h][v] * scales[v];
      // std::max(scaled, 0.0f) lane by lane: a NaN stays NaN (as in JAX), -0 stays -0.
      const Lanes relu = scaled < Splat(0.0f) ? Splat(0.0f) : scaled;
      logits[v] += weight * relu;
    }
  }
}

template <int64_t kHeads>
void AddHeadPass(const float* q_heads, int64_t d_count, const float* block, const float* weights,
                 const Lanes* scales, Lanes (&logits)[kVectorsPerBlock]) {
  Lanes dots[kHeads][kVectorsPerBlock];
  BlockDots<kHeads>(q_heads, d_count, block, dots);
  AddHeads<kHeads>(dots, weights, scales, logits);
}

// The last `count` (< kHeadsPerPass) heads: one pass of exactly that many.
template <int64_t kHeads>
void AddLastHeads(int64_t count, const float* q_heads, int64_t d_count, const float* block,
                  const float* weights, const Lanes* scales, Lanes (&logits)[kVectorsPerBlock]) {
  if constexpr (kHeads > 0) {
    if (count == kHeads)
      AddHeadPass<kHeads>(q_heads, d_count, block, weights, scales, logits);
    else
      AddLastHeads<kHeads - 1>(count, q_heads, d_count, block, weights, scales, logits);
  }
}

// Keys [first_key, end_key) of row `row` (= b * M + t) of the logits into `logits` [N] (the
// row; first_key a multiple of kKeysPerBlock): per key block, the heads in passes of
// kHeadsPerPass (the sums over h still in order, from 0); -inf from the row's length on.
void LogitsSpan(const IndexerProblem& p, const BlockedKeys& keys, int64_t row, int64_t first_key,
                int64_t end_key, IndexerScratch& scratch, float* logits) {
  const int64_t n = p.keys_count, heads = p.heads, d_count = p.head_dim;
  const int64_t b = row / p.queries;
  const int64_t length = p.lengths == nullptr ? n : ClampLength(p.lengths[row], n);
  const int64_t scored_end = std::min(end_key, length);
  if (first_key < scored_end) {
    scratch.q_row.resize(static_cast<size_t>(heads * d_count));
    for (int64_t i = 0; i < heads * d_count; ++i)
      scratch.q_row[i] = InputAt(p, p.q, row * heads * d_count + i);
  }
  const float* weights = p.weights + row * heads;
  for (int64_t block_key = first_key; block_key < scored_end; block_key += kKeysPerBlock) {
    const int64_t keys_here = std::min(kKeysPerBlock, scored_end - block_key);
    Lanes scales_storage[kVectorsPerBlock] = {};
    const Lanes* scales = nullptr;
    if (p.key_scales != nullptr) {
      float padded[kKeysPerBlock] = {};
      std::memcpy(padded, p.key_scales + b * n + block_key, keys_here * sizeof(float));
      for (int64_t v = 0; v < kVectorsPerBlock; ++v)
        scales_storage[v] = LoadLanes(padded + v * kLanes);
      scales = scales_storage;
    }
    const float* key_block = keys.Block(p, b, block_key / kKeysPerBlock);
    Lanes sums[kVectorsPerBlock];
    for (int64_t v = 0; v < kVectorsPerBlock; ++v) sums[v] = Splat(0.0f);
    int64_t h = 0;
    for (; h + kHeadsPerPass <= heads; h += kHeadsPerPass)
      AddHeadPass<kHeadsPerPass>(scratch.q_row.data() + h * d_count, d_count, key_block,
                                 weights + h, scales, sums);
    AddLastHeads<kHeadsPerPass - 1>(heads - h, scratch.q_row.data() + h * d_count, d_count,
                                    key_block, weights + h, scales, sums);
    float block_logits[kKeysPerBlock];
    std::memcpy(block_logits, sums, sizeof(block_logits));
    std::memcpy(logits + block_key, block_logits, keys_here * sizeof(float));
  }
  std::fill(logits + std::max(first_key, scored_end), logits + end_key,
            -std::numeric_limits<float>::infinity());
}

// The work items of a call: spans of kKeysPerSpan keys of rows [0, rows), row-major, so that
// a few long rows still spread over every core.
constexpr int64_t kKeysPerSpan = 1024;  // a multiple of kKeysPerBlock

struct Spans {
  int64_t per_row = 0;
  int64_t count = 0;
};

Spans SpansOf(const IndexerProblem& p, int64_t rows) {
  Spans spans;
  spans.per_row = (p.keys_count + kKeysPerSpan - 1) / kKeysPerSpan;
  spans.count = rows * spans.per_row;
  return spans;
}

// Span `span` of `spans` into logits [rows, N]; invalid rows (num_valid_rows) are skipped.
void LogitsOfSpans(const IndexerProblem& p, const BlockedKeys& keys, const Spans& spans,
                   const TopkProblem* selection, IndexerScratch& scratch, int64_t first,
                   int64_t end, float* logits) {
  for (int64_t span = first; span < end; ++span) {
    const int64_t row = span / spans.per_row;
    if (selection != nullptr &&
        !RowIsValid(row, selection->num_valid_rows, selection->rows_per_group))
      continue;
    const int64_t first_key = (span % spans.per_row) * kKeysPerSpan;
    LogitsSpan(p, keys, row, first_key, std::min(first_key + kKeysPerSpan, p.keys_count), scratch,
               logits + row * p.keys_count);
  }
}

}  // namespace

void IndexerLogitsCpu(const IndexerProblem& p, const ScheduleTask& schedule, int64_t pool_threads) {
  const BlockedKeys keys = DecodedKeys(p, schedule, pool_threads);
  const Spans spans = SpansOf(p, p.batch * p.queries);
  ParallelRows<IndexerScratch>(
      spans.count, kKeysPerSpan * p.heads * p.head_dim, schedule, pool_threads,
      [&](IndexerScratch& scratch, int64_t first, int64_t end) {
        LogitsOfSpans(p, keys, spans, nullptr, scratch, first, end, p.logits);
      });
}

void IndexerTopkCpu(const IndexerProblem& p, const TopkProblem& selection,
                    const ScheduleTask& schedule, int64_t pool_threads) {
  const BlockedKeys keys = DecodedKeys(p, schedule, pool_threads);
  const int64_t rows = p.batch * p.queries, n = p.keys_count;
  if (rows <= pool_threads) {
    // Fewer rows than threads: their logits into a buffer of those rows, spread over the
    // cores by spans of keys, then each row's selection from it.
    std::vector<float> logits(static_cast<size_t>(rows * n));
    const Spans spans = SpansOf(p, rows);
    ParallelRows<IndexerScratch>(
        spans.count, kKeysPerSpan * p.heads * p.head_dim, schedule, pool_threads,
        [&](IndexerScratch& scratch, int64_t first, int64_t end) {
          LogitsOfSpans(p, keys, spans, &selection, scratch, first, end, logits.data());
        });
    ParallelRows<IndexerScratch>(
        rows, n, schedule, pool_threads, [&](IndexerScratch& scratch, int64_t first, int64_t end) {
          for (int64_t row = first; row < end; ++row)
            TopkCpuFloat32Row(selection, row, logits.data() + row * n, scratch.selection);
        });
    return;
  }
  ParallelRows<IndexerScratch>(
      rows, n * p.heads * p.head_dim, schedule, pool_threads,
      [&](IndexerScratch& scratch, int64_t first, int64_t end) {
        scratch.logits.resize(static_cast<size_t>(n));
        for (int64_t row = first; row < end; ++row) {
          // An invalid row (num_valid_rows) is all -1 and its logits are never computed.
          if (RowIsValid(row, selection.num_valid_rows, selection.rows_per_group))
            LogitsSpan(p, keys, row, 0, n, scratch, scratch.logits.data());
          TopkCpuFloat32Row(selection, row, scratch.logits.data(), scratch.selection);
        }
      });
}

}  // namespace jax_topk
