// A block's rank of up to 4096 64-bit order codes by a fine histogram: 16384 buckets of the
// codes' top bits, so that on rows of normal values most buckets that get ranks hold a single
// code (64 % of them for 2800 kept candidates, f32 or bf16) and comparisons stay rare.
// 1. Each code's bucket count in shared memory (two 16-bit counts a word, one atomic a code,
//    which returns the code's arrival order in its bucket).
// 2. One block scan turns the counts into bucket starts (ascending).
// 3. Each code goes to its bucket's start plus its arrival: `placed` holds the codes grouped
//    by bucket, buckets ascending.
// 4. A code's rank is its bucket's start plus the bucket's smaller codes (an equal code: the
//    one placed first ranks first). Threads take consecutive places, so a warp pays only for
//    the crowded buckets among its own 32 places, not the row's largest.
// Calling contract: every thread of a kThreads block calls each function with block-uniform
// arguments; the words are zero between uses (Zero() restores that), barriers as noted.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/topk_scan.cuh"

namespace jax_topk {
namespace merge_registers {

template <int kThreads>
struct FineBuckets {
  static constexpr int kBits = 14;
  static constexpr int kBins = 1 << kBits;
  static constexpr int kWords = kBins / 2;  // two 16-bit counts (then starts) a word
  static constexpr int kWordsPerThread = kWords / kThreads;
  static constexpr int kRowWords = kThreads + 2;  // a row of words, two of them never used
  static constexpr int kStoredWords = kWordsPerThread * kRowWords;
  static constexpr int kWarps = kThreads / 32;
  static_assert(kWordsPerThread == 16, "a thread scans 32 buckets: WordAt's layout");
  static_assert(kStoredWords % 4 == 0, "Zero() clears 16 bytes at a time");

  alignas(16) uint32_t words[kStoredWords];
  uint32_t warp_sums[kWarps];
  uint32_t largest;  // the largest count of a bucket that gets ranks (this use)

  // Word j of thread t's buckets [32t, 32t + 32) (buckets 32t + 2j and 32t + 2j + 1: bucket b
  // is half b & 1 of its word) is word t of row j, rows kThreads + 2 words apart, so that
  // - the scan, where the lanes of a warp read row j at 32 consecutive t, sees 32 banks;
  // - thread t's words lie in 16 banks (t + 2j), and t + 1's in the other 16: 64 consecutive
  //   buckets in 32 banks. Rows of kThreads words put every bucket of t in one bank, and the
  //   codes a warp counts, places or ranks are often close (consecutive places; kept codes of
  //   lists in rank order): `python -m benches.probes.merge_fine_banks` counts 5.9x fewer
  //   wavefronts for the rank's starts and ends this way.
  static __device__ __forceinline__ uint32_t WordAt(uint32_t t, uint32_t j) {
    return j * kRowWords + t;
  }
  static __device__ __forceinline__ uint32_t FineWord(uint32_t b) {
    return WordAt(b >> 5, (b >> 1) & (kWordsPerThread - 1));
  }

  // Step 1: counts one code of bucket b; returns how many came before it.
  __device__ __forceinline__ uint32_t Add(uint32_t b) {
    const uint32_t half = (b & 1u) * 16;
    return (atomicAdd(&words[FineWord(b)], 1u << half) >> half) & 0xFFFFu;
  }

  // Step 2, after the counts (and a barrier): counts become starts. Returns the largest count
  // of the buckets that get ranks: those starting before `limit`, or (only_straddling) the one
  // starting before it and ending after it. Ends with a barrier.
  __device__ __forceinline__ uint32_t Starts(uint32_t limit, bool only_straddling) {
    uint32_t mine = 0;
#pragma unroll
    for (int j = 0; j < kWordsPerThread; ++j) {
      const uint32_t counts = words[WordAt(threadIdx.x, j)];
      mine += (counts & 0xFFFFu) + (counts >> 16);
    }
    if (threadIdx.x == 0) largest = 0;
    uint32_t total;
    uint32_t start = BlockExclusiveSum<kWarps>(warp_sums, mine, total);  // a barrier inside
    uint32_t my_largest = 0;
    const auto consider = [&](uint32_t first, uint32_t count) {
      const bool ranked = first < limit && (!only_straddling || first + count > limit);
      if (ranked) my_largest = max(my_largest, count);
    };
#pragma unroll
    for (int j = 0; j < kWordsPerThread; ++j) {  // read again: fewer registers across the scan
      uint32_t& word = words[WordAt(threadIdx.x, j)];
      const uint32_t low = word & 0xFFFFu, high = word >> 16;
      word = start | (start + low) << 16;
      consider(start, low);
      consider(start + low, high);
      start += low + high;
    }
    my_largest = __reduce_max_sync(0xFFFFFFFFu, my_largest);
    if (threadIdx.x % 32 == 0) atomicMax(&largest, my_largest);
    __syncthreads();
    return largest;
  }

