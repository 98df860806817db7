// The lightning indexer's CPU handler. Keys are widened to float32 in blocks of 8, [D, 8]
// (once per call for many rows; block by block as scored for few rows: no N * D buffer).
// Per query row t (L its clamped length), per block below L: for each head h in order, the
// dot over d in order from 0 of q[t,h,d] * keys[s,d] (exact products), times key_scales[s],
// relu, logits[s] += weights[t,h] * relu from 0; -inf for s >= L. Sums of more than 128
// terms over d, or 64 heads, go in blocks (BlockDots, ScoreBlockOf: the contract's bound).
// Vectorised across keys only (4 lanes, or 8 with AVX2 and no FMA, picked at run time: the same
// bits), 4 or 8 heads sharing each key load with their dots in registers; so each element's sums
// are in that order, the same bits whatever the thread count. Built without FMA contraction. Spans
// of 1024 keys are spread over the cores; indexer_topk selects from a row buffer as topk_filtered
// does. Limits: compute-bound, ~1 load per 8-16 multiply-adds.
#include "cpu/indexer_cpu.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <memory>
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

// Every float8_e4m3fn value widened (Float32BitsOfFp8E4M3 once per bit pattern).
const float* Fp8Values() {
  static const std::array<float, 256> values = [] {
    std::array<float, 256> table{};
    for (uint32_t bits = 0; bits < 256; ++bits)
      table[bits] = FloatOfBits(Float32BitsOfFp8E4M3(static_cast<uint8_t>(bits)));
    return table;
  }();
  return values.data();
}

// Elements [first, first + count) of q or keys, widened exactly, `stride` floats apart in `to`.
void WidenInputs(const IndexerProblem& p, const void* data, int64_t first, int64_t count,
                 int64_t stride, float* to) {
  if (p.input == IndexerInput::kBfloat16) {
    const uint16_t* from = static_cast<const uint16_t*>(data) + first;
    for (int64_t i = 0; i < count; ++i) to[i * stride] = FloatOfBits(Float32BitsOfBf16(from[i]));
  } else {
    const uint8_t* from = static_cast<const uint8_t*>(data) + first;
    const float* fp8 = Fp8Values();
    for (int64_t i = 0; i < count; ++i) to[i * stride] = fp8[from[i]];
  }
}

constexpr int64_t kKeysPerBlock = 8;  // keys scored side by side, in vector lanes

// Key block `block` of sequence b widened into `to` [D, kKeysPerBlock] (key-minor), the last
// block zero-padded.
void WidenKeyBlock(const IndexerProblem& p, int64_t b, int64_t block, float* to) {
  const int64_t n = p.keys_count, d_count = p.head_dim, first_key = block * kKeysPerBlock;
  const int64_t keys_here = std::min(kKeysPerBlock, n - first_key);
  for (int64_t j = 0; j < keys_here; ++j)
    WidenInputs(p, p.keys, (b * n + first_key + j) * d_count, d_count, kKeysPerBlock, to + j);
  for (int64_t j = keys_here; j < kKeysPerBlock; ++j)
    for (int64_t d = 0; d < d_count; ++d) to[d * kKeysPerBlock + j] = 0.0f;
}

// The keys of every sequence in blocks of kKeysPerBlock [D, kKeysPerBlock]: widened once per
// call into [batch, blocks, D, kKeysPerBlock] when many rows share them, or (few rows) each
// block as it is scored, into the scorer's own buffer (no buffer of N * D floats to fill).
struct BlockedKeys {
  int64_t blocks = 0;
  std::unique_ptr<float[]> values;  // nullptr: widened block by block
  const float* Block(const IndexerProblem& p, int64_t b, int64_t block, float* spare) const {
    if (values == nullptr) {
      WidenKeyBlock(p, b, block, spare);
      return spare;
    }
    return values.get() + ((b * blocks + block) * p.head_dim) * kKeysPerBlock;
  }
};

