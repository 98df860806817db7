// merge_topk for rows of m <= 16384 candidates: a persistent 512-thread block an SM, the row in
// registers (32 candidates a thread: 32-bit ordered key and column), read once with 16-byte
// loads while the copy engine pulls the block's next row into L2.
// 1. Radix select on the ordered key, 11-bit digits in a shared histogram: the first pass over
//    the registers (it also counts the candidates); the boundary bin's entries, when they fit,
//    go to a shared list and the later passes run over it. A tied k-th key adds the same select
//    over its entries' columns (smallest first); equal (key, column) pairs fill the rest.
// 2. The winners go to shared memory by a block scan; each is ranked within its bucket of the
//    top 11 bits of a code holding only the bits the winners differ in, and written at its rank
//    (a cub::BlockRadixSort on the code when a bucket is crowded).
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
constexpr int kListItems = kMaxK / kThreads;  // list entries, winners and sort items a thread
constexpr int kMaxBucket = 64;  // a crowded bucket: the ranks by comparison would cost more
constexpr unsigned kAllLanes = 0xFFFFFFFFu;
static_assert(kListItems * kThreads == kMaxK, "the list and the sort hold k <= kMaxK");

struct BinFound {
  uint32_t bin, above, count;
};

struct Shared {
  using Sort32 = cub::BlockRadixSort<uint32_t, kThreads, kListItems>;
  using Sort64 = cub::BlockRadixSort<uint64_t, kThreads, kListItems>;
  union {
    typename Sort32::TempStorage sort32;
    typename Sort64::TempStorage sort64;
    struct {
      uint32_t keys[kMaxK];
      int32_t columns[kMaxK];
    } list;  // the boundary bin's entries during the select, then the winners (in no order)
  };
  uint16_t order[kMaxK];  // winners' slots by bucket
  uint32_t hist[kBins];   // zero between uses
  uint32_t warp_sums[kWarps];
  BinFound found;
  int32_t equal_taken;
  uint32_t key_min, key_max, column_min, column_max, bucket_max;
};

