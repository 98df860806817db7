// The lightning indexer's CPU handler. The keys of each sequence are widened to float32 once
// per call, in blocks of kKeysPerBlock keys stored [D, keys] (key-minor); then each query row
// t, with L = its clamped length, for each block of keys below L:
//   1. for each head h in order: dot[s] = sum over d in order of q[t,h,d] * keys[s,d] from 0
//      (float32; a product of two bfloat16 or float8 values is exact in float32), scaled by
//      key_scales[s], relu, and logits[s] += weights[t,h] * relu (from logits[s] = 0);
//   2. logits[s] = -inf for s >= L.
// Vectorised across keys only (the lanes hold different s; 4 or 8 heads share each key
// load, their dots in registers): 4 lanes everywhere, 8 (AVX2, no FMA) where the CPU has them,
// picked at run time and giving the same bits. Every element's additions are in the order
// above: the same bits every run, whatever the thread count. Built without FMA contraction
// (CMakeLists.txt). Spans of keys of the rows are spread over the host's cores; indexer_topk
// selects from a row buffer as topk_filtered does.
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

constexpr int64_t kKeysPerBlock = 8;  // keys scored side by side, in vector lanes

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

// How one key block is scored: the compiler's generic vectors of float32 lanes (their + and *
// are the IEEE float32 operations lane by lane, as on scalars), kVectors of them per block,
// and kHeads heads whose dots share each load of the block.
template <typename LanesType, int64_t kVectorsPerBlock, int64_t kHeadsPerPass>
struct BlockShape {
  using Lanes = LanesType;
  static constexpr int64_t kLanes = sizeof(Lanes) / sizeof(float);
  static constexpr int64_t kVectors = kVectorsPerBlock;
  static constexpr int64_t kHeads = kHeadsPerPass;
  static_assert(kLanes * kVectors == kKeysPerBlock);
};
// 4 lanes (SSE2 on x86-64, NEON on arm64), 2 vectors, 4 heads: 8 dot vectors in registers.
using FourLanes = BlockShape<float __attribute__((vector_size(16))), 2, 4>;
// 8 lanes (AVX2, x86-64 only, picked at run time), 1 vector, 8 heads.
using EightLanes = BlockShape<float __attribute__((vector_size(32))), 1, 8>;

#define JAX_TOPK_INLINE inline __attribute__((always_inline))

// Lanes from memory (by reference: an 8-lane value must not cross a default-target ABI).
template <typename Lanes>
JAX_TOPK_INLINE void Load(Lanes& lanes, const float* from) {
  std::memcpy(&lanes, from, sizeof(lanes));
}

// The dots of heads [0, kHeads) of q_heads ([kHeads, D]) with one key block: each lane's sum
// over d in order from 0, exactly the scalar loop's, kHeads * kKeysPerBlock of them at once.
template <typename Shape, int64_t kHeads>
JAX_TOPK_INLINE void BlockDots(const float* q_heads, int64_t d_count, const float* block,
                               typename Shape::Lanes (&dots)[kHeads][Shape::kVectors]) {
  using Lanes = typename Shape::Lanes;
  for (int64_t h = 0; h < kHeads; ++h)
    for (int64_t v = 0; v < Shape::kVectors; ++v) dots[h][v] = Lanes{};  // +0
  for (int64_t d = 0; d < d_count; ++d) {
    Lanes key[Shape::kVectors];
    for (int64_t v = 0; v < Shape::kVectors; ++v)
      Load(key[v], block + d * kKeysPerBlock + v * Shape::kLanes);
    for (int64_t h = 0; h < kHeads; ++h) {
      // A scalar operand is broadcast to every lane (a copy, no arithmetic).
      const float q_value = q_heads[h * d_count + d];
      for (int64_t v = 0; v < Shape::kVectors; ++v) dots[h][v] += q_value * key[v];
    }
  }
}

// logits += weights[h] * relu(dots[h] * scales) for heads h of this pass, in order.
template <typename Shape, int64_t kHeads>
JAX_TOPK_INLINE void AddHeads(const typename Shape::Lanes (&dots)[kHeads][Shape::kVectors],
                              const float* weights, const float* scales,
                              typename Shape::Lanes (&logits)[Shape::kVectors]) {
  using Lanes = typename Shape::Lanes;
  for (int64_t h = 0; h < kHeads; ++h) {
    const float weight = weights[h];
    for (int64_t v = 0; v < Shape::kVectors; ++v) {
      Lanes scaled = dots[h][v];
      if (scales != nullptr) {
        Lanes scale;
        Load(scale, scales + v * Shape::kLanes);
        scaled = dots[h][v] * scale;
      }
      // std::max(scaled, 0.0f) lane by lane: a NaN stays NaN (as in JAX), -0 stays -0.
      const Lanes relu = scaled < 0.0f ? Lanes{} : scaled;
      logits[v] += weight * relu;
    }
  }
}

