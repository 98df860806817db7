// topk_small_rows: exact top-k of short rows (MoE routing: [T, 256], k = 8), one warp per row
// (plain 16-bit rows of <= 256 columns at k <= 16: half a warp, two rows a warp; LaunchPaired).
// 1. Lane L keeps the ordered keys of columns [L*E, L*E + E) (E = 8/16/32, 16-byte loads where
//    aligned); NaN and columns past the length get key 0, never a candidate.
// 2. Few winners (k <= 32; 16-bit rows: <= 24 from 1024 rows): k rounds of a warp max
//    (redux.sync) over lane maxima (2 a lane past k = 16), each dropping the maxima at it: k keys
//    reach the last max T, so every winner does (~9 of 256 at k = 8). More: the k-th key exactly,
//    by 8-bit digits of the keys from the top, each counted in the warp's own 256 shared bins (a
//    digit whose bin the rank takes whole ends it), so the winners are the keys above it and the
//    lowest columns of its copies: exactly k.
// 3. Keys >= T (or the winners) go in column order (one scan over the row's lanes) to the row's
//    shared buffer.
//    At most 64 (nearly always at k <= 16; always by digits): lane i counts the candidates ahead
//    of its one or two (one compare of (key, inverted column) each, 32-bit for 16-bit keys,
//    broadcast reads, no cross-lane dependency): that is its rank. More: min(k, count) rounds of
//    two redux.sync (max key, min column) over 2 or E slots a lane.
// Instruction-bound (f32 [65536, 256] k = 8: ~400 a row). The rows top_k passes (whole, unpaged,
// all valid, with values) run instances without those options' tests (PlainRows: 12-17 % faster
// there). Limits: kSmallRowsMax* (topk_common.h).
// JAX_TOPK_SMALL_ROWS=digits (read at each launch) takes step 2 by digits at every k, and any
// value keeps a warp a row (tests, benchmarks).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "common/topk_common.h"
#include "kernels/set_bits.cuh"
#include "kernels/topk_cuda.h"
#include "kernels/topk_scan.cuh"

