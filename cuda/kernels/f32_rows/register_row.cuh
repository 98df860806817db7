// The pieces the two register kernels share (and a few only topk_f32_cluster.cu uses: the
// two-step load, DropPastLength): topk_f32_rows.cu (a block a row: float32, and 16-bit rows in its
// many-rows block) and topk_f32_cluster.cu (a thread block cluster a row of float32, bfloat16 or
// float16). Both hold a thread's contiguous columns as float32 ordered keys in
// registers (16-bit values widened exactly, kernels/widen_exact.cuh), find the k-th key by
// 11+11+10-bit radix digits, and take the winners by (greater, equal) masks against it, ties to
// the lowest columns.
//
// Contract: device code only. RowOutput and the per-thread helpers touch no shared memory;
// StoreStagedWinners is called by every thread of one block (one barrier when sorting).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include <cub/block/block_radix_sort.cuh>

#include "common/topk_common.h"
#include "common/topk_problem.h"
#include "kernels/set_bits.cuh"
#include "kernels/widen_exact.cuh"

namespace jax_topk {
namespace {

// Digits over the 32-bit key, most significant first: 11 + 11 + 10 bits.
constexpr int kDigits = 3;
constexpr int kDigitBins = 2048;
__host__ __device__ constexpr int DigitShift(int digit) {
  return digit == 0 ? 21 : (digit == 1 ? 10 : 0);
}
__host__ __device__ constexpr uint32_t DigitMask(int digit) {
  return digit < 2 ? 0x7FFu : 0x3FFu;
}

// The k-th key (rank-th largest of some keys) and how many keys equal to it are taken.
struct Pivot {
  uint32_t key;
  int quota;
};

// A thread's slice of its row: key[i] is column first_column + i (0: NaN or past the end).
template <int kElems>
struct RowKeys {
  uint32_t key[kElems];
  int first_column;
};

// The score types a row may hold: what one element is stored as, how many one 16-byte load
// brings, its exact widening to float32 bits, and the values output's element (a winner's
// widened bits narrowed back; -inf in an empty slot). This template serves the two 16-bit types.
template <ScoreType kType>
struct RegisterScores {
  static_assert(kType == ScoreType::kBfloat16 || kType == ScoreType::kFloat16, "16-bit types");
  static constexpr bool kBf16 = kType == ScoreType::kBfloat16;
  using Storage = unsigned short;
  using Value = unsigned short;
  static constexpr int kChunkElems = 8;
  static constexpr Value kEmptyValue = kBf16 ? kNegInfBf16Bits : kNegInfF16Bits;
  __device__ __forceinline__ static uint32_t Widen(Storage bits) {
    return kBf16 ? WidenBf16Bits(bits) : WidenF16Bits(bits);
  }
  __device__ __forceinline__ static Value Narrow(uint32_t widened) {
    return kBf16 ? NarrowToBf16Bits(widened) : NarrowToF16Bits(widened);
  }
};
template <>
struct RegisterScores<ScoreType::kFloat32> {
  using Storage = float;
  using Value = uint32_t;
  static constexpr int kChunkElems = 4;
  static constexpr Value kEmptyValue = kNegInfF32Bits;
  __device__ __forceinline__ static uint32_t Widen(float value) { return __float_as_uint(value); }
  __device__ __forceinline__ static Value Narrow(uint32_t widened) { return widened; }
};
using Float32Scores = RegisterScores<ScoreType::kFloat32>;

// The ordered key of float32 bits; NaN -> 0, below every real key (-inf's is 0x007FFFFF), like a
// column past the length.
__device__ __forceinline__ uint32_t KeyOfBits(uint32_t bits) {
  return IsNanF32(bits) ? 0u : OrderedKeyF32(bits);
}
template <class Scores>
__device__ __forceinline__ uint32_t KeyOf(typename Scores::Storage element) {
  return KeyOfBits(Scores::Widen(element));
}

// The keys of chunk v of a slice, one 16-byte load: 4 float32 values, or 8 16-bit ones with the
// lower column in a word's low half.
template <class Scores, class Chunk, int kElems>
__device__ __forceinline__ void ChunkKeys(const Chunk& chunk, int v, RowKeys<kElems>& row) {
  if constexpr (Scores::kChunkElems == 4) {
    row.key[4 * v] = KeyOf<Scores>(chunk.x);
    row.key[4 * v + 1] = KeyOf<Scores>(chunk.y);
    row.key[4 * v + 2] = KeyOf<Scores>(chunk.z);
    row.key[4 * v + 3] = KeyOf<Scores>(chunk.w);
  } else {
    const uint32_t words[4] = {chunk.x, chunk.y, chunk.z, chunk.w};
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      row.key[8 * v + 2 * w] = KeyOf<Scores>(static_cast<unsigned short>(words[w] & 0xFFFFu));
      row.key[8 * v + 2 * w + 1] = KeyOf<Scores>(static_cast<unsigned short>(words[w] >> 16));
    }
  }
}

// Loads columns [first_column, first_column + kElems) of a row, keys at or past `end` 0.
// first_column is a multiple of Scores::kChunkElems. Every load is issued before any key is made,
// so they are all in flight at once (a load under a branch would wait for the one before it):
// whole 16-byte loads where the row is 16-byte aligned and the slice lies before `end`, else
// scalar loads of clamped columns.
template <class Scores, int kElems>
__device__ __forceinline__ void LoadRow(const typename Scores::Storage* row_scores,
                                        int first_column, int end, RowKeys<kElems>& row) {
  constexpr int kChunk = Scores::kChunkElems;
  static_assert(kElems % kChunk == 0, "whole 16-byte chunks");
  row.first_column = first_column;
  const bool aligned = reinterpret_cast<uintptr_t>(row_scores) % 16 == 0;
  if (first_column >= end) {
#pragma unroll
    for (int i = 0; i < kElems; ++i) row.key[i] = 0;
  } else if (aligned && first_column + kElems <= end) {
    if constexpr (kChunk == 4) {
      float4 four[kElems / 4];
#pragma unroll
      for (int v = 0; v < kElems / 4; ++v) {
        four[v] = __ldg(reinterpret_cast<const float4*>(row_scores + first_column) + v);
      }
      // ChunkKeys written out: called here, one topk_f32_rows instance's PTX came out in another
      // order (not timed), so this stays the code that was measured.
#pragma unroll
      for (int v = 0; v < kElems / 4; ++v) {
        row.key[4 * v] = KeyOf<Scores>(four[v].x);
        row.key[4 * v + 1] = KeyOf<Scores>(four[v].y);
        row.key[4 * v + 2] = KeyOf<Scores>(four[v].z);
        row.key[4 * v + 3] = KeyOf<Scores>(four[v].w);
      }
    } else {
      uint4 chunks[kElems / 8];
#pragma unroll
      for (int v = 0; v < kElems / 8; ++v) {
        chunks[v] = __ldg(reinterpret_cast<const uint4*>(row_scores + first_column) + v);
      }
#pragma unroll
      for (int v = 0; v < kElems / 8; ++v) ChunkKeys<Scores>(chunks[v], v, row);
    }
  } else {
    typename Scores::Storage values[kElems];
#pragma unroll
    for (int i = 0; i < kElems; ++i) values[i] = __ldg(row_scores + min(first_column + i, end - 1));
#pragma unroll
    for (int i = 0; i < kElems; ++i) {
      row.key[i] = first_column + i < end ? KeyOf<Scores>(values[i]) : 0u;
    }
  }
}

// LoadRow in two steps, for a barrier between the loads and the keys (topk_f32_cluster below 16
// keys a thread): IssueRowLoads leaves the loads in flight here, MakeRowKeys waits for them.
// LoadRow itself stays one function: written as these two, it compiled to an extra branch
// chain that cost topk_f32_rows up to 1.9 us a call and the 16- and 24-key cluster kernels
// 0.1-0.2 us (benches/NOTES.md "topk_f32_cluster: the histograms zeroed behind the loads"), so
// the branches are written twice (the keys of a chunk shared, ChunkKeys): keep them in step
// (tests/test_f32_cluster.py checks both against the CPU). Only the taken branch's registers are
// written (whole 16-byte chunks, or single elements).
template <class Scores, int kElems>
struct LoadedSlice {
  static constexpr int kChunk = Scores::kChunkElems;
  static_assert(kElems % kChunk == 0, "whole 16-byte chunks");
  using Chunk = std::conditional_t<kChunk == 4, float4, uint4>;
  Chunk chunks[kElems / kChunk];
  typename Scores::Storage elements[kElems];
  int first_column;
  int end;
  bool aligned;  // the row is 16-byte aligned
};

// Issues the loads of columns [first_column, first_column + kElems) of a row, all before any is
// used, so they are in flight at once (a load under a branch would wait for the one before it):
// whole 16-byte loads where the row is 16-byte aligned and the slice lies before `end`, else
// scalar loads of clamped columns. first_column is a multiple of Scores::kChunkElems.
template <class Scores, int kElems>
__device__ __forceinline__ void IssueRowLoads(const typename Scores::Storage* row_scores,
                                              int first_column, int end,
                                              LoadedSlice<Scores, kElems>& slice) {
  using Chunk = typename LoadedSlice<Scores, kElems>::Chunk;
  slice.first_column = first_column;
  slice.end = end;
  slice.aligned = reinterpret_cast<uintptr_t>(row_scores) % 16 == 0;
  if (first_column >= end) {
    // no loads: MakeRowKeys makes zeros
  } else if (slice.aligned && first_column + kElems <= end) {
#pragma unroll
    for (int v = 0; v < kElems / Scores::kChunkElems; ++v) {
      slice.chunks[v] = __ldg(reinterpret_cast<const Chunk*>(row_scores + first_column) + v);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kElems; ++i) {
      slice.elements[i] = __ldg(row_scores + min(first_column + i, end - 1));
    }
  }
}

// The keys of an issued slice (this waits for its loads), keys at or past `end` 0.
template <class Scores, int kElems>
__device__ __forceinline__ void MakeRowKeys(const LoadedSlice<Scores, kElems>& slice,
                                            RowKeys<kElems>& row) {
  const int first_column = slice.first_column;
  row.first_column = first_column;
  if (first_column >= slice.end) {
#pragma unroll
    for (int i = 0; i < kElems; ++i) row.key[i] = 0;
  } else if (slice.aligned && first_column + kElems <= slice.end) {
#pragma unroll
    for (int v = 0; v < kElems / Scores::kChunkElems; ++v) {
      ChunkKeys<Scores>(slice.chunks[v], v, row);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kElems; ++i) {
      row.key[i] = first_column + i < slice.end ? KeyOf<Scores>(slice.elements[i]) : 0u;
    }
  }
}

// Keys at or past `length` become 0: topk_f32_cluster loads its slice up to the row's width and
// applies the length after, so that the loads are issued without waiting for the length's.
template <int kElems>
__device__ __forceinline__ void DropPastLength(RowKeys<kElems>& row, int length) {
#pragma unroll
  for (int i = 0; i < kElems; ++i) {
    if (row.first_column + i >= length) row.key[i] = 0;
  }
}

// A thread's keys against the pivot, bit i for key[i]: greater (> pivot) and equal (== pivot,
// a real key). A pivot of {0, 0} takes every real key.
struct WinnerMasks {
  uint32_t greater;
  uint32_t equal;
};

template <int kElems>
__device__ __forceinline__ WinnerMasks WinnerMasksOf(const RowKeys<kElems>& row,
                                                     const Pivot& pivot) {
  static_assert(kElems <= 32, "one bit per key in a 32-bit mask");
  WinnerMasks masks{0, 0};
#pragma unroll
  for (int i = 0; i < kElems; ++i) {
    masks.greater |= static_cast<uint32_t>(row.key[i] > pivot.key) << i;
    masks.equal |= static_cast<uint32_t>(row.key[i] == pivot.key && row.key[i] != 0) << i;
  }
  return masks;
}

// Greater keys < k <= 2^11 and equal keys < 2^16 a block: one word holds both counts, so one
// block scan places both.
__device__ __forceinline__ uint32_t PackedCounts(const WinnerMasks& masks) {
  return (static_cast<uint32_t>(__popc(masks.greater)) << 16) | __popc(masks.equal);
}

// A thread's winners, given the block's exclusive scan of PackedCounts (`before`) and the ties
// `quota` left to the block: its first output position (from the block's first) and its mask.
struct TakenKeys {
  int position;
  uint32_t take;
};

__device__ __forceinline__ TakenKeys TakeWinners(const WinnerMasks& masks, uint32_t before,
                                                 int quota) {
  const int equal_before = static_cast<int>(before & 0xFFFF);
  const int position = static_cast<int>(before >> 16) + min(equal_before, quota);
  int equal_to_take = max(0, min(__popc(masks.equal), quota - equal_before));
  uint32_t take = masks.greater;
  for (uint32_t rest = masks.equal; equal_to_take > 0; --equal_to_take) {
    take |= rest & (0u - rest);  // the lowest remaining equal column
    rest &= rest - 1;
  }
  return {position, take};
}

// Calls visit(i, key[i]) for each set bit i of `bits`, in ascending i (set_bits.cuh: a loop
// over the set bits where few are set).
template <int kElems, class Visit>
__device__ __forceinline__ void ForEachSetKey(const RowKeys<kElems>& row, uint32_t bits,
                                              const Visit& visit) {
  ForEachSetBit<kElems>(bits, [&](int i) { visit(i, SlotAt(row.key, i)); });
}

// Calls visit(position, column, key) for each taken key, in column order from `position`.
template <int kElems, class Visit>
__device__ __forceinline__ void ForEachTaken(const RowKeys<kElems>& row, TakenKeys taken,
                                             const Visit& visit) {
  if constexpr (kElems >= kBitLoopMinSlots) {
    ForEachSetKey(row, taken.take,
                  [&](int i, uint32_t key) { visit(taken.position++, row.first_column + i, key); });
  } else {  // under kBitLoopMinSlots: the loop as it was, for the SASS it had (set_bits.cuh)
#pragma unroll
    for (int i = 0; i < kElems; ++i) {
      if (taken.take & (1u << i)) visit(taken.position++, row.first_column + i, row.key[i]);
    }
  }
}

// Where row `row`'s k slots go: indices page-transformed, values (when asked) in the scores'
// type.
template <class Scores>
struct RowOutput {
  int32_t* indices;
  typename Scores::Value* values;
  const int32_t* table_row;
  int32_t log2_page_size;