  // After step 2: where bucket b starts, and where it ends (`total`: the codes counted).
  __device__ __forceinline__ uint32_t Start(uint32_t b) const {
    return (words[FineWord(b)] >> ((b & 1u) * 16)) & 0xFFFFu;
  }
  __device__ __forceinline__ uint32_t End(uint32_t b, uint32_t total) const {
    return b + 1 < kBins ? Start(b + 1) : total;
  }

  // Every word zero again, the unused ones too (a union may overlay them; no barrier: the
  // caller's next one orders it).
  __device__ __forceinline__ void Zero() {
    constexpr int kWhole = kStoredWords / 4 / kThreads, kTail = kStoredWords / 4 % kThreads;
    uint4* vectors = reinterpret_cast<uint4*>(words);
#pragma unroll
    for (int j = 0; j < kWhole; ++j) vectors[j * kThreads + threadIdx.x] = make_uint4(0, 0, 0, 0);
    if (threadIdx.x < kTail) vectors[kWhole * kThreads + threadIdx.x] = make_uint4(0, 0, 0, 0);
  }
};

// Steps 1-2 for the codes code_of(slot) of this thread's slots slot = j * kThreads +
// threadIdx.x < n whose bit j of `selected` is set (j < kSlots), buckets code >> shift; each
// one's arrival in its bucket into `arrivals` (two 16-bit ones a word). Returns false (the words
// zero again) when a bucket that gets ranks (see Starts) holds more than max_bucket. Ends with
// a barrier.
template <int kSlots, int kThreads, class CodeOf>
__device__ __forceinline__ bool CountIntoBuckets(FineBuckets<kThreads>& fine, int n,
                                                 uint32_t selected, const CodeOf& code_of,
                                                 int shift, uint32_t limit, bool only_straddling,
                                                 uint32_t max_bucket,
                                                 uint32_t (&arrivals)[kSlots / 2]) {
  static_assert(kSlots % 2 == 0, "arrivals (< 2^16) packed two a register");
#pragma unroll
  for (int j = 0; j < kSlots / 2; ++j) arrivals[j] = 0;
#pragma unroll
  for (int j = 0; j < kSlots; ++j) {
    const int slot = j * kThreads + static_cast<int>(threadIdx.x);
    if (slot < n && (selected >> j & 1u))
      arrivals[j / 2] |= fine.Add(static_cast<uint32_t>(code_of(slot) >> shift)) << (j % 2 * 16);
  }
  __syncthreads();
  if (fine.Starts(limit, only_straddling) > max_bucket) {  // block-uniform
    fine.Zero();
    __syncthreads();
    return false;
  }
  return true;
}

// Steps 1-3 for the codes of CountIntoBuckets (code_of is called twice a slot, so it must not
// read `placed`): `placed` gets them grouped by bucket. Returns false (the words zero again,
// `placed` untouched) when a bucket that gets ranks holds more than max_bucket. Ends with a
// barrier.
template <int kSlots, int kThreads, class CodeOf>
__device__ __forceinline__ bool PlaceByBucket(FineBuckets<kThreads>& fine, int n, uint32_t selected,
                                              const CodeOf& code_of, int shift, uint32_t limit,
                                              bool only_straddling, uint32_t max_bucket,
                                              uint64_t* placed) {
  uint32_t arrivals[kSlots / 2];
  if (!CountIntoBuckets<kSlots>(fine, n, selected, code_of, shift, limit, only_straddling,
                                max_bucket, arrivals))
    return false;
#pragma unroll
  for (int j = 0; j < kSlots; ++j) {
    const int slot = j * kThreads + static_cast<int>(threadIdx.x);
    if (slot >= n || !(selected >> j & 1u)) continue;
    const uint64_t code = code_of(slot);
    const uint32_t arrival = arrivals[j / 2] >> (j % 2 * 16) & 0xFFFFu;
    placed[fine.Start(static_cast<uint32_t>(code >> shift)) + arrival] = code;
  }
  __syncthreads();
  return true;
}

// Step 4: the rank of placed[place] = code, its bucket's places [first, end).
__device__ __forceinline__ uint32_t RankInBucket(const uint64_t* placed, uint32_t place,
                                                 uint64_t code, uint32_t first, uint32_t end) {
  if (end - first == 1) return first;
  uint32_t rank = first;
  for (uint32_t j = first; j < end; ++j) {
    const uint64_t other = placed[j];
    rank += other < code || (other == code && j < place);
  }
  return rank;
}

}  // namespace merge_registers
}  // namespace jax_topk