namespace jax_topk {
namespace {

constexpr int kWarpSize = 32;
constexpr unsigned kFullWarp = 0xFFFFFFFFu;
constexpr int kWarpsPerBlock = 4;
constexpr int kThreadsPerBlock = kWarpsPerBlock * kWarpSize;
constexpr int kMaxElemsPerLane = kSmallRowsMaxWidth / kWarpSize;
// Past these k, step 2 runs by digits (each round of the max costs a reduction a winner):
// kSmallRowsMaxKByRounds (topk_common.h) for float32 keys (four digits), fewer for 16-bit ones
// on many rows (two digits; measured on the H200 at 8192-65536 rows, benches/NOTES.md "small
// rows: k past 32 by digits": digits 1.4-2x faster at k = 32, even at 24, slower at 16).
constexpr int kMaxKByRounds16 = 24;
constexpr int64_t kMinRowsForDigits16 = 1024;
static_assert(kSmallRowsMaxK <= 2 * kWarpSize, "winners rank, and empty slots fill, two a lane");
constexpr int kDigitBins = 256;  // step 2 by digits: 8 bits of the key a pass
static_assert(kSmallRowsMaxWidth <= 0xFFFF, "a column fits the low 16 bits of a slot");

// The lanes that serve one row: a whole warp, or half of one for short plain rows (two rows a
// warp, so that each warp-wide step of the rounds, the scan and the ranks serves two rows:
// LaunchPaired). Collectives name only the row's lanes; scans and broadcasts stay inside them.
template <int kLanes>
struct RowLanes {
  static_assert(kLanes == kWarpSize || kLanes == kWarpSize / 2, "a warp or half of one");
  int lane;       // this lane's place among the row's lanes
  int first;      // the warp lane of the row's lane 0
  unsigned mask;  // the row's lanes in the warp
  __device__ RowLanes()
      : lane(static_cast<int>(threadIdx.x % kLanes)),
        first(static_cast<int>(threadIdx.x % kWarpSize) - lane),
        mask(kLanes == kWarpSize ? kFullWarp : ((1u << kLanes) - 1) << first) {}
  // Bit i: lane i of the row voted.
  __device__ uint32_t Ballot(bool vote) const { return __ballot_sync(mask, vote) >> first; }
  __device__ uint32_t Max(uint32_t value) const { return __reduce_max_sync(mask, value); }
  __device__ uint32_t Min(uint32_t value) const { return __reduce_min_sync(mask, value); }
  __device__ int InclusiveSum(int value) const {
#pragma unroll
    for (int offset = 1; offset < kLanes; offset *= 2) {
      const int other = __shfl_up_sync(mask, value, offset, kLanes);
      if (lane >= offset) value += other;
    }
    return value;
  }
  __device__ int FromLastLane(int value) const {
    return __shfl_sync(mask, value, kLanes - 1, kLanes);
  }
  __device__ void Sync() const { __syncwarp(mask); }
};

// Key 0 marks "no candidate": every non-NaN value's ordered key is above it (-inf's is 0x7F or
// more), so NaN, masked columns and empty slots need no flag of their own.
constexpr uint32_t kNoCandidate = 0;
// A slot's column word: the column in the low 16 bits, rank + 1 above once the slot is taken, so a
// taken slot can never match a later winner's column. An empty slot holds kNoColumn.
constexpr int kRankShift = 16;
constexpr uint32_t kColumnMask = (1u << kRankShift) - 1;
constexpr uint32_t kNoColumn = kColumnMask;
// The shared buffer holds (key, kColumnMask - column): (key << 32 | that) orders candidates as the
// output does (higher key first, then lower column) in one 64-bit compare.
__device__ __forceinline__ uint32_t InvertedColumn(uint32_t column) {
  return kColumnMask - column;
}

// How each score type reads as a key and writes back as a value. kMaskedBits (a NaN) stands in
// for a column past the length, so one NaN test excludes both.
struct Float32Rules {
  static constexpr bool kPlain = false;  // PlainRows below
  using Bits = uint32_t;
  static constexpr Bits kMaskedBits = 0x7FFFFFFFu;
  static constexpr Bits kEmptyValueBits = kNegInfF32Bits;
  // OrderedKeyF32 as one xor with the sign smeared, and the NaN test as one float compare:
  // 4 instructions an element where the shared helpers compile to 6.
  __device__ static uint32_t Key(Bits bits) {
    const uint32_t sign_smear = static_cast<uint32_t>(static_cast<int32_t>(bits) >> 31);
    const float value = __uint_as_float(bits);
    return value != value ? kNoCandidate : bits ^ (sign_smear | 0x80000000u);
  }
  __device__ static Bits ValueBits(uint32_t key) { return BitsFromOrderedKeyF32(key); }
};
// bfloat16 and float16 share the key transform; only their NaN (and so -inf) differ.
template <ScoreType kScoreType>
struct SixteenBitRules {
  static_assert(kScoreType == ScoreType::kBfloat16 || kScoreType == ScoreType::kFloat16);
  static constexpr bool kBfloat16 = kScoreType == ScoreType::kBfloat16;
  static constexpr bool kPlain = false;  // PlainRows below
  using Bits = uint16_t;
  static constexpr Bits kMaskedBits = 0x7FFFu;
  static constexpr Bits kEmptyValueBits = kBfloat16 ? kNegInfBf16Bits : kNegInfF16Bits;
  // The keys of +inf and -inf (whose bits are +inf's key): NaN keys lie outside them.
  static constexpr uint32_t kPlusInfKey = (kBfloat16 ? 0x7F80u : 0x7C00u) | 0x8000u;
  static constexpr uint32_t kMinusInfKey = 0xFFFFu - kPlusInfKey;
  // OrderedKeyBf16 as Float32Rules does it, on the sign-extended bits (~ clears the extension),
  // and NaN as a key outside [-inf, +inf]: 6 instructions an element where the helpers take 8.
  __device__ static uint32_t Key(Bits bits) {
    const int32_t sign_extended = static_cast<int16_t>(bits);
    const uint32_t sign_smear = static_cast<uint32_t>(sign_extended >> 31);
    const uint32_t key = static_cast<uint32_t>(sign_extended) ^ (sign_smear | 0x8000u);
    return key - kMinusInfKey > kPlusInfKey - kMinusInfKey ? kNoCandidate : key;
  }
  __device__ static Bits ValueBits(uint32_t key) { return BitsFromOrderedKeyBf16(key); }
};

// The rows top_k passes: whole (no lengths), every row valid, no page table, with a values
// output. Their own instances skip the per-row lengths and valid-row loads and the page
// transform's tests (benches/NOTES.md "small rows: a plain instance").
template <typename Rules>
struct PlainRows : Rules {
  static constexpr bool kPlain = true;
};
__host__ bool IsPlain(const TopkProblem& problem) {
  return problem.lengths == nullptr && problem.num_valid_rows == nullptr &&
         problem.page_table == nullptr && problem.values != nullptr;
}

// Keys of columns [first_column, first_column + kElems); kNoCandidate at or past `length` (nothing
// there is read). On a 16-byte aligned row every lane's slice is too (kElems * element size is a
// multiple of 16), so whole vectors load where they end before the length, single elements where
// one straddles it and everywhere on an unaligned row.
template <typename Rules, int kElems>
__device__ __forceinline__ void LoadKeys(const typename Rules::Bits* row_scores, bool aligned,
                                         int first_column, int length, uint32_t (&keys)[kElems]) {
  using Bits = typename Rules::Bits;
  constexpr int kElemsPerVector = 16 / sizeof(Bits);
  static_assert(kElems % kElemsPerVector == 0, "a slice is whole 16-byte vectors");
  Bits bits[kElems];
  if (aligned && first_column + kElems <= length) {  // the common case: whole vectors only
#pragma unroll
    for (int vector = 0; vector < kElems / kElemsPerVector; ++vector) {
      const uint4 loaded =
          __ldg(reinterpret_cast<const uint4*>(row_scores + first_column) + vector);
      memcpy(bits + vector * kElemsPerVector, &loaded, sizeof(loaded));
    }
  } else {
#pragma unroll
    for (int vector = 0; vector < kElems / kElemsPerVector; ++vector) {
      const int column = first_column + vector * kElemsPerVector;
      Bits* vector_bits = bits + vector * kElemsPerVector;
      if (aligned && column + kElemsPerVector <= length) {
        const uint4 loaded = __ldg(reinterpret_cast<const uint4*>(row_scores + column));
        memcpy(vector_bits, &loaded, sizeof(loaded));
      } else {
#pragma unroll
        for (int e = 0; e < kElemsPerVector; ++e) {
          vector_bits[e] =
              column + e < length ? __ldg(row_scores + column + e) : Rules::kMaskedBits;
        }
      }
    }
  }
#pragma unroll
  for (int e = 0; e < kElems; ++e) keys[e] = Rules::Key(bits[e]);
}

// Step 2, by all lanes: a key that at least k keys reach (1 when fewer than k are candidates),
// from k rounds of a warp max over kGroups maxima a lane (of equal parts of the slice), each round
// dropping the maxima equal to it. One maximum a lane leaves ~9 candidates at k = 8 but ~100 at
// k = 32 (n = 256, normal scores, simulated); two leave ~40 at k = 32.
constexpr int kMaxKForOneMaximum = 16;
template <int kGroups, int kElems, int kLanes>
__device__ __forceinline__ uint32_t CandidateThreshold(const uint32_t (&keys)[kElems], int k,
                                                       const RowLanes<kLanes>& lanes) {
  static_assert(kElems % kGroups == 0, "equal parts");
  uint32_t group_best[kGroups];
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    group_best[g] = keys[g * (kElems / kGroups)];
#pragma unroll
    for (int e = 1; e < kElems / kGroups; ++e) {
      group_best[g] = max(group_best[g], keys[g * (kElems / kGroups) + e]);
    }
  }
  uint32_t threshold = kNoCandidate;  // rounds past the last candidate return 0
  for (int round = 0; round < k; ++round) {
    uint32_t lane_best = group_best[0];
#pragma unroll
    for (int g = 1; g < kGroups; ++g) lane_best = max(lane_best, group_best[g]);
    threshold = lanes.Max(lane_best);
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
      if (group_best[g] == threshold) group_best[g] = kNoCandidate;
    }
  }
  return max(threshold, kNoCandidate + 1);
}