BlockedKeys KeysFor(const IndexerProblem& p, int64_t rows, const ScheduleTask& schedule,
                    int64_t pool_threads) {
  BlockedKeys keys;
  keys.blocks = (p.keys_count + kKeysPerBlock - 1) / kKeysPerBlock;
  if (rows <= pool_threads) return keys;  // few rows: each block widened at most rows times
  const int64_t block_size = p.head_dim * kKeysPerBlock;
  keys.values.reset(new float[static_cast<size_t>(p.batch * keys.blocks * block_size)]);
  struct NoState {};
  ParallelRows<NoState>(p.batch * keys.blocks, block_size, schedule, pool_threads,
                        [&](NoState&, int64_t first, int64_t end) {
                          for (int64_t unit = first; unit < end; ++unit)
                            WidenKeyBlock(p, unit / keys.blocks, unit % keys.blocks,
                                          keys.values.get() + unit * block_size);
                        });
  return keys;
}

// One thread's buffers, reused across its rows.
struct IndexerScratch {
  std::vector<float> q_row;      // [H, D] of the current row
  std::vector<float> logits;     // [N]: indexer_topk's row buffer
  std::vector<float> key_block;  // [D, kKeysPerBlock] when keys are widened block by block
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

// The sums' blocks (docs/contract.md section 9): a dot adds kIndexerDotBlock terms of d in order
// from 0, then adds those block sums in order; the logit adds kIndexerHeadBlock heads' terms
// likewise. A sum of n terms in order rounds as many as n - 1 times, so unblocked sums could leave
// the contract's bound (2e-5 of the terms' magnitudes, ~335 roundings) past D + H ~ 335;
// blocked, D and H of thousands stay within it. D <= 128 and H <= 64 are one block each: the
// plain sums in order.
constexpr int64_t kDotBlock = kIndexerDotBlock;
constexpr int64_t kHeadBlock = kIndexerHeadBlock;

// The sums over d in [first, end) of heads [0, kHeads) of q_heads ([kHeads, D]) with one key
// block, each lane's in order from 0 (exactly the scalar loop's), kHeads * kKeysPerBlock at once.
template <typename Shape, int64_t kHeads>
JAX_TOPK_INLINE void BlockDotRange(const float* q_heads, int64_t d_count, int64_t first,
                                   int64_t end, const float* block,
                                   typename Shape::Lanes (&dots)[kHeads][Shape::kVectors]) {
  using Lanes = typename Shape::Lanes;
  for (int64_t h = 0; h < kHeads; ++h)
    for (int64_t v = 0; v < Shape::kVectors; ++v) dots[h][v] = Lanes{};  // +0
  for (int64_t d = first; d < end; ++d) {
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

// The dots of heads [0, kHeads) with one key block: the first kDotBlock terms' sum, then each
// later block's sum added in order.
template <typename Shape, int64_t kHeads>
JAX_TOPK_INLINE void BlockDots(const float* q_heads, int64_t d_count, const float* block,
                               typename Shape::Lanes (&dots)[kHeads][Shape::kVectors]) {
  BlockDotRange<Shape, kHeads>(q_heads, d_count, 0, std::min(kDotBlock, d_count), block, dots);
  for (int64_t first = kDotBlock; first < d_count; first += kDotBlock) {
    typename Shape::Lanes partial[kHeads][Shape::kVectors];
    BlockDotRange<Shape, kHeads>(q_heads, d_count, first, std::min(first + kDotBlock, d_count),
                                 block, partial);
    for (int64_t h = 0; h < kHeads; ++h)
      for (int64_t v = 0; v < Shape::kVectors; ++v) dots[h][v] += partial[h][v];
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
// passes of Shape::kHeads, so the sums over h stay in order, from 0, within each block of
// kHeadBlock heads; the blocks' sums added in order. `scales` is the block's kKeysPerBlock key
// scales, or nullptr.
template <typename Shape>
JAX_TOPK_INLINE void ScoreBlockOf(const float* q_row, int64_t heads, int64_t d_count,
                                  const float* block, const float* weights, const float* scales,
                                  float* out) {
  static_assert(kHeadBlock % Shape::kHeads == 0, "a head block is whole passes");
  using Lanes = typename Shape::Lanes;
  Lanes sums[Shape::kVectors];
  for (int64_t v = 0; v < Shape::kVectors; ++v) sums[v] = Lanes{};  // +0
  for (int64_t first = 0; first < heads; first += kHeadBlock) {
    Lanes block_sums[Shape::kVectors];
    for (int64_t v = 0; v < Shape::kVectors; ++v) block_sums[v] = Lanes{};  // +0
    const int64_t end = std::min(first + kHeadBlock, heads);
    for (int64_t h = first; h < end; h += Shape::kHeads)
      AddHeadPass<Shape, Shape::kHeads>(std::min(Shape::kHeads, end - h), q_row + h * d_count,
                                        d_count, block, weights + h, scales, block_sums);
    // +0 + a block's sum is that sum's bits: a sum from +0 is never -0, a NaN keeps its payload.
    for (int64_t v = 0; v < Shape::kVectors; ++v) sums[v] += block_sums[v];
  }
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
// kHeadsPerPass (the sums over h still in order, from 0, in blocks of kHeadBlock heads: see
// ScoreBlockOf); -inf from the row's length on.
void LogitsSpan(const IndexerProblem& p, const BlockedKeys& keys, int64_t row, int64_t first_key,
                int64_t end_key, IndexerScratch& scratch, float* logits) {
  const int64_t n = p.keys_count, heads = p.heads, d_count = p.head_dim;
  const int64_t b = row / p.queries;
  const int64_t length = p.lengths == nullptr ? n : ClampLength(p.lengths[row], n);
  const int64_t scored_end = std::min(end_key, length);
  if (first_key < scored_end) {
    scratch.q_row.resize(static_cast<size_t>(heads * d_count));
    WidenInputs(p, p.q, row * heads * d_count, heads * d_count, 1, scratch.q_row.data());
  }
  const float* weights = p.weights + row * heads;
  const ScoreBlock score_block = BlockScorer();
  scratch.key_block.resize(static_cast<size_t>(d_count * kKeysPerBlock));
  for (int64_t block_key = first_key; block_key < scored_end; block_key += kKeysPerBlock) {
    const int64_t keys_here = std::min(kKeysPerBlock, scored_end - block_key);
    float padded_scales[kKeysPerBlock] = {};
    const float* scales = nullptr;
    if (p.key_scales != nullptr) {
      std::memcpy(padded_scales, p.key_scales + b * n + block_key, keys_here * sizeof(float));
      scales = padded_scales;
    }
    float block_logits[kKeysPerBlock];
    score_block(scratch.q_row.data(), heads, d_count,
                keys.Block(p, b, block_key / kKeysPerBlock, scratch.key_block.data()), weights,
                scales, block_logits);
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
  const BlockedKeys keys = KeysFor(p, p.batch * p.queries, schedule, pool_threads);
  const Spans spans = SpansOf(p, p.batch * p.queries);
  ParallelRows<IndexerScratch>(
      spans.count, kKeysPerSpan * p.heads * p.head_dim, schedule, pool_threads,
      [&](IndexerScratch& scratch, int64_t first, int64_t end) {
        LogitsOfSpans(p, keys, spans, nullptr, scratch, first, end, p.logits);
      });
}

void IndexerTopkCpu(const IndexerProblem& p, const TopkProblem& selection,
                    const ScheduleTask& schedule, int64_t pool_threads) {
  const int64_t rows = p.batch * p.queries, n = p.keys_count;
  const BlockedKeys keys = KeysFor(p, rows, schedule, pool_threads);
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