  __device__ __forceinline__ RowOutput(const TopkProblem& problem, int64_t row)
      : indices(problem.out + row * problem.k),
        values(problem.values != nullptr
                   ? static_cast<typename Scores::Value*>(problem.values) + row * problem.k
                   : nullptr),
        table_row(PageTableRow(problem, row)),
        log2_page_size(problem.log2_page_size) {}

  __device__ __forceinline__ void Store(int slot, int32_t column, uint32_t key) const {
    indices[slot] = PageTransform(column, table_row, log2_page_size);
    if (values != nullptr) values[slot] = Scores::Narrow(BitsFromOrderedKeyF32(key));
  }
  __device__ __forceinline__ void StoreEmpty(int slot) const {
    indices[slot] = kEmptySlot;
    if (values != nullptr) values[slot] = Scores::kEmptyValue;
  }
};

// Winners staged in shared memory in ascending column order, for a block to store.
struct StagedWinners {
  int32_t columns[kMaxK];
  uint32_t keys[kMaxK];
};

// Sorted output of more than kMaxRankedByCount winners: a stable block radix sort, kMaxK keys.
template <int kThreads>
using WinnerSort = cub::BlockRadixSort<uint32_t, kThreads, kMaxK / kThreads, int32_t>;

// At most this many winners are ranked by counting: each winner counts the staged ones ranked
// before it (one thread a winner, broadcast reads of the staged keys, no sort).
constexpr int kMaxRankedByCount = 256;

// The `selected` staged winners into the row's k slots, padded with kEmptySlot (-inf values);
// sorted: value descending, then column ascending. Every thread of the block calls it.
template <int kThreads, bool kSorted, class Output>
__device__ __forceinline__ void StoreStagedWinners(const StagedWinners& staged,
                                                   typename WinnerSort<kThreads>::TempStorage& sort,
                                                   const Output& output, int k, int selected) {
  if (!kSorted || selected <= kMaxRankedByCount) {
    for (int slot = threadIdx.x; slot < k; slot += kThreads) {
      if (slot >= selected) {
        output.StoreEmpty(slot);
      } else if (!kSorted) {
        output.Store(slot, staged.columns[slot], staged.keys[slot]);
      } else {
        // Staged order is column order: ties rank the lower column first.
        const uint32_t key = staged.keys[slot];
        int rank = 0;
        for (int j = 0; j < selected; ++j) {
          const uint32_t other = staged.keys[j];
          rank += other > key || (other == key && j < slot);
        }
        output.Store(rank, staged.columns[slot], key);
      }
    }
    return;
  }
  if constexpr (kSorted) {
    // Blocked order = staged (ascending column) order and the sort is stable, so ties keep
    // ascending columns; padding keys (0) sort after every real key.
    constexpr int kItems = kMaxK / kThreads;
    uint32_t keys[kItems];
    int32_t columns[kItems];
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int slot = threadIdx.x * kItems + i;
      keys[i] = slot < selected ? staged.keys[slot] : 0u;
      columns[i] = slot < selected ? staged.columns[slot] : kEmptySlot;
    }
    __syncthreads();  // the sort's storage may share the staged winners' space
    WinnerSort<kThreads>(sort).SortDescendingBlockedToStriped(keys, columns);
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int slot = i * kThreads + threadIdx.x;
      if (slot >= k) continue;
      if (slot < selected) {
        output.Store(slot, columns[i], keys[i]);
      } else {
        output.StoreEmpty(slot);
      }
    }
  }
}

}  // namespace
}  // namespace jax_topk