// Step 2 by digits: which keys win. The keys above `key` all do, and the first `quota` keys
// equal to it in column order (none when quota is 0).
struct Boundary {
  uint32_t key;
  int quota;
};

// By all lanes, on a row of more valid keys than k: the k-th largest key, 8 bits at a time from
// the top. Each digit counts the keys that share the digits found so far in `bins` (the
// warp's own 256 shared ints); lane L walks bins 255 - 8L down to 248 - 8L, and one warp scan
// finds the bin holding the rank. A bin the rank takes whole settles the search early: the winners
// are then every key at or above its least key. kKeyBits is 32 (float32) or 16.
template <int kKeyBits, int kElems>
__device__ __forceinline__ Boundary KthKeyByDigits(const uint32_t (&keys)[kElems], int k,
                                                   int* bins) {
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  uint32_t prefix = 0;       // the k-th key's digits found so far, in place
  uint32_t prefix_mask = 0;  // the bits they cover
  int rank = k;              // the k-th key's rank among the keys that share the prefix
#pragma unroll 1
  for (int shift = kKeyBits - 8; shift >= 0; shift -= 8) {
    reinterpret_cast<int4*>(bins)[2 * lane] = make_int4(0, 0, 0, 0);
    reinterpret_cast<int4*>(bins)[2 * lane + 1] = make_int4(0, 0, 0, 0);
    __syncwarp();
#pragma unroll
    for (int e = 0; e < kElems; ++e) {
      if (keys[e] != kNoCandidate && (keys[e] & prefix_mask) == prefix) {
        atomicAdd(&bins[(keys[e] >> shift) & (kDigitBins - 1)], 1);
      }
    }
    __syncwarp();
    const int top = kDigitBins - 1 - 8 * lane;  // this lane's highest bin
    const int4 upper = reinterpret_cast<const int4*>(bins)[2 * (kWarpSize - 1 - lane) + 1];
    const int4 lower = reinterpret_cast<const int4*>(bins)[2 * (kWarpSize - 1 - lane)];
    const int counts[8] = {upper.w, upper.z, upper.y, upper.x,
                           lower.w, lower.z, lower.y, lower.x};  // bins top, top - 1, ...
    int lane_count = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) lane_count += counts[i];
    const int at_or_above = WarpInclusiveSum(lane_count);
    int above = at_or_above - lane_count;
    const bool holds_rank = above < rank && rank <= at_or_above;  // one lane: rank <= the total
    int bin = 0;
    int bin_above = 0;
    int bin_count = 0;
    if (holds_rank) {
      bool found = false;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        if (!found && above + counts[i] >= rank) {
          found = true;
          bin = top - i;
          bin_above = above;
          bin_count = counts[i];
        }
        above += counts[i];
      }
    }
    const int owner = __ffs(__ballot_sync(kFullWarp, holds_rank)) - 1;
    bin = __shfl_sync(kFullWarp, bin, owner);
    bin_above = __shfl_sync(kFullWarp, bin_above, owner);
    bin_count = __shfl_sync(kFullWarp, bin_count, owner);
    __syncwarp();  // every lane has read the bins before the next digit clears them
    prefix |= static_cast<uint32_t>(bin) << shift;
    prefix_mask |= static_cast<uint32_t>(kDigitBins - 1) << shift;
    rank -= bin_above;
    // The whole bin wins: every key >= its least key (and never key 0, which no bin counts).
    if (rank == bin_count) return {max(prefix, kNoCandidate + 1) - 1, 0};
  }
  return {prefix, rank};  // the k-th key itself, `rank` of its copies taken
}

