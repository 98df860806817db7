// topk_bf16: exact row-wise top-k of bf16 scores, one 512-thread block per row (SPEC section 1).
// Each thread loads a contiguous slice of scores (8-32, sized by the row's length) once and keeps
// them in registers as 16-bit ordered keys; NaN and columns >= length become key 0. Two 256-bin
// shared histograms (high byte, then low byte under the pivot's high byte) find the k-th largest
// key exactly; one block scan of packed (greater, equal) counts gives each thread its output
// position and its share of the equal quota (lowest columns first), so the selection is staged in
// ascending column order; sorted=true adds a stable block radix sort on the staged keys.
// Traffic: each score read once (16-byte loads on aligned rows, nothing at or past the row's
// length), one coalesced page-transformed store of k int32 per row; no workspace, no host sync.
// Limits: width <= kMaxBf16Width = 512 * 32, k <= kMaxK (staged in shared memory), rows < 2^31.
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_scan.cuh>

#include "topk_common.h"
#include "topk_cuda.h"

namespace jax_topk {
namespace {

constexpr int kThreadsPerRow = 512;
// Blocks per SM the register budget is set for: 3 (40 registers per thread), but 2 (64) for
// sorting more than one item per thread, where CUB's radix sort would spill at 40.
template <int kSortItemsPerThread>
constexpr int MinBlocksPerSm() {
  return kSortItemsPerThread > 1 ? 2 : 3;
}
constexpr int kMaxElemsPerThread = 32;
static_assert(kThreadsPerRow * kMaxElemsPerThread >= kMaxBf16Width, "a row must fit one block");

constexpr int kRadixBits = 8;          // two passes over the 16-bit key: high byte, low byte
constexpr int kRadixBins = 1 << kRadixBits;
constexpr int kKeyBits = 2 * kRadixBits;
static_assert(kRadixBins <= kThreadsPerRow, "one thread per bin when scanning a histogram");

// Masked positions (NaN, columns >= length, slice padding) get key 0. Every candidate key is at
// least OrderedKeyBf16(-inf) = 0x007F: keys 0x0000..0x007E belong to negative NaNs only. So key 0
// is never selected (nor left in a histogram count), and sorts after every real key when it pads
// the radix sort.
constexpr uint32_t kMaskedKey = 0;
// Loaded in place of columns at or past the length: a NaN, so the NaN rule masks it.
constexpr uint16_t kMaskedBits = 0xFFFF;

using BlockScan = cub::BlockScan<int, kThreadsPerRow, cub::BLOCK_SCAN_WARP_SCANS>;

struct NoSort {
  struct TempStorage {};
};
// kSortItemsPerThread == 0: the unsorted kernel, which needs no sort storage.
template <int kSortItemsPerThread>
using BlockSort = std::conditional_t<
    kSortItemsPerThread == 0, NoSort,
    cub::BlockRadixSort<uint32_t, kThreadsPerRow,
                        (kSortItemsPerThread > 0 ? kSortItemsPerThread : 1), int32_t>>;

template <int kSortItemsPerThread>
struct RowShared {
  static constexpr bool kSorted = kSortItemsPerThread > 0;
  // The histograms are dead once the pivot is known, the staged selection once it is read into
  // the sort's registers: each phase reuses the previous one's space (separated by barriers).
  union {
    struct {
      int high[kRadixBins];
      int low[kRadixBins];
    } histograms;
    struct {
      int32_t columns[kMaxK];
      uint16_t keys[kSorted ? kMaxK : 1];
    } staged;
    typename BlockSort<kSortItemsPerThread>::TempStorage sort;
  };
  // Outside the union: the scan's storage is still read by slow threads when fast ones stage.
  typename BlockScan::TempStorage scan;
  int high_bin;          // the pivot's high byte
  int above_high_bin;    // candidates whose high byte is above it
  int low_bin;           // the pivot's low byte
  int above_low_bin;     // candidates in the high bin whose low byte is above it
};

// A slice lives as packed key pairs: element 2p in the low half of key_pairs[p], element 2p + 1
// in the high half (column order, as in memory). Each phase tests the pairs in its own packed
// form rather than unpacking them: unpacked halves shared between phases would be kept alive
// across barriers by the optimiser, doubling the slice's registers and spilling.

// Two raw bf16 -> two ordered keys, NaN -> kMaskedKey, in one word: per half exactly
// IsNanBf16(b) ? kMaskedKey : OrderedKeyBf16(b) from topk_common.h (checked for all 2^32 words;
// no carry crosses the halves). Computed packed so the optimiser cannot split the halves apart.
// Adds the number of masked halves to *masked.
static_assert(kMaskedKey == 0, "masking clears the key's bits");
__device__ __forceinline__ uint32_t KeyPairFromBits(uint32_t bits_pair, int* masked) {
  // Negative: flip all 16 bits (~bits); non-negative: flip the sign bit only (bits | 0x8000).
  const uint32_t flip = ((bits_pair & 0x80008000u) >> 15) * 0x7FFFu | 0x80008000u;
  // Bit 15 of a half is set iff its magnitude is above +inf's 0x7F80, i.e. it is a NaN.
  const uint32_t nan_flags = ((bits_pair & 0x7FFF7FFFu) + 0x007F007Fu) & 0x80008000u;
  *masked += __popc(nan_flags);
  return (bits_pair ^ flip) & ~((nan_flags >> 15) * 0xFFFFu);
}

template <int kElemsPerLoad>
__device__ __forceinline__ void LoadWords(const uint16_t* scores, uint32_t* words) {
  if constexpr (kElemsPerLoad == 8) {
    const uint4 vector = __ldg(reinterpret_cast<const uint4*>(scores));
    words[0] = vector.x;
    words[1] = vector.y;
    words[2] = vector.z;
    words[3] = vector.w;
  } else if constexpr (kElemsPerLoad == 4) {
    const uint2 vector = __ldg(reinterpret_cast<const uint2*>(scores));
    words[0] = vector.x;
    words[1] = vector.y;
  } else {
    static_assert(kElemsPerLoad == 2, "loads of 2, 4 or 8 bf16");
    words[0] = __ldg(reinterpret_cast<const unsigned int*>(scores));
  }
}

// Raw bits of columns [first_column, first_column + kElemsPerThread), kMaskedBits at or past
// length. Whole vectors where they lie inside the length; scalar loads for the vector that
// straddles it (and everywhere when the row is only 2-byte aligned: kElemsPerLoad == 1).
template <int kElemsPerThread, int kElemsPerLoad>
__device__ __forceinline__ void LoadSliceBits(const uint16_t* row_scores, int first_column,
                                              int length,
                                              uint32_t (&pairs)[kElemsPerThread / 2]) {
  constexpr int kElemsPerStep = kElemsPerLoad > 2 ? kElemsPerLoad : 2;
#pragma unroll
  for (int step = 0; step < kElemsPerThread / kElemsPerStep; ++step) {
    const int column = first_column + step * kElemsPerStep;
    uint32_t* words = pairs + step * (kElemsPerStep / 2);
    if (column >= length) {  // past this thread's slice (or the row): no load at all
#pragma unroll
      for (int pair = 0; pair < kElemsPerStep / 2; ++pair) {
        words[pair] = kMaskedBits | (uint32_t{kMaskedBits} << 16);
      }
    } else if (kElemsPerLoad > 1 && column + kElemsPerStep <= length) {
      LoadWords<kElemsPerStep>(row_scores + column, words);
    } else {
#pragma unroll
      for (int pair = 0; pair < kElemsPerStep / 2; ++pair) {
        const int low = column + 2 * pair;
        const uint32_t low_bits = low < length ? __ldg(row_scores + low) : kMaskedBits;
        const uint32_t high_bits = low + 1 < length ? __ldg(row_scores + low + 1) : kMaskedBits;
        words[pair] = low_bits | (high_bits << 16);
      }
    }
  }
}

// Loads a thread's slice as ordered keys and returns how many of them are masked. Every slice
// starts a multiple of 16 bytes after the row start, so the row's own alignment picks the widest
// load that all threads can use.
template <int kElemsPerThread>
__device__ __forceinline__ int LoadSliceKeys(const uint16_t* row_scores, int first_column,
                                             int length,
                                             uint32_t (&key_pairs)[kElemsPerThread / 2]) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(row_scores);
  if (address % 16 == 0) {
    LoadSliceBits<kElemsPerThread, 8>(row_scores, first_column, length, key_pairs);
  } else if (address % 8 == 0) {
    LoadSliceBits<kElemsPerThread, 4>(row_scores, first_column, length, key_pairs);
  } else if (address % 4 == 0) {
    LoadSliceBits<kElemsPerThread, 2>(row_scores, first_column, length, key_pairs);
  } else {
    LoadSliceBits<kElemsPerThread, 1>(row_scores, first_column, length, key_pairs);
  }
  int masked = 0;
#pragma unroll
  for (int pair = 0; pair < kElemsPerThread / 2; ++pair) {
    key_pairs[pair] = KeyPairFromBits(key_pairs[pair], &masked);
  }
  return masked;
}

// Columns per thread for a row of `length`: the fewest (a multiple of 8, so every slice stays
// 16-byte aligned) that cover the row with all threads, at most the register slice. A short row
// in a wide array is spread over every thread, so no thread histograms more keys than it must.
template <int kElemsPerThread>
__device__ __forceinline__ int SliceElems(int length) {
  static_assert(kElemsPerThread % 8 == 0, "slices are whole 16-byte vectors");
  const int needed = ((length + kThreadsPerRow - 1) / kThreadsPerRow + 7) & ~7;
  return needed < 8 ? 8 : (needed > kElemsPerThread ? kElemsPerThread : needed);
}

// The lowest `count` set bits of mask (count <= popcount(mask)).
__device__ __forceinline__ uint32_t LowestSetBits(uint32_t mask, int count) {
  if (count >= __popc(mask)) return mask;
  uint32_t taken = 0;
  for (; count > 0; --count) {
    const uint32_t lowest = mask & (0u - mask);
    taken |= lowest;
    mask ^= lowest;
  }
  return taken;
}

// Walks the bins from the top (a suffix scan) to the one holding the rank-th largest key,
// rank >= 1; if rank <= total, exactly one thread records that bin and the count above it.
// Returns the histogram's total to every thread.
__device__ __forceinline__ int FindBinOfRank(const int* histogram, int rank,
                                             BlockScan::TempStorage& scan_storage,
                                             int* chosen_bin, int* count_above) {
  const int bin = kRadixBins - 1 - static_cast<int>(threadIdx.x);
  const int count = bin >= 0 ? histogram[bin] : 0;
  int at_or_above;
  int total;
  BlockScan(scan_storage).InclusiveSum(count, at_or_above, total);
  const int above = at_or_above - count;
  if (bin >= 0 && above < rank && at_or_above >= rank) {
    *chosen_bin = bin;
    *count_above = above;
  }
  return total;
}

template <int kElemsPerThread, int kSortItemsPerThread>
__global__ void __launch_bounds__(kThreadsPerRow, MinBlocksPerSm<kSortItemsPerThread>())
    TopkBf16Kernel(const TopkProblem problem) {
  constexpr bool kSorted = kSortItemsPerThread > 0;
  constexpr int kPairsPerThread = kElemsPerThread / 2;
  __shared__ RowShared<kSortItemsPerThread> shared;

  const int64_t row = blockIdx.x;
  const int thread = threadIdx.x;
  const int k = problem.k;
  int32_t* row_out = problem.out + row * k;

  if (!RowIsValid(row, problem.num_valid_rows, problem.rows_per_group)) {
    for (int slot = thread; slot < k; slot += kThreadsPerRow) row_out[slot] = kEmptySlot;
    return;
  }
  const int length = static_cast<int>(
      problem.lengths != nullptr ? ClampLength(problem.lengths[row], problem.width)
                                 : problem.width);

  if (thread < kRadixBins) {
    shared.histograms.high[thread] = 0;
    shared.histograms.low[thread] = 0;
  }
  const uint16_t* row_scores = static_cast<const uint16_t*>(problem.scores) + row * problem.width;
  // Thread t owns columns [t * slice_elems, (t + 1) * slice_elems): thread order is still
  // column order. Register slots past slice_elems hold masked keys and are never histogrammed
  // (active_pairs is the same for the whole block, so skipping them does not diverge).
  const int slice_elems = SliceElems<kElemsPerThread>(length);
  const int active_pairs = slice_elems / 2;
  const int first_column = thread * slice_elems;
  const int slice_end = min(length, first_column + slice_elems);
  uint32_t key_pairs[kPairsPerThread];
  const int masked_loaded =
      LoadSliceKeys<kElemsPerThread>(row_scores, first_column, slice_end, key_pairs);
  // Every slot past slice_elems is masked; only the masked keys inside the slice are counted.
  const int masked = masked_loaded - (kElemsPerThread - slice_elems);
  __syncthreads();

  // Pass 1: high byte. In key order +x and -x of one exponent land in bins b and 255 - b, whose
  // banks (b % 32 and 31 - b % 32) always differ, so the halves need no offset against conflicts.
  // Masked keys are counted into bin 0 too (no branch per element), then taken back out.
  constexpr uint32_t kByteMask = kRadixBins - 1;
  constexpr int kMaskedBin = kMaskedKey >> kRadixBits;
  if (first_column < length) {
#pragma unroll
    for (int pair = 0; pair < kPairsPerThread; ++pair) {
      if (pair >= active_pairs) break;
      atomicAdd(&shared.histograms.high[(key_pairs[pair] >> kRadixBits) & kByteMask], 1);
      atomicAdd(&shared.histograms.high[key_pairs[pair] >> (kKeyBits + kRadixBits)], 1);
    }
    if (masked > 0) atomicSub(&shared.histograms.high[kMaskedBin], masked);
  }
  __syncthreads();
  const int candidates = FindBinOfRank(shared.histograms.high, k, shared.scan, &shared.high_bin,
                                       &shared.above_high_bin);
  __syncthreads();

  // Take every key > pivot and the first `quota` keys == pivot. With no more candidates than k,
  // pivot = kMaskedKey and quota = 0 take exactly the candidates.
  uint32_t pivot = kMaskedKey;
  int quota = 0;
  if (candidates > k) {
    // Pass 2: low byte of the keys under the pivot's high byte (masked keys again counted, in
    // low bin 0, and taken back out when they share that high byte).
    const uint32_t high_bin = shared.high_bin;
    const int rank_in_bin = k - shared.above_high_bin;
    const uint32_t high_bin_of_low_half = high_bin << kRadixBits;
    const uint32_t high_bin_of_high_half = high_bin << (kKeyBits + kRadixBits);
    if (first_column < length) {
#pragma unroll
      for (int pair = 0; pair < kPairsPerThread; ++pair) {
        if (pair >= active_pairs) break;
        const uint32_t key_pair = key_pairs[pair];
        if (((key_pair ^ high_bin_of_low_half) & (kByteMask << kRadixBits)) == 0) {
          atomicAdd(&shared.histograms.low[key_pair & kByteMask], 1);
        }
        if ((key_pair ^ high_bin_of_high_half) < (1u << (kKeyBits + kRadixBits))) {
          atomicAdd(&shared.histograms.low[(key_pair >> kKeyBits) & kByteMask], 1);
        }
      }
      if (masked > 0 && high_bin == kMaskedBin) {
        atomicSub(&shared.histograms.low[kMaskedKey & kByteMask], masked);
      }
    }
    __syncthreads();
    FindBinOfRank(shared.histograms.low, rank_in_bin, shared.scan, &shared.low_bin,
                  &shared.above_low_bin);
    __syncthreads();
    pivot = (high_bin << kRadixBits) | static_cast<uint32_t>(shared.low_bin);
    quota = rank_in_bin - shared.above_low_bin;
  }
  const int selected = candidates < k ? candidates : k;

  // One bit per element (bit i = column first_column + i): key > pivot, key == pivot. Low halves
  // are compared shifted to the top (zeros below), high halves against the pivot's whole range.
  static_assert(kElemsPerThread <= 32, "one bit per element in a 32-bit mask");
  const uint32_t pivot_at_top = pivot << kKeyBits;
  uint32_t greater_bits = 0;
  uint32_t equal_bits = 0;
#pragma unroll
  for (int pair = 0; pair < kPairsPerThread; ++pair) {
    const uint32_t key_pair = key_pairs[pair];
    const uint32_t low_key_at_top = key_pair << kKeyBits;
    greater_bits |= static_cast<uint32_t>(low_key_at_top > pivot_at_top) << (2 * pair);
    equal_bits |= static_cast<uint32_t>(low_key_at_top == pivot_at_top) << (2 * pair);
    greater_bits |= static_cast<uint32_t>(key_pair > (pivot_at_top | 0xFFFFu)) << (2 * pair + 1);
    equal_bits |= static_cast<uint32_t>((key_pair ^ pivot_at_top) <= 0xFFFFu) << (2 * pair + 1);
  }

  // Thread order is column order, so one exclusive scan of (greater, equal) counts gives each
  // thread its first output slot and how many pivot-equal keys lower columns already took.
  // Both counts are <= kMaxBf16Width < 2^16, so they pack into one int.
  const int equal_count = __popc(equal_bits);
  int before;
  BlockScan(shared.scan).ExclusiveSum((__popc(greater_bits) << 16) | equal_count, before);
  const int greater_before = before >> 16;
  const int equal_before = before & 0xFFFF;
  int position = greater_before + min(equal_before, quota);
  const int equal_to_take = max(0, min(equal_count, quota - equal_before));
  uint32_t take_bits = greater_bits | LowestSetBits(equal_bits, equal_to_take);
  if constexpr (!kSorted) {
    for (; take_bits != 0; take_bits &= take_bits - 1) {
      shared.staged.columns[position++] = first_column + __ffs(take_bits) - 1;
    }
  } else {
#pragma unroll
    for (int pair = 0; pair < kPairsPerThread; ++pair) {
      if (take_bits & (1u << (2 * pair))) {
        shared.staged.columns[position] = first_column + 2 * pair;
        shared.staged.keys[position++] = static_cast<uint16_t>(key_pairs[pair]);
      }
      if (take_bits & (2u << (2 * pair))) {
        shared.staged.columns[position] = first_column + 2 * pair + 1;
        shared.staged.keys[position++] = static_cast<uint16_t>(key_pairs[pair] >> kKeyBits);
      }
    }
  }
  __syncthreads();

  const int32_t* table_row =
      problem.page_table != nullptr
          ? problem.page_table +
                TableRowFor(row, problem.table_rows, problem.table_count) * problem.pages
          : nullptr;
  if constexpr (!kSorted) {
    for (int slot = thread; slot < k; slot += kThreadsPerRow) {
      row_out[slot] = slot < selected
                          ? PageTransform(shared.staged.columns[slot], table_row,
                                          problem.log2_page_size)
                          : kEmptySlot;
    }
  } else {
    // Blocked arrangement = staged (ascending column) order, and the radix sort is stable, so
    // equal keys keep ascending columns. Padding keys (kMaskedKey) sort after every real key.
    uint32_t sort_keys[kSortItemsPerThread];
    int32_t sort_columns[kSortItemsPerThread];
#pragma unroll
    for (int i = 0; i < kSortItemsPerThread; ++i) {
      const int slot = thread * kSortItemsPerThread + i;
      const bool filled = slot < selected;
      sort_keys[i] = filled ? shared.staged.keys[slot] : kMaskedKey;
      sort_columns[i] = filled ? shared.staged.columns[slot] : kEmptySlot;
    }
    __syncthreads();
    BlockSort<kSortItemsPerThread>(shared.sort)
        .SortDescendingBlockedToStriped(sort_keys, sort_columns, 0, kKeyBits);
#pragma unroll
    for (int i = 0; i < kSortItemsPerThread; ++i) {
      const int slot = i * kThreadsPerRow + thread;
      if (slot < k) {
        row_out[slot] = slot < selected
                            ? PageTransform(sort_columns[i], table_row, problem.log2_page_size)
                            : kEmptySlot;
      }
    }
  }
}

template <int kElemsPerThread>
cudaError_t LaunchForSliceSize(const TopkProblem& problem, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned int>(problem.rows));
  const dim3 block(kThreadsPerRow);
  if (!problem.sorted) {
    TopkBf16Kernel<kElemsPerThread, 0><<<grid, block, 0, stream>>>(problem);
  } else if (problem.k <= kThreadsPerRow) {
    TopkBf16Kernel<kElemsPerThread, 1><<<grid, block, 0, stream>>>(problem);
  } else if (problem.k <= 2 * kThreadsPerRow) {
    TopkBf16Kernel<kElemsPerThread, 2><<<grid, block, 0, stream>>>(problem);
  } else {
    static_assert(4 * kThreadsPerRow >= kMaxK, "the widest sort covers every k");
    TopkBf16Kernel<kElemsPerThread, 4><<<grid, block, 0, stream>>>(problem);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchTopkBf16(const TopkProblem& problem, cudaStream_t stream) {
  if (problem.rows == 0) return cudaSuccess;
  if (problem.rows < 0 || problem.rows > INT32_MAX || problem.width < 1 ||
      problem.width > kMaxBf16Width || problem.k < 1 || problem.k > kMaxK ||
      (problem.num_valid_rows != nullptr && problem.rows_per_group < 1)) {
    return cudaErrorInvalidValue;
  }
  // The narrowest slice that covers the row: short rows hold fewer registers.
  if (problem.width <= kThreadsPerRow * 8) return LaunchForSliceSize<8>(problem, stream);
  if (problem.width <= kThreadsPerRow * 16) return LaunchForSliceSize<16>(problem, stream);
  return LaunchForSliceSize<kMaxElemsPerThread>(problem, stream);
}

}  // namespace jax_topk
