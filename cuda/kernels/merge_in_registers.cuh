// merge_topk for rows of m <= 16384 candidates: a persistent 512-thread block an SM, the row in
// registers (32 candidates a thread: 32-bit ordered key and column), read once with 16-byte
// loads while the copy engine pulls the block's next row into L2.
// 1. Radix select on the 32-bit ordered key (11-bit digits, a 2048-bin shared histogram; the
//    first pass also counts the candidates): the k-th key's decided digits and how many rank
//    above them; it stops when the boundary bin holds exactly the winners still needed.
// 2. Only when the k-th key is tied: the same select over those entries' columns (smallest
//    first), giving the column quota; equal (key, column) pairs fill the rest by an atomic.
// 3. The winners go to shared memory; one cub::BlockRadixSort orders them on a key of only the
//    bits they differ in (key span and column span), 32-bit when those fit.
// Traffic: m x (value + 4 bytes) read once a row, k x (value + 4) written.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cub/block/block_radix_sort.cuh>

#include "common/topk_common.h"
#include "kernels/topk_scan.cuh"

namespace jax_topk {
namespace merge_registers {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = 4;  // candidates a vector load: 16 bytes of columns
constexpr int kChunks = 8;
constexpr int kItems = kChunk * kChunks;  // candidates a thread
constexpr int64_t kMaxWidth = int64_t{kThreads} * kItems;
constexpr int kDigitBits = 11;
constexpr int kBins = 1 << kDigitBits;
constexpr int kBinsPerThread = kBins / kThreads;
constexpr int kSortItems = kMaxK / kThreads;
constexpr unsigned kAllLanes = 0xFFFFFFFFu;
static_assert(kSortItems * kThreads == kMaxK, "the sort holds k <= kMaxK");

struct BinFound {
  uint32_t bin, above, count;
};

struct Shared {
  using Sort32 = cub::BlockRadixSort<uint32_t, kThreads, kSortItems>;
  using Sort64 = cub::BlockRadixSort<uint64_t, kThreads, kSortItems>;
  union {
    typename Sort32::TempStorage sort32;
    typename Sort64::TempStorage sort64;
    struct {
      uint32_t keys[kMaxK];
      int32_t columns[kMaxK];
    } winners;  // in no order
  };
  uint32_t hist[kBins];  // zero between passes
  uint32_t warp_sums[kWarps];
  BinFound found;
  int32_t winner_count;
  int32_t equal_taken;
  uint32_t key_min, key_max, column_min, column_max;
};

// What a select decided: items whose projection masked by `mask` is above `prefix` win; of
// those equal to it all win when `exact`, else `needed` of them (mask is then every bit).
struct Cut {
  uint32_t prefix, mask, needed, total;
  bool exact;
};

// Adds the counted lanes to hist[digit]; a warp whose counted lanes share one digit adds once
// (rows of equal values would otherwise serialise on one address).
__device__ __forceinline__ void CountLanes(uint32_t* hist, uint32_t digit, bool counted) {
  const uint32_t voters = __ballot_sync(kAllLanes, counted);
  if (voters == 0) return;
  const int leader = __ffs(voters) - 1;
  const uint32_t leader_digit = __shfl_sync(kAllLanes, digit, leader);
  if (__all_sync(kAllLanes, !counted || digit == leader_digit)) {
    if (static_cast<int>(threadIdx.x % 32) == leader) atomicAdd(&hist[digit], __popc(voters));
  } else if (counted) {
    atomicAdd(&hist[digit], 1u);
  }
}

// The rank-th largest of the projections project(i, value) (true when item i counts), over
// kBits bits from the top, 11 at a time. Every thread calls it; it ends with a barrier.
template <int kBits, class Project>
__device__ __forceinline__ Cut SelectLargest(Shared& s, const Project& project, uint32_t rank) {
  Cut cut{0, 0, rank, 0, false};
#pragma unroll 1
  for (int high = kBits; high > 0; high -= kDigitBits) {
    const int shift = high > kDigitBits ? high - kDigitBits : 0;
    const uint32_t digit_mask = (1u << (high - shift)) - 1u;
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      uint32_t value = 0;
      const bool counted = project(i, value) && (value & cut.mask) == cut.prefix;
      CountLanes(s.hist, (value >> shift) & digit_mask, counted);
    }
    __syncthreads();
    uint32_t counts[kBinsPerThread];
    uint32_t mine = 0;
#pragma unroll
    for (int j = 0; j < kBinsPerThread; ++j) {
      const int bin = kBins - 1 - (static_cast<int>(threadIdx.x) * kBinsPerThread + j);
      counts[j] = s.hist[bin];
      s.hist[bin] = 0;
      mine += counts[j];
    }
    uint32_t total;
    uint32_t above = BlockExclusiveSum<kWarps>(s.warp_sums, mine, total);
#pragma unroll
    for (int j = 0; j < kBinsPerThread; ++j) {
      const uint32_t bin = kBins - 1 - (threadIdx.x * kBinsPerThread + j);
      if (above < cut.needed && cut.needed <= above + counts[j]) s.found = {bin, above, counts[j]};
      above += counts[j];
    }
    if (high == kBits) cut.total = total;
    if (total <= cut.needed) {  // every item matching the prefix wins (first pass only)
      cut.needed = total;
      cut.exact = true;
      break;
    }
    __syncthreads();
    const BinFound found = s.found;
    cut.prefix |= found.bin << shift;
    cut.mask |= digit_mask << shift;
    cut.needed -= found.above;
    if (found.count == cut.needed) {
      cut.exact = true;
      break;
    }
  }
  __syncthreads();
  return cut;
}

// A slot of a shared append counter for each lane that wants one: one atomic a warp.
__device__ __forceinline__ int ReserveSlot(int32_t* counter, bool want) {
  const uint32_t wanting = __ballot_sync(kAllLanes, want);
  if (wanting == 0) return 0;
  const int lane = threadIdx.x % 32;
  const int leader = __ffs(wanting) - 1;
  int base = 0;
  if (lane == leader) base = atomicAdd(counter, __popc(wanting));
  base = __shfl_sync(kAllLanes, base, leader);
  return base + __popc(wanting & ((1u << lane) - 1u));
}

// The copy engine pulls the 16-byte-aligned inside of [begin, begin + bytes) into L2.
__device__ __forceinline__ void PrefetchRange(const void* begin, size_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uintptr_t first = (reinterpret_cast<uintptr_t>(begin) + 15) & ~uintptr_t{15};
  const uintptr_t last = (reinterpret_cast<uintptr_t>(begin) + bytes) & ~uintptr_t{15};
  if (first < last)
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(first),
                 "r"(static_cast<uint32_t>(last - first))
                 : "memory");
#endif
}