// Where one row's winners go: column (page-transformed) and value at a slot of the row.
template <typename Rules>
struct RowOutput {
  using Bits = typename Rules::Bits;
  int32_t* indices;
  Bits* values;              // null without a values output
  const int32_t* table_row;  // null without a page table
  int log2_page_size;
  __device__ RowOutput(const TopkProblem& problem, int64_t row)
      : indices(problem.out + row * problem.k),
        values(Rules::kPlain || problem.values != nullptr
                   ? static_cast<Bits*>(problem.values) + row * problem.k
                   : nullptr),
        table_row(Rules::kPlain ? nullptr : PageTableRow(problem, row)),
        log2_page_size(problem.log2_page_size) {}
  __device__ void Winner(int slot, uint32_t column, uint32_t key) const {
    if constexpr (Rules::kPlain) {
      indices[slot] = static_cast<int32_t>(column);
    } else {
      indices[slot] = PageTransform(static_cast<int32_t>(column), table_row, log2_page_size);
    }
    if (Rules::kPlain || values != nullptr) values[slot] = Rules::ValueBits(key);
  }
  __device__ void Empty(int slot) const {
    indices[slot] = kEmptySlot;
    if (Rules::kPlain || values != nullptr) values[slot] = Rules::kEmptyValueBits;
  }
};