// What a select decided: items whose projection masked by `mask` is above `prefix` win; of
// those equal to it all win when `exact`, else `needed` of them (mask is then every bit).
// `matching`: how many items match the prefix; `total`: how many counted in the first pass.
struct Cut {
  uint32_t prefix, mask, needed, matching, total;
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

// One digit, bits [shift, high) with shift = max(high - 11, 0), of the projections
// project(i, value) of items i < kCount (true when item i counts) that match cut's prefix:
// the histogram, then the bin holding the cut.needed-th largest. Every thread calls it with
// block-uniform arguments; it ends with a barrier.
template <int kCount, class Project>
__device__ __forceinline__ void SelectDigit(Shared& s, const Project& project, Cut& cut, int high) {
  const int shift = high > kDigitBits ? high - kDigitBits : 0;
  const uint32_t digit_mask = (1u << (high - shift)) - 1u;
#pragma unroll
  for (int i = 0; i < kCount; ++i) {
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
  if (cut.mask == 0) cut.total = total;
  if (total <= cut.needed) {  // every item matching the prefix wins (first digit only)
    cut.needed = cut.matching = total;
    cut.exact = true;
  }
  __syncthreads();
  if (cut.exact) return;
  const BinFound found = s.found;
  cut.prefix |= found.bin << shift;
  cut.mask |= digit_mask << shift;
  cut.needed -= found.above;
  cut.matching = found.count;
  cut.exact = found.count == cut.needed;
}

// The digits below `high` (every thread calls it).
template <int kCount, class Project>
__device__ __forceinline__ void SelectRest(Shared& s, const Project& project, Cut& cut, int high) {
#pragma unroll 1
  for (; high > 0 && !cut.exact; high -= kDigitBits) SelectDigit<kCount>(s, project, cut, high);
}

// Exclusive positions for each thread's `count` items, in thread order; the total.
__device__ __forceinline__ uint32_t Positions(Shared& s, uint32_t count, uint32_t& total) {
  return BlockExclusiveSum<kWarps>(s.warp_sums, count, total);
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

// The winners' order as one ascending number of key_bits + column_bits bits: (key descending,
// column ascending) when sorted, else (column ascending, key descending).
struct OrderCode {
  bool sorted;
  int key_bits, column_bits;
  uint32_t key_max, column_min;
  __device__ __forceinline__ uint64_t operator()(uint32_t key, int32_t column) const {
    const uint64_t key_part = key_max - key;
    const uint64_t column_part = static_cast<uint32_t>(column) - column_min;
    return sorted ? (key_part << column_bits | column_part) : (column_part << key_bits | key_part);
  }
};

// The crowded case: the `taken` winners (s.list) sorted with cub on their codes, a flag bit
// above marking the pads (ascending: pads last); put(rank, key, column) for each, the key and
// column read back from the code.
template <typename Code, class Sort, class Storage, class Put>
__device__ __forceinline__ void SortAndPut(Storage& storage, Shared& s, int taken,
                                           const OrderCode& code, const Put& put) {
  const int bits = code.key_bits + code.column_bits;
  Code items[kListItems];
#pragma unroll
  for (int i = 0; i < kListItems; ++i) {
    const int slot = static_cast<int>(threadIdx.x) * kListItems + i;
    items[i] = slot < taken ? static_cast<Code>(code(s.list.keys[slot], s.list.columns[slot]))
                            : static_cast<Code>(Code{1} << bits);
  }
  __syncthreads();  // the winners' storage becomes the sort's
  Sort(storage).SortBlockedToStriped(items, 0, bits + 1);
  const int low_bits = code.sorted ? code.column_bits : code.key_bits;
  const uint64_t low_mask = (uint64_t{1} << low_bits) - 1;
  const uint64_t high_mask = (uint64_t{1} << (bits - low_bits)) - 1;
#pragma unroll
  for (int i = 0; i < kListItems; ++i) {
    const int rank = i * kThreads + static_cast<int>(threadIdx.x);
    if (rank >= taken) continue;
    const uint64_t item = items[i];
    const uint32_t high = static_cast<uint32_t>((item >> low_bits) & high_mask);
    const uint32_t low = static_cast<uint32_t>(item & low_mask);
    const uint32_t key = code.key_max - (code.sorted ? high : low);
    const uint32_t column = code.column_min + (code.sorted ? low : high);
    put(rank, key, static_cast<int32_t>(column));
  }
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
      s.equal_taken = 0;
      s.key_min = s.column_min = 0xFFFFFFFFu;
      s.key_max = s.column_max = s.bucket_max = 0;
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

    // 2. The k-th key: its first digit over the registers, the rest over a shared list of the
    //    boundary bin's entries when they fit (else over the registers again).
    const auto key_of_register = [&](int i, uint32_t& value) {
      value = keys[i];
      return keys[i] != 0;
    };
    const auto key_of_list = [&](int i, uint32_t& value) {
      value = s.list.keys[i * kThreads + threadIdx.x];
      return value != 0;
    };
    Cut key_cut{0, 0, static_cast<uint32_t>(k), 0, 0, false};
    SelectDigit<kItems>(s, key_of_register, key_cut, Values::kKeyBits);
    const bool listed = !key_cut.exact && key_cut.matching <= kMaxK;
    if (listed) {
      uint32_t in_bin = 0;
      const auto in_boundary_bin = [&](int i) {  // key 0 may share bin 0 (-inf is there)
        return keys[i] != 0 && (keys[i] & key_cut.mask) == key_cut.prefix;
      };
#pragma unroll
      for (int i = 0; i < kItems; ++i) in_bin += in_boundary_bin(i);
      uint32_t total;
      uint32_t at = Positions(s, in_bin, total);
#pragma unroll
      for (int i = 0; i < kItems; ++i) {
        if (in_boundary_bin(i)) {
          s.list.keys[at] = keys[i];
          s.list.columns[at] = columns[i];
          ++at;
        }
      }
      for (int slot = total + threadIdx.x; slot < kMaxK; slot += kThreads) s.list.keys[slot] = 0;
      __syncthreads();
      SelectRest<kListItems>(s, key_of_list, key_cut, Values::kKeyBits - kDigitBits);
    } else {
      SelectRest<kItems>(s, key_of_register, key_cut, Values::kKeyBits - kDigitBits);
    }
    //    Then, for a tied k-th key, the k-th smallest column among its entries.
    Cut column_cut{0, 0, key_cut.needed, 0, 0, true};
    if (!key_cut.exact) {
      column_cut.exact = false;
      if (listed) {
        SelectRest<kListItems>(
            s,
            [&](int i, uint32_t& value) {
              const int slot = i * kThreads + threadIdx.x;
              value = 0x7FFFFFFFu - static_cast<uint32_t>(s.list.columns[slot]);
              return s.list.keys[slot] == key_cut.prefix;
            },
            column_cut, 31);
      } else {
        SelectRest<kItems>(
            s,
            [&](int i, uint32_t& value) {
              value = 0x7FFFFFFFu - static_cast<uint32_t>(columns[i]);
              return keys[i] == key_cut.prefix;
            },
            column_cut, 31);
      }
    }
    const int taken =
        static_cast<int>(key_cut.total < static_cast<uint32_t>(k) ? key_cut.total : k);

    // 3. The winners to shared memory (positions by a block scan), and their spans.
    uint32_t wins = 0;  // bit i: item i wins
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const uint32_t key = keys[i];
      const uint32_t decided = key & key_cut.mask;
      bool win = key != 0 && decided > key_cut.prefix;
      if (key != 0 && decided == key_cut.prefix) {
        if (key_cut.exact) {
          win = true;
        } else {
          const uint32_t column_value =
              (0x7FFFFFFFu - static_cast<uint32_t>(columns[i])) & column_cut.mask;
          win = column_value > column_cut.prefix ||
                (column_value == column_cut.prefix &&
                 (column_cut.exact ||
                  atomicAdd(&s.equal_taken, 1) < static_cast<int>(column_cut.needed)));
        }
      }
      wins |= static_cast<uint32_t>(win) << i;
    }
    uint32_t winner_total;
    uint32_t at = Positions(s, __popc(wins), winner_total);
    uint32_t key_min = 0xFFFFFFFFu, key_max = 0, column_min = 0xFFFFFFFFu, column_max = 0;
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      if (wins >> i & 1u) {
        s.list.keys[at] = keys[i];
        s.list.columns[at] = columns[i];
        ++at;
        const uint32_t column = static_cast<uint32_t>(columns[i]);
        key_min = min(key_min, keys[i]), key_max = max(key_max, keys[i]);
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

    // 4. Each winner's rank in the output order, and the writes.
    OrderCode code{sorted, 0, 0, s.key_max, s.column_min};
    if (taken > 0) {
      code.key_bits = BitsOf(s.key_max - s.key_min);
      code.column_bits = BitsOf(s.column_max - s.column_min);
    }
    const int code_bits = code.key_bits + code.column_bits;
    Bits* row_out_values = out_values + row * k;
    int32_t* row_out_indices = out_indices + row * k;
    const auto put = [&](int rank, uint32_t key, int32_t column) {
      row_out_indices[rank] = column;
      row_out_values[rank] = Values::FromKey(key);
    };
    for (int slot = taken + threadIdx.x; slot < k; slot += kThreads) {
      row_out_indices[slot] = kEmptySlot;
      row_out_values[slot] = Values::kEmpty;
    }
    //    Buckets: the top 11 bits of the code; their counts and starts (ascending).
    const int bucket_shift = code_bits > kDigitBits ? code_bits - kDigitBits : 0;
    uint64_t my_codes[kListItems];
    uint32_t my_buckets[kListItems];
#pragma unroll
    for (int i = 0; i < kListItems; ++i) {
      const int slot = i * kThreads + static_cast<int>(threadIdx.x);
      my_codes[i] = slot < taken ? code(s.list.keys[slot], s.list.columns[slot]) : 0;
      my_buckets[i] = static_cast<uint32_t>(my_codes[i] >> bucket_shift);
      if (slot < taken) atomicAdd(&s.hist[my_buckets[i]], 1u);
    }
    __syncthreads();
    uint32_t counts[kBinsPerThread];
    uint32_t mine = 0, largest = 0;
#pragma unroll
    for (int j = 0; j < kBinsPerThread; ++j) {
      counts[j] = s.hist[threadIdx.x * kBinsPerThread + j];
      mine += counts[j];
      largest = max(largest, counts[j]);
    }
    uint32_t bucket_total;
    uint32_t start = Positions(s, mine, bucket_total);
#pragma unroll
    for (int j = 0; j < kBinsPerThread; ++j) {
      s.hist[threadIdx.x * kBinsPerThread + j] = start;
      start += counts[j];
    }
    largest = __reduce_max_sync(kAllLanes, largest);
    if (threadIdx.x % 32 == 0) atomicMax(&s.bucket_max, largest);
    __syncthreads();
    if (s.bucket_max <= kMaxBucket) {
      //  Slots by bucket, then each winner's rank: its bucket's start plus the winners of its
      //  bucket with a smaller code (or an equal one at a lower slot).
#pragma unroll
      for (int i = 0; i < kListItems; ++i) {
        const int slot = i * kThreads + static_cast<int>(threadIdx.x);
        if (slot < taken) s.order[atomicAdd(&s.hist[my_buckets[i]], 1u)] = slot;
      }
      __syncthreads();  // s.hist[b] now ends bucket b
#pragma unroll
      for (int i = 0; i < kListItems; ++i) {
        const int slot = i * kThreads + static_cast<int>(threadIdx.x);
        if (slot >= taken) continue;
        const uint32_t b = my_buckets[i];
        const uint32_t first = b > 0 ? s.hist[b - 1] : 0, end = s.hist[b];
        uint32_t rank = first;
        for (uint32_t j = first; j < end; ++j) {
          const int other = s.order[j];
          const uint64_t other_code = code(s.list.keys[other], s.list.columns[other]);
          rank += other_code < my_codes[i] || (other_code == my_codes[i] && other < slot);
        }
        put(static_cast<int>(rank), s.list.keys[slot], s.list.columns[slot]);
      }
      __syncthreads();
#pragma unroll
      for (int j = 0; j < kBinsPerThread; ++j) s.hist[threadIdx.x * kBinsPerThread + j] = 0;
    } else {
#pragma unroll
      for (int j = 0; j < kBinsPerThread; ++j) s.hist[threadIdx.x * kBinsPerThread + j] = 0;
      if (code_bits + 1 <= 32) {
        SortAndPut<uint32_t, Shared::Sort32>(s.sort32, s, taken, code, put);
      } else {
        SortAndPut<uint64_t, Shared::Sort64>(s.sort64, s, taken, code, put);
      }
    }
    __syncthreads();  // the list's storage is the next row's
  }
}

}  // namespace merge_registers
}  // namespace jax_topk