// One pass over heads [0, kHeads) (kHeads of them; the last pass of a row may hold fewer
// than Shape::kHeads: `count` picks its instance).
template <typename Shape, int64_t kHeads>
JAX_TOPK_INLINE void AddHeadPass(int64_t count, const float* q_heads, int64_t d_count,
                                 const float* block, const float* weights, const float* scales,
                                 typename Shape::Lanes (&logits)[Shape::kVectors]) {
  if constexpr (kHeads > 0) {
    if (count == kHeads) {
      typename Shape::Lanes dots[kHeads][Shape::kVectors];
      BlockDots<Shape, kHeads>(q_heads, d_count, block, dots);
      AddHeads<Shape, kHeads>(dots, weights, scales, logits);
    } else {
      AddHeadPass<Shape, kHeads - 1>(count, q_heads, d_count, block, weights, scales, logits);
    }
  }
}

// The kKeysPerBlock logits of one key block ([D, kKeysPerBlock]) into `out`: the heads in
// passes of Shape::kHeads, so the sums over h stay in order, from 0. `scales` is the block's
// kKeysPerBlock key scales, or nullptr.
template <typename Shape>
JAX_TOPK_INLINE void ScoreBlockOf(const float* q_row, int64_t heads, int64_t d_count,
                                  const float* block, const float* weights, const float* scales,
                                  float* out) {
  typename Shape::Lanes sums[Shape::kVectors];
  for (int64_t v = 0; v < Shape::kVectors; ++v) sums[v] = typename Shape::Lanes{};  // +0
  for (int64_t h = 0; h < heads; h += Shape::kHeads)
    AddHeadPass<Shape, Shape::kHeads>(std::min(Shape::kHeads, heads - h), q_row + h * d_count,
                                      d_count, block, weights + h, scales, sums);
  std::memcpy(out, sums, sizeof(sums));
}

using ScoreBlock = void (*)(const float* q_row, int64_t heads, int64_t d_count, const float* block,
                            const float* weights, const float* scales, float* out);

void ScoreBlockFourLanes(const float* q_row, int64_t heads, int64_t d_count, const float* block,
                         const float* weights, const float* scales, float* out) {
  ScoreBlockOf<FourLanes>(q_row, heads, d_count, block, weights, scales, out);
}

#if defined(__x86_64__) && defined(__GNUC__)
// The same code compiled for AVX2 (not FMA: the file is built with -ffp-contract=off and
// the target enables no fused multiply-add), run only where the CPU and the OS support it.
__attribute__((target("avx2"))) void ScoreBlockEightLanes(const float* q_row, int64_t heads,
                                                          int64_t d_count, const float* block,
                                                          const float* weights, const float* scales,
                                                          float* out) {
  ScoreBlockOf<EightLanes>(q_row, heads, d_count, block, weights, scales, out);
}
#endif

// The widest block scorer this CPU runs: every one gives the same bits.
ScoreBlock BlockScorer() {
#if defined(__x86_64__) && defined(__GNUC__)
  if (__builtin_cpu_supports("avx2")) return ScoreBlockEightLanes;
#endif
  return ScoreBlockFourLanes;
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
  const ScoreBlock score_block = BlockScorer();
  for (int64_t block_key = first_key; block_key < scored_end; block_key += kKeysPerBlock) {
    const int64_t keys_here = std::min(kKeysPerBlock, scored_end - block_key);
    float padded_scales[kKeysPerBlock] = {};
    const float* scales = nullptr;
    if (p.key_scales != nullptr) {
      std::memcpy(padded_scales, p.key_scales + b * n + block_key, keys_here * sizeof(float));
      scales = padded_scales;
    }
    float block_logits[kKeysPerBlock];
    score_block(scratch.q_row.data(), heads, d_count, keys.Block(p, b, block_key / kKeysPerBlock),
                weights, scales, block_logits);
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