// Step 3 when the candidates fit kSlots a lane (one nearly always at k <= 16; two for the
// winners of step 2 by digits): candidate s * kLanes + lane's rank is the number of candidates
// ahead of it (higher key, or equal key and lower column), counted over broadcast reads of the
// buffer that depend on no other lane: ~6 instructions a candidate, where SelectAndWrite's rounds
// take two dependent reductions a winner. A 16-bit key and an inverted column fit one 32-bit
// compare. Unsorted output of no more candidates than k needs no rank (all are taken, in buffer
// order). k <= kLanes * kOutputRounds.
template <typename Rules, int kSlots, int kOutputRounds, int kLanes>
__device__ __forceinline__ void RankAndWrite(const uint2* candidates_buffer, int candidates,
                                             const TopkProblem& problem, int64_t row,
                                             const RowLanes<kLanes>& lanes) {
  const int lane = lanes.lane;
  constexpr bool kSixteenBit = sizeof(typename Rules::Bits) == 2;
  using OrderWord = std::conditional_t<kSixteenBit, uint32_t, uint64_t>;
  const auto order_word = [](uint2 entry) {
    return kSixteenBit ? static_cast<OrderWord>((entry.x << 16) | entry.y)
                       : static_cast<OrderWord>((static_cast<uint64_t>(entry.x) << 32) | entry.y);
  };
  uint2 mine[kSlots];
  OrderWord my_word[kSlots];
  int rank[kSlots];
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int index = s * kLanes + lane;
    mine[s] = index < candidates ? candidates_buffer[index]
                                 : make_uint2(kNoCandidate, InvertedColumn(kNoColumn));
    my_word[s] = order_word(mine[s]);
    rank[s] = 0;
  }
  const int k = problem.k;
  const int ranked = problem.sorted || candidates > k ? candidates : 0;
#pragma unroll 4
  for (int other = 0; other < ranked; ++other) {
    const OrderWord other_word = order_word(candidates_buffer[other]);
#pragma unroll
    for (int s = 0; s < kSlots; ++s) rank[s] += other_word > my_word[s] ? 1 : 0;
  }
  const RowOutput<Rules> output(problem, row);
  int taken_before = 0;  // sorted = false: winners in lower slots (lower columns) so far
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const bool taken = s * kLanes + lane < candidates && rank[s] < k;
    // sorted = false: column order, which is the buffer's.
    int slot = rank[s];
    if (!problem.sorted) {
      const uint32_t taken_lanes = lanes.Ballot(taken);
      slot = taken_before + __popc(taken_lanes & ((1u << lane) - 1));
      taken_before += __popc(taken_lanes);
    }
    if (taken) output.Winner(slot, InvertedColumn(mine[s].y), mine[s].x);
  }
  const int winners = candidates < k ? candidates : k;
#pragma unroll
  for (int round = 0; round < kOutputRounds; ++round) {
    const int slot = round * kLanes + lane;
    if (slot >= winners && slot < k) output.Empty(slot);
  }
}

// Step 3's rounds, by all lanes, with kSlots slots a lane: slot s of lane L holds candidate
// s * 32 + L of the column-ordered buffer (so a lane's slots ascend in column). Takes the
// min(k, candidates) winners and writes them and the empty slots.
template <typename Rules, int kSlots, int kLanes>
__device__ __forceinline__ void SelectAndWrite(const uint2* candidates_buffer, int candidates,
                                               const TopkProblem& problem, int64_t row,
                                               const RowLanes<kLanes>& lanes) {
  const int lane = lanes.lane;
  uint32_t keys[kSlots];
  uint32_t columns[kSlots];
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int index = s * kLanes + lane;
    const uint2 entry = index < candidates ? candidates_buffer[index]
                                           : make_uint2(kNoCandidate, InvertedColumn(kNoColumn));
    keys[s] = entry.x;
    columns[s] = InvertedColumn(entry.y);
  }

  const int k = problem.k;
  const int winners = candidates < k ? candidates : k;
  for (int rank = 0; rank < winners; ++rank) {
    uint32_t lane_best = keys[0];
#pragma unroll
    for (int s = 1; s < kSlots; ++s) lane_best = max(lane_best, keys[s]);
    const uint32_t best = lanes.Max(lane_best);
    // Of this lane's slots at the best key, the first holds the lowest column.
    uint32_t lane_column = kNoColumn;
#pragma unroll
    for (int s = kSlots - 1; s >= 0; --s) lane_column = keys[s] == best ? columns[s] : lane_column;
    const uint32_t winner = lanes.Min(lane_column);
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      if (columns[s] == winner) {
        keys[s] = kNoCandidate;
        columns[s] += static_cast<uint32_t>(rank + 1) << kRankShift;
      }
    }
  }

  const RowOutput<Rules> output(problem, row);
  int taken_before = 0;  // sorted = false: winners in lower slots (lower columns) so far
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const uint32_t rank_plus_one = columns[s] >> kRankShift;
    const bool taken = rank_plus_one != 0;
    int position = static_cast<int>(rank_plus_one) - 1;
    if (!problem.sorted) {
      const uint32_t taken_lanes = lanes.Ballot(taken);
      position = taken_before + __popc(taken_lanes & ((1u << lane) - 1));
      taken_before += __popc(taken_lanes);
    }
    if (taken) {
      output.Winner(position, columns[s] & kColumnMask, candidates_buffer[s * kLanes + lane].x);
    }
  }
  if (lane >= winners && lane < k) output.Empty(lane);  // k <= kLanes (the rounds' limits)
}