// Bits needed to write x.
__device__ __forceinline__ int BitsOf(uint32_t x) {
  return 32 - __clz(x);
}

// Sorts the winners (taken of them in s.winners) on `bits` bits of a key built by encode
// (slots past `taken` get `pad`), in rank order or ascending, then writes k slots.
template <typename Key, class Sort, class Storage, class Encode, class Write>
__device__ __forceinline__ void SortAndWrite(Storage& storage, Shared& s, int taken, int bits,
                                             bool descending, Key pad, const Encode& encode,
                                             const Write& write) {
  Key keys[kSortItems];
#pragma unroll
  for (int i = 0; i < kSortItems; ++i) {
    const int slot = static_cast<int>(threadIdx.x) * kSortItems + i;
    keys[i] = slot < taken ? encode(s.winners.keys[slot], s.winners.columns[slot]) : pad;
  }
  __syncthreads();  // the winners' storage becomes the sort's
  if (descending) {
    Sort(storage).SortDescendingBlockedToStriped(keys, 0, bits);
  } else {
    Sort(storage).SortBlockedToStriped(keys, 0, bits);
  }
#pragma unroll
  for (int i = 0; i < kSortItems; ++i) write(i * kThreads + static_cast<int>(threadIdx.x), keys[i]);
}

template <typename Values>
__global__ void __launch_bounds__(kThreads, 1)
    MergeInRegistersKernel(const typename Values::Bits* values, const int32_t* indices,
                           int64_t rows, int64_t width, int32_t k, bool sorted, bool vector_loads,
                           typename Values::Bits* out_values, int32_t* out_indices) {
  using Bits = typename Values::Bits;
  __shared__ Shared s;
  for (int j = threadIdx.x; j < kBins; j += kThreads) s.hist[j] = 0;
  __syncthreads();
  const int64_t grid = gridDim.x;
  // Block-uniform row loop: each block takes rows blockIdx.x, + grid, ...
  for (int64_t row = blockIdx.x; row < rows; row += grid) {
    if (threadIdx.x == 0) {
      s.winner_count = 0;
      s.equal_taken = 0;
      s.key_min = s.column_min = 0xFFFFFFFFu;
      s.key_max = s.column_max = 0;
      if (row + grid < rows) {
        PrefetchRange(values + (row + grid) * width, width * sizeof(Bits));
        PrefetchRange(indices + (row + grid) * width, width * sizeof(int32_t));
      }
    }
    // 1. The row: key 0 marks no candidate (column < 0, NaN, past the row); every other
    //    ordered key is > 0.
    const Bits* row_values = values + row * width;
    const int32_t* row_indices = indices + row * width;
    uint32_t keys[kItems];
    int32_t columns[kItems];
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int64_t first = (int64_t{c} * kThreads + threadIdx.x) * kChunk;
      Bits bits[kChunk];
      int32_t cols[kChunk];
      if (vector_loads && first < width) {
        const int4 col4 = __ldcs(reinterpret_cast<const int4*>(row_indices + first));
        cols[0] = col4.x, cols[1] = col4.y, cols[2] = col4.z, cols[3] = col4.w;
        if constexpr (sizeof(Bits) == 4) {
          const uint4 v = __ldcs(reinterpret_cast<const uint4*>(row_values + first));
          bits[0] = v.x, bits[1] = v.y, bits[2] = v.z, bits[3] = v.w;
        } else {
          const uint2 v = __ldcs(reinterpret_cast<const uint2*>(row_values + first));
          bits[0] = static_cast<Bits>(v.x), bits[1] = static_cast<Bits>(v.x >> 16);
          bits[2] = static_cast<Bits>(v.y), bits[3] = static_cast<Bits>(v.y >> 16);
        }
      } else {
#pragma unroll
        for (int q = 0; q < kChunk; ++q) {
          const bool inside = first + q < width;
          cols[q] = inside ? row_indices[first + q] : -1;
          bits[q] = inside ? row_values[first + q] : Bits{0};
        }
      }
#pragma unroll
      for (int q = 0; q < kChunk; ++q) {
        const bool candidate = first + q < width && cols[q] >= 0 && !Values::IsNan(bits[q]);
        keys[c * kChunk + q] = candidate ? Values::Key(bits[q]) : 0u;
        columns[c * kChunk + q] = cols[q];
      }
    }

    // 2. The k-th key, then (tied) the k-th column among its entries.
    const Cut key_cut = SelectLargest<Values::kKeyBits>(
        s,
        [&](int i, uint32_t& value) {
          value = keys[i];
          return keys[i] != 0;
        },
        static_cast<uint32_t>(k));
    Cut column_cut{0, 0, key_cut.needed, 0, true};
    if (!key_cut.exact) {
      column_cut = SelectLargest<31>(
          s,
          [&](int i, uint32_t& value) {
            value = 0x7FFFFFFFu - static_cast<uint32_t>(columns[i]);
            return keys[i] == key_cut.prefix;
          },
          key_cut.needed);
    }
    const int taken =
        static_cast<int>(key_cut.total < static_cast<uint32_t>(k) ? key_cut.total : k);

    // 3. The winners to shared memory, and their key and column spans.
    uint32_t key_min = 0xFFFFFFFFu, key_max = 0, column_min = 0xFFFFFFFFu, column_max = 0;
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const uint32_t key = keys[i];
      const uint32_t decided = key & key_cut.mask;
      bool wins = key != 0 && decided > key_cut.prefix;
      if (key != 0 && decided == key_cut.prefix) {
        if (key_cut.exact) {
          wins = true;
        } else {
          const uint32_t column_value =
              (0x7FFFFFFFu - static_cast<uint32_t>(columns[i])) & column_cut.mask;
          wins = column_value > column_cut.prefix ||
                 (column_value == column_cut.prefix &&
                  (column_cut.exact ||
                   atomicAdd(&s.equal_taken, 1) < static_cast<int>(column_cut.needed)));
        }
      }
      const int slot = ReserveSlot(&s.winner_count, wins);
      if (wins) {
        s.winners.keys[slot] = key;
        s.winners.columns[slot] = columns[i];
        const uint32_t column = static_cast<uint32_t>(columns[i]);
        key_min = min(key_min, key), key_max = max(key_max, key);
        column_min = min(column_min, column), column_max = max(column_max, column);
      }
    }
    key_min = __reduce_min_sync(kAllLanes, key_min);
    key_max = __reduce_max_sync(kAllLanes, key_max);
    column_min = __reduce_min_sync(kAllLanes, column_min);
    column_max = __reduce_max_sync(kAllLanes, column_max);
    if (threadIdx.x % 32 == 0) {
      atomicMin(&s.key_min, key_min), atomicMax(&s.key_max, key_max);
      atomicMin(&s.column_min, column_min), atomicMax(&s.column_max, column_max);
    }
    __syncthreads();

    // 4. The order: (key descending, column ascending) as one number descending, or (column
    //    ascending, key descending) ascending; a flag bit above marks the winners (sorted) or
    //    the pads (unsorted), so pads sort last.
    key_min = s.key_min, key_max = s.key_max, column_min = s.column_min, column_max = s.column_max;
    const int key_bits = taken > 0 ? BitsOf(key_max - key_min) : 0;
    const int column_bits = taken > 0 ? BitsOf(column_max - column_min) : 0;
    const int bits = key_bits + column_bits + 1;
    const int low_bits = sorted ? column_bits : key_bits;
    const uint64_t low_mask = (uint64_t{1} << low_bits) - 1;
    const uint64_t high_mask = (uint64_t{1} << (bits - 1 - low_bits)) - 1;
    const uint64_t flag = uint64_t{1} << (bits - 1);
    auto encode = [&](uint32_t key, int32_t column) {
      const uint32_t col = static_cast<uint32_t>(column);
      return sorted ? flag | (uint64_t{key - key_min} << column_bits) | (column_max - col)
                    : (uint64_t{col - column_min} << key_bits) | (key_max - key);
    };
    Bits* row_out_values = out_values + row * k;
    int32_t* row_out_indices = out_indices + row * k;
    auto write = [&](int slot, uint64_t code) {
      if (slot >= k) return;
      const bool filled = slot < taken;
      const uint64_t high = (code >> low_bits) & high_mask, low = code & low_mask;
      const uint32_t key =
          sorted ? key_min + static_cast<uint32_t>(high) : key_max - static_cast<uint32_t>(low);
      const uint32_t column = sorted ? column_max - static_cast<uint32_t>(low)
                                     : column_min + static_cast<uint32_t>(high);
      row_out_indices[slot] = filled ? static_cast<int32_t>(column) : kEmptySlot;
      row_out_values[slot] = filled ? Values::FromKey(key) : Values::kEmpty;
    };
    if (bits <= 32) {
      SortAndWrite<uint32_t, Shared::Sort32>(
          s.sort32, s, taken, bits, sorted, static_cast<uint32_t>(sorted ? 0 : flag),
          [&](uint32_t key, int32_t column) { return static_cast<uint32_t>(encode(key, column)); },
          write);
    } else {
      SortAndWrite<uint64_t, Shared::Sort64>(s.sort64, s, taken, bits, sorted,
                                             sorted ? uint64_t{0} : flag, encode, write);
    }
    __syncthreads();  // the sort's storage is the next row's winners
  }
}

}  // namespace merge_registers
}  // namespace jax_topk