// Steps 2-3's compaction, by all lanes: the keys flagged in `bits` go to the row's buffer as
// (key, inverted column) in column order (lane order, then slice order); returns how many.
template <int kElems, int kLanes>
__device__ __forceinline__ int CompactInColumnOrder(uint32_t bits, const uint32_t (&keys)[kElems],
                                                    int first_column, uint2* row_buffer,
                                                    const RowLanes<kLanes>& lanes) {
  const int lane_count = __popc(bits);
  const int inclusive = lanes.InclusiveSum(lane_count);
  const int total = lanes.FromLastLane(inclusive);
  uint2* next_entry = row_buffer + (inclusive - lane_count);
#pragma unroll
  for (int e = 0; e < kElems; ++e) {
    if ((bits >> e) & 1) {
      *next_entry++ = make_uint2(keys[e], InvertedColumn(static_cast<uint32_t>(first_column + e)));
    }
  }
  lanes.Sync();
  return total;
}

// Steps 2 and 3 by digits, by all lanes: the winners (keys above the boundary, then its copies
// lowest column first) go to the warp's buffer in column order, min(k, valid keys) of them, and
// RankAndWrite orders them (every one a winner, one or two a lane).
template <typename Rules, int kElems>
__device__ __forceinline__ void SelectByDigits(const uint32_t (&keys)[kElems], int first_column,
                                               int* bins, uint2* warp_buffer,
                                               const TopkProblem& problem, int64_t row) {
  constexpr int kKeyBits = 8 * sizeof(typename Rules::Bits);
  const int k = problem.k;
  int valid = 0;
#pragma unroll
  for (int e = 0; e < kElems; ++e) valid += keys[e] != kNoCandidate ? 1 : 0;
  const int candidates = static_cast<int>(__reduce_add_sync(kFullWarp, valid));
  // No more valid keys than k: all of them (the keys above key 0).
  const Boundary boundary =
      candidates <= k ? Boundary{kNoCandidate, 0} : KthKeyByDigits<kKeyBits, kElems>(keys, k, bins);
  uint32_t greater_bits = 0;
  uint32_t equal_bits = 0;
#pragma unroll
  for (int e = 0; e < kElems; ++e) {
    greater_bits |= (keys[e] > boundary.key ? 1u : 0u) << e;
    equal_bits |= (keys[e] == boundary.key ? 1u : 0u) << e;
  }
  // The quota of the boundary's copies: lowest columns first (lane order, then slice order).
  const int equal_count = boundary.quota > 0 ? __popc(equal_bits) : 0;
  const int equal_before = WarpInclusiveSum(equal_count) - equal_count;
  const int equal_taken = max(0, min(equal_count, boundary.quota - equal_before));
  const uint32_t taken_bits = greater_bits | LowestSetBits(equal_bits, equal_taken);
  const RowLanes<kWarpSize> lanes;
  const int winners = CompactInColumnOrder(taken_bits, keys, first_column, warp_buffer, lanes);
  if (winners <= kWarpSize) {
    RankAndWrite<Rules, 1, 2>(warp_buffer, winners, problem, row, lanes);
  } else {
    RankAndWrite<Rules, 2, 2>(warp_buffer, winners, problem, row, lanes);
  }
}

// kByDigits: step 2 by digits (k past the rounds' limit, or JAX_TOPK_SMALL_ROWS=digits), an
// instance of its own so that the rounds' instances keep their registers and shared memory.
// kLanes: the lanes a row (16: two rows a warp, rounds only; LaunchPaired).
template <typename Rules, int kElems, bool kByDigits, int kLanes = kWarpSize>
__global__ void __launch_bounds__(kThreadsPerBlock) TopkSmallRowsKernel(const TopkProblem problem) {
  static_assert(kLanes == kWarpSize || !kByDigits, "digits take a whole warp a row");
  constexpr int kRowsPerBlock = kThreadsPerBlock / kLanes;
  using Bits = typename Rules::Bits;
  // (key, InvertedColumn(column)) of each row's candidates in column order; in full only when a
  // row's candidates are many (ties at the threshold, rows in ascending order).
  __shared__ uint2 candidates_buffer[kRowsPerBlock][kLanes * kElems];
  // Each warp's digit histogram (step 2 by digits).
  __shared__ alignas(16) int digit_bins[kByDigits ? kWarpsPerBlock : 1][kByDigits ? kDigitBins : 4];

  const RowLanes<kLanes> lanes;
  const int lane = lanes.lane;
  const int warp = static_cast<int>(threadIdx.x / kWarpSize);
  const int row_in_block = static_cast<int>(threadIdx.x / kLanes);
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + row_in_block;
  // A row's lanes leave together: no collective sees a missing lane (collectives name only them).
  if (row >= problem.rows) return;
  const int k = problem.k;

  if (!Rules::kPlain && !RowIsValid(row, problem.num_valid_rows, problem.rows_per_group)) {
    const RowOutput<Rules> output(problem, row);
    for (int slot = lane; slot < k; slot += kLanes) output.Empty(slot);
    return;
  }
  const int length = static_cast<int>(!Rules::kPlain && problem.lengths != nullptr
                                          ? ClampLength(problem.lengths[row], problem.width)
                                          : problem.width);
  const Bits* row_scores = static_cast<const Bits*>(problem.scores) + row * problem.width;
  const bool aligned = reinterpret_cast<uintptr_t>(row_scores) % 16 == 0;
  const int first_column = lane * kElems;
  uint32_t keys[kElems];
  LoadKeys<Rules, kElems>(row_scores, aligned, first_column, length, keys);

  uint2* const row_buffer = candidates_buffer[row_in_block];
  if constexpr (kByDigits) {
    SelectByDigits<Rules, kElems>(keys, first_column, digit_bins[warp], row_buffer, problem, row);
    return;
  }

  // Step 2: the threshold, over maxima of 8 keys (two rows a warp: k <= kMaxKForOneMaximum).
  uint32_t threshold;
  if constexpr (kLanes < kWarpSize) {
    threshold = CandidateThreshold<kElems / 8>(keys, k, lanes);
  } else {
    threshold = k <= kMaxKForOneMaximum ? CandidateThreshold<1>(keys, k, lanes)
                                        : CandidateThreshold<2>(keys, k, lanes);
  }

  // Step 3: compact the candidates in column order (lane order, then slice order).
  uint32_t candidate_bits = 0;  // bit e: keys[e] is a candidate (one compare an element)
#pragma unroll
  for (int e = 0; e < kElems; ++e) candidate_bits |= (keys[e] >= threshold ? 1u : 0u) << e;
  const int candidates =
      CompactInColumnOrder(candidate_bits, keys, first_column, row_buffer, lanes);

  if (candidates <= kLanes) {
    RankAndWrite<Rules, 1, 1>(row_buffer, candidates, problem, row, lanes);
  } else if (candidates <= 2 * kLanes) {
    SelectAndWrite<Rules, 2>(row_buffer, candidates, problem, row, lanes);
  } else {
    SelectAndWrite<Rules, kElems>(row_buffer, candidates, problem, row, lanes);
  }
}

template <typename Rules, int kElems>
void LaunchForSlice(const TopkProblem& problem, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned int>((problem.rows + kWarpsPerBlock - 1) / kWarpsPerBlock));
  const dim3 block(kThreadsPerBlock);
  const char* const mode = std::getenv("JAX_TOPK_SMALL_ROWS");
  const int max_k_by_rounds =
      sizeof(typename Rules::Bits) == 2 && problem.rows >= kMinRowsForDigits16
          ? kMaxKByRounds16
          : kSmallRowsMaxKByRounds;
  if (problem.k > max_k_by_rounds || (mode != nullptr && std::strcmp(mode, "digits") == 0)) {
    TopkSmallRowsKernel<Rules, kElems, true><<<grid, block, 0, stream>>>(problem);
  } else {
    TopkSmallRowsKernel<Rules, kElems, false><<<grid, block, 0, stream>>>(problem);
  }
}

// Two rows a warp, 16 lanes each: kElems keys a lane, the rounds' step 2 only.
template <typename Rules, int kElems>
void LaunchPaired(const TopkProblem& problem, cudaStream_t stream) {
  constexpr int kRowsPerBlock = 2 * kWarpsPerBlock;
  const dim3 grid(static_cast<unsigned int>((problem.rows + kRowsPerBlock - 1) / kRowsPerBlock));
  TopkSmallRowsKernel<Rules, kElems, false, kWarpSize / 2>
      <<<grid, kThreadsPerBlock, 0, stream>>>(problem);
}

template <typename Rules>
cudaError_t LaunchForRules(const TopkProblem& problem, cudaStream_t stream) {
  // LaunchPaired: plain 16-bit rows of at most 256 columns and k <= kMaxKForOneMaximum (MoE
  // routing) take two rows a warp, so that each warp-wide step serves two rows. Measured on the
  // H200 at [65536, 256] k = 8 (benches/NOTES.md "small rows: two rows a warp"): bfloat16 31.2
  // -> 29.2 us, float32 30.1 -> 31.0 (its 16-key instance takes 56 registers against 32), so
  // float32 rows keep a warp a row. JAX_TOPK_SMALL_ROWS (any value: "warp", "digits") keeps a
  // warp a row for every type.
  const bool plain = IsPlain(problem);
  if (plain && sizeof(typename Rules::Bits) == 2 && problem.width <= kWarpSize / 2 * 16 &&
      problem.k <= kMaxKForOneMaximum && std::getenv("JAX_TOPK_SMALL_ROWS") == nullptr) {
    problem.width <= kWarpSize / 2 * 8 ? LaunchPaired<PlainRows<Rules>, 8>(problem, stream)
                                       : LaunchPaired<PlainRows<Rules>, 16>(problem, stream);
    return cudaGetLastError();
  }
  // The narrowest slice that covers the row: short rows hold fewer registers. Plain rows of
  // 32 keys a lane take the general instance: the plain one took 95 registers against 80 and
  // ran 3 % slower (f32 [65536, 1024] k = 32, benches/NOTES.md "small rows: a plain instance").
  if (problem.width <= kWarpSize * 8) {
    plain ? LaunchForSlice<PlainRows<Rules>, 8>(problem, stream)
          : LaunchForSlice<Rules, 8>(problem, stream);
  } else if (problem.width <= kWarpSize * 16) {
    plain ? LaunchForSlice<PlainRows<Rules>, 16>(problem, stream)
          : LaunchForSlice<Rules, 16>(problem, stream);
  } else {
    static_assert(kMaxElemsPerLane == 32, "the widest slice covers kSmallRowsMaxWidth");
    LaunchForSlice<Rules, kMaxElemsPerLane>(problem, stream);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchTopkSmallRows(const TopkProblem& problem, cudaStream_t stream) {
  if (problem.rows == 0) return cudaSuccess;
  if (problem.rows < 0 || (problem.rows + kWarpsPerBlock - 1) / kWarpsPerBlock > INT32_MAX ||
      problem.width < 1 || problem.width > kSmallRowsMaxWidth || problem.k < 1 ||
      problem.k > kSmallRowsMaxK ||
      (problem.num_valid_rows != nullptr && problem.rows_per_group < 1)) {
    return cudaErrorInvalidValue;
  }
  switch (problem.score_type) {
    case ScoreType::kFloat32:
      return LaunchForRules<Float32Rules>(problem, stream);
    case ScoreType::kBfloat16:
      return LaunchForRules<SixteenBitRules<ScoreType::kBfloat16>>(problem, stream);
    case ScoreType::kFloat16:
      return LaunchForRules<SixteenBitRules<ScoreType::kFloat16>>(problem, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace jax_topk
