// topk_f32_cluster: exact top-k of few rows of at most kF32ClusterMaxWidth float32 (or
// kF32ClusterMaxWidth16 bfloat16 or float16) columns, a row per thread block cluster of 8 to 16
// blocks, each block holding a contiguous slice of the row in registers as float32 ordered keys
// (topk_f32_rows.cu's kernel spread over a cluster of SMs: one SM alone is slow to read and scan a
// 128 KB row). 16-bit values are read at two bytes and widened exactly (kernels/widen_exact.cuh),
// so every phase after the load is float32's and the values output narrows them back. Per row:
//  1. Load: block b of the cluster keeps columns [b * slice, (b + 1) * slice), thread t of it a
//     contiguous kElems of them, as ordered keys (0: NaN or past the length; the length applied
//     after the loads are issued).
//  2. Three radix digits (11+11+10 bits) of the k-th key: each block histograms its keys that
//     match the digits found so far and sums each 32 bins into a super-bin, then pushes its
//     super-bins into every block's shared memory (st.async, counted on the receiver's mbarrier:
//     one one-way trip, no cluster barrier, no remote load); warp 0 of every block picks the
//     super-bin from them, every block pushes its 32 bins of it the same way, and warp 0 picks
//     the bin (the same sums in every block: no broadcast). The same pushes count the keys above
//     the bin, and in it, in the blocks before this one. Once a digit leaves at most 32 keys in
//     the bin (most rows after two digits), every block pushes those keys with their columns to
//     every block instead, and warp 0 ranks them there: the full pivot in one exchange. A digit
//     whose chosen super-bin already holds at most 32 keys gathers them without its bin exchange
//     (the second digit of most rows of <= 32768 columns at k = 2048, and of far tails at small
//     k).
//  3. Winners: the blocks own ascending column ranges, so block b's winners follow the greater
//     keys and the taken ties of the blocks before it; a block scan places the rest (ties to the
//     lowest columns). Unsorted: stored from the registers. Sorted: pushed into block 0's shared
//     memory and stored from there (ranked by counting, or a block radix sort past 256).
// Traffic: each score of the row's width read once (the length applied after the loads); k
// indices (and values) written per row. No workspace. Needs sm_90 (clusters); the host never
// launches it elsewhere (TopkF32ClusterServes).
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "common/topk_common.h"
#include "kernels/cluster_launch.cuh"
#include "kernels/cluster_push.cuh"
#include "kernels/f32_rows/register_row.cuh"
#include "kernels/global_timer.cuh"
#include "kernels/topk_cuda.h"
#include "kernels/topk_scan.cuh"

namespace jax_topk {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxParts = 16;           // blocks a cluster: the non-portable size
constexpr int kPortableParts = 8;       // what every sm_90 device launches
constexpr int kMaxElemsPerThread = 32;  // one bit a key in the winner masks
constexpr int kMostServedElems = 24;    // by default (TopkF32ClusterServes): measured faster
// 16-bit rows get no 32-key instance (kernels compiled: the float32 rows' measured limit).
constexpr int kMaxElemsPerThread16 = 24;
static_assert(int64_t{kMaxParts} * kThreads * kMaxElemsPerThread == kF32ClusterMaxWidth,
              "the widest row fills every register slot of the largest cluster");
static_assert(int64_t{kMaxParts} * kThreads * kMaxElemsPerThread16 == kF32ClusterMaxWidth16,
              "the widest 16-bit row fills the largest 16-bit instance of the largest cluster");
constexpr int kBinsPerSuper = 32;  // a warp's lanes
constexpr int kSuperBins = kDigitBins / kBinsPerSuper;
static_assert(kSuperBins == 64, "warp 0 reads two super-bins a lane");

// What warp 0 found of one digit, identical in every block of the cluster but the *_before
// fields (which count the blocks before this one). The first exchange fills super, valid and
// the running above counts; the second the bin and the final counts.
struct DigitFound {
  uint32_t super;            // the super-bin of the rank-th key
  uint32_t bin;              // the digit of the rank-th key
  uint32_t above;            // the cluster's matching keys in higher bins
  uint32_t above_before;     // of which in the blocks before this one
  uint32_t in_bin_before;    // the blocks before this one: their matching keys in the bin
  uint32_t in_bin;           // the cluster's matching keys in the bin
  uint32_t valid;            // the first digit: the row's real keys
  uint32_t valid_before;     // of which in the blocks before this one
  uint32_t in_super;         // the first exchange: the cluster's matching keys in the super-bin
  uint32_t in_super_before;  // of which in the blocks before this one
};

// Phase stamps for the standalone probe (benches/probes/f32_cluster_stamps.cu defines
// JAX_TOPK_F32_CLUSTER_STAMPS before including this file): thread 0 of each block stores the
// globaltimer at the end of each phase. A no-op in the library.
#ifndef JAX_TOPK_F32_CLUSTER_STAMPS
#define JAX_TOPK_F32_CLUSTER_STAMPS 0
#endif
#if JAX_TOPK_F32_CLUSTER_STAMPS
constexpr int kStampSlots = 24;
__device__ unsigned long long g_cluster_stamps[1024][kStampSlots];
#endif
__device__ __forceinline__ void Stamp(int slot) {
#if JAX_TOPK_F32_CLUSTER_STAMPS
  if (threadIdx.x == 0 && blockIdx.x < 1024) g_cluster_stamps[blockIdx.x][slot] = GlobalTimerNs();
#else
  (void)slot;
#endif
}

// Each warp's own stamps (lane 0's globaltimer) where a warp finishes a loop over its keys,
// before the barrier that follows: how long the loop took that warp, not the slowest one.
enum WarpStampSlot : int {
  kKeysMade,    // the keys made of the loaded values (this waits for the loads already; below
                //   16 keys a thread after the zeroed histograms' barrier)
  kKeysLanded,  // the stamps build waits here for every key, to be sure
  kFirstHistogramLooped,
  kSecondHistogramLooped,
  kCandidatesPushed,
  kWinnersStored,
  kWarpStampSlots,
};
#if JAX_TOPK_F32_CLUSTER_STAMPS
__device__ unsigned long long g_warp_stamps[1024][kThreads / 32][kWarpStampSlots];
#endif
__device__ __forceinline__ void WarpStamp(int slot) {
#if JAX_TOPK_F32_CLUSTER_STAMPS
  if (threadIdx.x % 32 == 0 && blockIdx.x < 1024) {
    g_warp_stamps[blockIdx.x][threadIdx.x / 32][slot] = GlobalTimerNs();
  }
#else
  (void)slot;
#endif
}

// A digit's two exchanges: every block's super-bins, then every block's 32 bins of the chosen
// super-bin.
enum Exchange : int { kSuperExchange, kBinExchange, kExchanges };

// At most this many keys left in the chosen bin after a digit are gathered into every block,
// (key, column) pairs, and ranked there by one warp: one exchange instead of the next digits'.
constexpr int kMaxCandidates = 32;

struct ClusterShared {
  // Receivers of the pushes (cluster_push.cuh), one mbarrier an exchange, each used once.
  uint64_t arrived[kDigits][kExchanges];
  // What block q pushed: its super-bins of a digit, and its bins of the chosen super-bin.
  alignas(8) uint32_t pushed_supers[kDigits][kMaxParts][kSuperBins];  // pushed as pairs
  uint32_t pushed_bins[kDigits][kMaxParts][kBinsPerSuper];
  // The gathered candidates (key, column), in no order; armed once their count is known.
  uint64_t candidates_arrived;
  alignas(8) uint32_t candidates[kMaxCandidates][2];
  uint32_t candidates_taken;  // this block's candidates pushed so far (a slot counter)
  // Sorted rows: block 0's receiver of every block's winners (armed once `selected` is known).
  uint64_t winners_arrived;
  // This block's histogram of each digit (no reuse, so no barrier guards a rewrite); read as
  // uint4 by SumSuperBins.
  alignas(16) uint32_t hist[kDigits][kDigitBins];
  uint32_t super_bins[kDigits][kSuperBins];
  // Sorted rows: the cluster's winners, in block 0 (the sort's space once they are read).
  union {
    StagedWinners staged;
    WinnerSort<kThreads>::TempStorage sort;
  };
  uint32_t warp_sums[kWarps];
  DigitFound found;
  DigitFound gathered;  // GatherCandidates' pivot (s.found may still be read meanwhile)
};

// Bit i: key[i] is a real key matching `prefix` under `prefix_mask` (every real key for an empty
// prefix), computed without branches, for ForEachSetKey to visit only the matching slots. The
// digits' loops use it from kBitLoopMinSlots keys a thread. Below that they keep a test a slot:
// written through this mask, the 4-key kernel compiled to other SASS that ran 0.55 us a launch
// slower; written as below, its SASS is what it was before (benches/NOTES.md "set-bit loops").
template <int kElems>
__device__ __forceinline__ uint32_t MatchingKeys(const RowKeys<kElems>& row, uint32_t prefix,
                                                 uint32_t prefix_mask) {
  uint32_t bits = 0;
#pragma unroll
  for (int i = 0; i < kElems; ++i) {
    bits |= static_cast<uint32_t>(row.key[i] != 0 && (row.key[i] & prefix_mask) == prefix) << i;
  }
  return bits;
}

// Thread 0, before the cluster barrier that precedes any push: every receiver initialised, and
// the digits' receivers armed with the bytes each exchange brings from `parts` blocks (the
// candidates' and the winners' are armed once their counts are known).
__device__ __forceinline__ void ArmReceivers(ClusterShared& s, int parts) {
  for (int digit = 0; digit < kDigits; ++digit) {
    MbarrierInit(&s.arrived[digit][kSuperExchange], 1);
    MbarrierInit(&s.arrived[digit][kBinExchange], 1);
  }
  MbarrierInit(&s.candidates_arrived, 1);  // armed by GatherCandidates
  MbarrierInit(&s.winners_arrived, 1);     // armed in block 0 once the pivot is known
  s.candidates_taken = 0;
  for (int digit = 0; digit < kDigits; ++digit) {
    MbarrierExpectBytes(&s.arrived[digit][kSuperExchange], parts * kSuperBins * 4);
    MbarrierExpectBytes(&s.arrived[digit][kBinExchange], parts * kBinsPerSuper * 4);
  }
  FenceMbarrierInit();
}

// This block's super-bins of `digit` (after a barrier that follows its histogram): thread t
// sums bins 4t to 4t + 3, and the 8 lanes of a super-bin add theirs.
__device__ __forceinline__ void SumSuperBins(ClusterShared& s, int digit) {
  static_assert(kThreads * 4 == kDigitBins && kBinsPerSuper == 32, "4 bins a thread, 8 a super");
  const uint4 four = reinterpret_cast<const uint4*>(s.hist[digit])[threadIdx.x];
  uint32_t count = four.x + four.y + four.z + four.w;
#pragma unroll
  for (int offset = 4; offset > 0; offset /= 2)
    count += __shfl_xor_sync(0xFFFFFFFFu, count, offset);
  if (threadIdx.x % 8 == 0) s.super_bins[digit][threadIdx.x / 8] = count;
}

// Warp w < parts (after a barrier): this block's super-bins of `digit`, or its 32 bins of the
// chosen super-bin, pushed into block w's slot for this block.
__device__ __forceinline__ void PushSuperBins(ClusterShared& s, int digit, int parts, int part) {
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= parts) return;
  const uint32_t to = static_cast<uint32_t>(warp);
  PushWords(MapToBlock(SharedAddress(&s.pushed_supers[digit][part][2 * lane]), to),
            MapToBlock(SharedAddress(&s.arrived[digit][kSuperExchange]), to),
            s.super_bins[digit][2 * lane], s.super_bins[digit][2 * lane + 1]);
}
__device__ __forceinline__ void PushChosenBins(ClusterShared& s, int digit, int parts, int part,
                                               uint32_t super) {
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= parts) return;
  const uint32_t to = static_cast<uint32_t>(warp);
  PushWord(MapToBlock(SharedAddress(&s.pushed_bins[digit][part][lane]), to),
           MapToBlock(SharedAddress(&s.arrived[digit][kBinExchange]), to),
           s.hist[digit][super * kBinsPerSuper + lane]);
}

// Warp 0, once every block's super-bins of `digit` arrived: the super-bin holding the rank-th
// largest matching key of the cluster, and the keys above it, into s.found. For the first
// digit also the row's real keys (s.found.valid): a rank past them finds no super-bin.
__device__ __forceinline__ void ChooseSuperBin(ClusterShared& s, int digit, int parts, int part,
                                               uint32_t rank) {
  const unsigned full = 0xFFFFFFFFu;
  const int lane = threadIdx.x;
  MbarrierWaitFirstPhase(&s.arrived[digit][kSuperExchange]);
  // Lane l: super-bins 63 - 2l (high) and 62 - 2l (low), so lane order is descending bin order.
  const int low = kSuperBins - 2 - 2 * lane;
  uint32_t high_count = 0;
  uint32_t low_count = 0;
  uint32_t high_before = 0;
  uint32_t low_before = 0;
  // Every slot loaded before any is added, so the loads overlap (a load under `q < parts` would
  // wait for the sum before it); slots past `parts` hold nothing and count nothing.
  uint2 pairs[kMaxParts];
#pragma unroll
  for (int q = 0; q < kMaxParts; ++q) {
    pairs[q] = *reinterpret_cast<const uint2*>(&s.pushed_supers[digit][q][low]);
  }
#pragma unroll
  for (int q = 0; q < kMaxParts; ++q) {
    const uint2 pair = q < parts ? pairs[q] : make_uint2(0, 0);
    low_count += pair.x;
    high_count += pair.y;
    low_before += q < part ? pair.x : 0u;
    high_before += q < part ? pair.y : 0u;
  }
  // Counts <= kF32ClusterMaxWidth: int sums are exact.
  const uint32_t pair = high_count + low_count;
  const uint32_t pair_inclusive = static_cast<uint32_t>(WarpInclusiveSum(static_cast<int>(pair)));
  const uint32_t pair_above = pair_inclusive - pair;
  const uint32_t holders = __ballot_sync(full, pair_above < rank && rank <= pair_inclusive);
  if (digit == 0) {
    const uint32_t valid = __shfl_sync(full, pair_inclusive, 31);
    const uint32_t valid_before = __reduce_add_sync(full, high_before + low_before);
    if (lane == 0) {
      s.found.valid = valid;
      s.found.valid_before = valid_before;
    }
  }
  if (holders == 0) return;  // only the first digit, rank > valid
  const int holder = __ffs(holders) - 1;
  const bool in_high = rank <= __shfl_sync(full, pair_above + high_count, holder);
  const uint32_t above = __shfl_sync(full, in_high ? pair_above : pair_above + high_count, holder);
  const uint32_t above_before =
      __reduce_add_sync(full, lane < holder ? high_before + low_before
                                            : (lane == holder && !in_high ? high_before : 0u));
  const uint32_t in_super = __shfl_sync(full, in_high ? high_count : low_count, holder);
  const uint32_t in_super_before = __shfl_sync(full, in_high ? high_before : low_before, holder);
  if (lane == 0) {
    s.found.super = static_cast<uint32_t>(kSuperBins - 1 - 2 * holder - (in_high ? 0 : 1));
    s.found.above = above;
    s.found.above_before = above_before;
    s.found.in_super = in_super;
    s.found.in_super_before = in_super_before;
  }
}

// Warp 0, once every block's bins of the chosen super-bin arrived (s.found holds the first
// exchange's finding): the bin of `digit` holding the rank-th key, and the final counts.
__device__ __forceinline__ void ChooseBin(ClusterShared& s, int digit, int parts, int part,
                                          uint32_t rank) {
  const unsigned full = 0xFFFFFFFFu;
  const int lane = threadIdx.x;
  MbarrierWaitFirstPhase(&s.arrived[digit][kBinExchange]);
  // Lane l: the chosen super-bin's l-th bin from the top (pushed at slot 31 - l).
  uint32_t in_bin = 0;
  uint32_t in_bin_before = 0;
  uint32_t counts[kMaxParts];  // all loaded first, as in ChooseSuperBin
#pragma unroll
  for (int q = 0; q < kMaxParts; ++q) counts[q] = s.pushed_bins[digit][q][kBinsPerSuper - 1 - lane];
#pragma unroll
  for (int q = 0; q < kMaxParts; ++q) {
    const uint32_t count = q < parts ? counts[q] : 0u;
    in_bin += count;
    in_bin_before += q < part ? count : 0u;
  }
  const uint32_t above = s.found.above;
  const uint32_t bin_inclusive =
      above + static_cast<uint32_t>(WarpInclusiveSum(static_cast<int>(in_bin)));
  const uint32_t bin_above = bin_inclusive - in_bin;
  const int bin_holder =
      __ffs(__ballot_sync(full, bin_above < rank && rank <= bin_inclusive)) - 1;  // one exists
  const uint32_t above_before =
      s.found.above_before + __reduce_add_sync(full, lane < bin_holder ? in_bin_before : 0u);
  const uint32_t holder_above = __shfl_sync(full, bin_above, bin_holder);
  const uint32_t holder_before = __shfl_sync(full, in_bin_before, bin_holder);
  const uint32_t holder_in_bin = __shfl_sync(full, in_bin, bin_holder);
  __syncwarp();  // every lane read s.found before lane 0 rewrites it
  if (lane == 0) {
    s.found.bin = s.found.super * kBinsPerSuper + kBinsPerSuper - 1 - bin_holder;
    s.found.above = holder_above;
    s.found.above_before = above_before;
    s.found.in_bin_before = holder_before;
    s.found.in_bin = holder_in_bin;
  }
}

// After a digit left at most kMaxCandidates keys in the chosen bin or super-bin (`total` over the
// cluster, the same in every block; `first` in the blocks before this one): every block pushes
// its keys that match `prefix` under `prefix_mask`, with their
// columns, into every block's candidates; warp 0 of each block ranks them (value descending,
// column ascending: the order the winners are taken in) and finds the rank-th, the full pivot.
// Every thread calls it, after reading s.found; it returns what the last digit would have found,
// in s.gathered: bin (the whole pivot key), above, above_before and in_bin_before (the pivot's
// ties in earlier blocks).
template <int kElems>
__device__ __forceinline__ void GatherCandidates(ClusterShared& s, const RowKeys<kElems>& row,
                                                 int parts, int block_begin, uint32_t prefix,
                                                 uint32_t prefix_mask, uint32_t rank,
                                                 uint32_t total, uint32_t first) {
  if (threadIdx.x == 0) MbarrierExpectBytes(&s.candidates_arrived, total * 8);
  const auto push = [&](int i, uint32_t key) {
    const uint32_t slot = first + atomicAdd(&s.candidates_taken, 1u);
    const uint32_t local = SharedAddress(&s.candidates[min(slot, kMaxCandidates - 1)][0]);
    const uint32_t barrier = SharedAddress(&s.candidates_arrived);
    for (int q = 0; q < parts; ++q) {
      PushWords(MapToBlock(local, q), MapToBlock(barrier, q), key,
                static_cast<uint32_t>(row.first_column + i));
    }
  };
  if constexpr (kElems >= kBitLoopMinSlots) {
    ForEachSetKey(row, MatchingKeys(row, prefix, prefix_mask), push);
  } else {
#pragma unroll
    for (int i = 0; i < kElems; ++i) {
      const uint32_t key = row.key[i];
      // Required: the first digit's super-bin 0 (gathered when it holds <= 32 keys, e.g. a row
      // of a few -inf) has prefix 0, which key 0 (NaN, past the length) matches too.
      if (key != 0 && (key & prefix_mask) == prefix) push(i, key);
    }
  }
  WarpStamp(kCandidatesPushed);
  if (threadIdx.x >= 32) return;
  const unsigned full = 0xFFFFFFFFu;
  const int lane = threadIdx.x;
  MbarrierWaitFirstPhase(&s.candidates_arrived);
  const bool real = static_cast<uint32_t>(lane) < total;
  const uint32_t key = real ? s.candidates[lane][0] : 0u;
  const uint32_t column = real ? s.candidates[lane][1] : 0xFFFFFFFFu;
  // Lane l's place in the order: the candidates before it (all independent shuffles).
  uint32_t place = 0;
#pragma unroll
  for (int j = 0; j < kMaxCandidates; ++j) {
    const uint32_t other_key = __shfl_sync(full, key, j);
    const uint32_t other_column = __shfl_sync(full, column, j);
    place += other_key > key || (other_key == key && other_column < column);
  }
  // The rank-th candidate exists: rank <= total (the bin holds the rank-th key).
  const int pivot_lane = __ffs(__ballot_sync(full, real && place == rank - 1)) - 1;
  const uint32_t pivot = __shfl_sync(full, key, pivot_lane);
  const bool before = column < static_cast<uint32_t>(block_begin);
  const uint32_t above = __popc(__ballot_sync(full, real && key > pivot));
  const uint32_t above_before = __popc(__ballot_sync(full, real && key > pivot && before));
  const uint32_t equal_before = __popc(__ballot_sync(full, real && key == pivot && before));
  if (lane == 0) {
    s.gathered.bin = pivot;
    s.gathered.above = above;
    s.gathered.above_before = above_before;
    s.gathered.in_bin_before = equal_before;
  }
}

// Where this block's winners start and what it takes: the k-th key of the row and the ties left
// to this block, found over the cluster. Every thread of every block of the cluster calls it,
// after arriving at the cluster barrier that follows ArmReceivers; two pushes a digit. Returns
// the row's real keys in `valid`. Compiled for sm_90 on only (cooperative_groups has no
// cluster_group below it; the kernel's body is empty there, and ComputePlan, which asks each
// kernel what its code was compiled for, never launches it).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
template <int kElems>
__device__ __forceinline__ Pivot FindClusterPivot(ClusterShared& s,
                                                  const cg::cluster_group& cluster,
                                                  const RowKeys<kElems>& row, int parts, int part,
                                                  int block_begin, int k, int& valid,
                                                  int& block_first_slot) {
  uint32_t rank = static_cast<uint32_t>(k);
  uint32_t prefix = 0;
  uint32_t prefix_mask = 0;
  uint32_t greater_before = 0;
#pragma unroll
  for (int digit = 0; digit < kDigits; ++digit) {
    const int shift = DigitShift(digit);
    const uint32_t mask = DigitMask(digit);
    // Every real key for the first digit (an empty prefix), the few matching it after.
    const auto count = [&](int, uint32_t key) {
      atomicAdd(&s.hist[digit][(key >> shift) & mask], 1u);
    };
    if constexpr (kElems >= kBitLoopMinSlots) {
      ForEachSetKey(row, MatchingKeys(row, prefix, prefix_mask), count);
    } else {
#pragma unroll
      for (int i = 0; i < kElems; ++i) {
        const uint32_t key = row.key[i];
        // Real keys are >= 0x007FFFFF: after the first digit a matching key is never 0.
        if (digit == 0 ? key != 0 : (key & prefix_mask) == prefix) count(i, key);
      }
    }
    if (digit < 2) WarpStamp(digit == 0 ? kFirstHistogramLooped : kSecondHistogramLooped);
    __syncthreads();
    Stamp(2 + 3 * digit);
    SumSuperBins(s, digit);
    // Every block's receivers are armed (the kernel arrived at this barrier after arming).
    if (digit == 0) cluster.barrier_wait();
    __syncthreads();
    PushSuperBins(s, digit, parts, part);
    if (threadIdx.x < 32) ChooseSuperBin(s, digit, parts, part, rank);
    __syncthreads();
    Stamp(3 + 3 * digit);
    if (digit == 0) {
      valid = static_cast<int>(s.found.valid);
      if (s.found.valid <= rank) {  // at most k real keys: all of them (every key > 0)
        block_first_slot = static_cast<int>(s.found.valid_before);
        return {0, 0};
      }
    }
    // A chosen super-bin of at most kMaxCandidates keys (a later digit's, on most rows: the
    // earlier digits left a narrow range) is gathered at once: its keys share the digit's top
    // bits, so the super-bin is a prefix like a bin's, and the bin exchange is skipped. The count
    // is the cluster's sum, the same in every block, so every block takes the same branch.
    const bool gather_super = digit < kDigits - 1 && s.found.in_super <= kMaxCandidates;
    if (!gather_super) {
      PushChosenBins(s, digit, parts, part, s.found.super);
      if (threadIdx.x < 32) ChooseBin(s, digit, parts, part, rank);
      __syncthreads();
    }
    Stamp(4 + 3 * digit);
    const DigitFound found = s.found;
    rank -= found.above;
    greater_before += found.above_before;
    if (gather_super) {
      constexpr uint32_t kSuperMask = ~static_cast<uint32_t>(kBinsPerSuper - 1);
      prefix |= (found.super * kBinsPerSuper) << shift;
      prefix_mask |= (mask & kSuperMask) << shift;
    } else {
      prefix |= found.bin << shift;
      prefix_mask |= mask << shift;
    }
    uint32_t pivot = prefix;
    uint32_t equal_before = found.in_bin_before;
    if (gather_super || (digit < kDigits - 1 && found.in_bin <= kMaxCandidates)) {
      GatherCandidates(s, row, parts, block_begin, prefix, prefix_mask, rank,
                       gather_super ? found.in_super : found.in_bin,
                       gather_super ? found.in_super_before : found.in_bin_before);
      __syncthreads();
      Stamp(14 + digit);
      const DigitFound gathered = s.gathered;
      rank -= gathered.above;
      greater_before += gathered.above_before;
      pivot = gathered.bin;
      equal_before = gathered.in_bin_before;
    } else if (digit < kDigits - 1) {
      // The next digit's warp 0 rewrites s.found only after its histogram's barrier, which every
      // thread reaches after the reads above.
      continue;
    }
    // The ties of the blocks before this one are taken first (lower columns).
    block_first_slot = static_cast<int>(greater_before + min(equal_before, rank));
    return {pivot, static_cast<int>(rank > equal_before ? rank - equal_before : 0)};
  }
  return {0, 0};  // not reached
}
#endif

template <ScoreType kType, int kElems, bool kSorted>
__global__ void __launch_bounds__(kThreads, 1)
    TopkF32ClusterKernel(const TopkProblem problem, int slice) {
  using Scores = RegisterScores<kType>;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ uint4 shared_words[];
  ClusterShared& s = *reinterpret_cast<ClusterShared*>(shared_words);
  Stamp(0);
  const cg::cluster_group cluster = cg::this_cluster();
  const int parts = static_cast<int>(cluster.num_blocks());
  const int part = static_cast<int>(cluster.block_rank());
  const int64_t row = blockIdx.x / parts;
  const int k = problem.k;
  const RowOutput<Scores> output(problem, row);
  // The row's empty slots are spread over the whole cluster.
  const int cluster_thread = part * kThreads + static_cast<int>(threadIdx.x);
  const int cluster_threads = parts * kThreads;
  if (!RowIsValid(row, problem.num_valid_rows, problem.rows_per_group)) {
    for (int slot = cluster_thread; slot < k; slot += cluster_threads) output.StoreEmpty(slot);
    return;  // the same for every block of the cluster: no barrier waits for it
  }
  if (threadIdx.x == 0) ArmReceivers(s, parts);
  // Released before the loads, waited for before the first push (its latency behind the loads).
  cluster.barrier_arrive();
  const int32_t given_length =
      problem.lengths != nullptr ? problem.lengths[row] : static_cast<int32_t>(problem.width);
  const int begin = part * slice;
  RowKeys<kElems> keys;
  const auto* const row_scores =
      static_cast<const typename Scores::Storage*>(problem.scores) + row * problem.width;
  const int first_column = begin + static_cast<int>(threadIdx.x) * kElems;
  const int slice_end = min(static_cast<int>(problem.width), begin + slice);
  const auto zero_histograms = [&] {
    for (int i = threadIdx.x; i < kDigits * kDigitBins; i += kThreads) (&s.hist[0][0])[i] = 0;
  };
  // Below 16 keys a thread the histograms are zeroed, and their barrier passed, while the loads
  // are in flight (-0.11 to -0.18 us at 4 keys a thread, -0.13 at 8, on an H100: benches/NOTES.md
  // "topk_f32_cluster: the histograms zeroed behind the loads"); from 16 the keys are made first,
  // where the conversions overlap the zeroing (the split cost 0.2-0.35 us there: NOTES "Set-bit
  // loops", its last paragraphs).
  constexpr bool kZeroBehindLoads = kElems < 16;
  if constexpr (kZeroBehindLoads) {
    LoadedSlice<Scores, kElems> loaded;
    IssueRowLoads<Scores>(row_scores, first_column, slice_end, loaded);
    zero_histograms();
    __syncthreads();  // the histograms are zero
    Stamp(1);
    MakeRowKeys(loaded, keys);
  } else {
    LoadRow<Scores>(row_scores, first_column, slice_end, keys);
    zero_histograms();
  }
  WarpStamp(kKeysMade);
#if JAX_TOPK_F32_CLUSTER_STAMPS
  {  // the stamps build only: wait here for every key, to time the loads alone
    uint32_t all = 0;
#pragma unroll
    for (int i = 0; i < kElems; ++i) all ^= keys.key[i];
    asm volatile("" ::"r"(all));
  }
#endif
  WarpStamp(kKeysLanded);
  DropPastLength(keys, static_cast<int>(ClampLength(given_length, problem.width)));
  if constexpr (!kZeroBehindLoads) {
    __syncthreads();  // the histograms are zero
    Stamp(1);
  }

  int valid = 0;
  int block_first_slot = 0;
  const Pivot pivot =
      FindClusterPivot(s, cluster, keys, parts, part, begin, k, valid, block_first_slot);
  const int selected = min(valid, k);
  const WinnerMasks masks = WinnerMasksOf(keys, pivot);
  uint32_t total;
  TakenKeys taken =
      TakeWinners(masks, BlockExclusiveSum(s.warp_sums, PackedCounts(masks), total), pivot.quota);
  taken.position += block_first_slot;
  Stamp(11);
  // No cluster barrier at the end: every push into a block belongs to an exchange that block
  // waits for, so no block exits while words are still owed to it. A block may exit with its own
  // pushes in flight: st.async takes its data from registers, and neither the CUDA guide nor the
  // PTX ISA asks the issuing block to outlive it (only the receiving one), as with a remote
  // mbarrier arrive issued just before a block exits.
  if constexpr (!kSorted) {
    ForEachTaken(keys, taken,
                 [&](int slot, int32_t column, uint32_t key) { output.Store(slot, column, key); });
    WarpStamp(kWinnersStored);
    for (int slot = selected + cluster_thread; slot < k; slot += cluster_threads) {
      output.StoreEmpty(slot);
    }
    Stamp(13);
  } else {
    // Every block pushes its winners into block 0's staging (8 bytes per winner, counted on block
    // 0's mbarrier), and only block 0 waits: one one-way trip instead of a cluster barrier.
    if (part == 0 && threadIdx.x == 0) {
      MbarrierExpectBytes(&s.winners_arrived, static_cast<uint32_t>(selected) * 8);
    }
    const uint32_t arrived = MapToBlock(SharedAddress(&s.winners_arrived), 0);
    ForEachTaken(keys, taken, [&](int slot, int32_t column, uint32_t key) {
      PushWord(MapToBlock(SharedAddress(&s.staged.columns[slot]), 0), arrived,
               static_cast<uint32_t>(column));
      PushWord(MapToBlock(SharedAddress(&s.staged.keys[slot]), 0), arrived, key);
    });
    Stamp(12);
    if (part == 0) {
      MbarrierWaitFirstPhase(&s.winners_arrived);  // block 0 holds the row's winners
      StoreStagedWinners<kThreads, kSorted>(s.staged, s.sort, output, k, selected);
    }
    Stamp(13);
  }
#endif
}

template <ScoreType kType, int kElems, bool kSorted>
const void* KernelFor() {
  return reinterpret_cast<const void*>(&TopkF32ClusterKernel<kType, kElems, kSorted>);
}

// The instances a score type has: keys a thread in ascending order (float32 rows 4 to 32;
// 16-bit rows, read 8 columns a load, 8 to 24), unsorted or sorted; the first null ends a list.
constexpr int kMaxInstances = 5;
struct Instances {
  int elems[kMaxInstances];
  const void* kernels[2][kMaxInstances];  // [sorted][i]
};
template <ScoreType kType>
Instances InstancesOf() {
  if constexpr (kType == ScoreType::kFloat32) {
    return {
        {4, 8, 16, 24, 32},
        {{KernelFor<kType, 4, false>(), KernelFor<kType, 8, false>(), KernelFor<kType, 16, false>(),
          KernelFor<kType, 24, false>(), KernelFor<kType, 32, false>()},
         {KernelFor<kType, 4, true>(), KernelFor<kType, 8, true>(), KernelFor<kType, 16, true>(),
          KernelFor<kType, 24, true>(), KernelFor<kType, 32, true>()}}};
  } else {
    return {{8, 16, 24, 0, 0},
            {{KernelFor<kType, 8, false>(), KernelFor<kType, 16, false>(),
              KernelFor<kType, 24, false>(), nullptr, nullptr},
             {KernelFor<kType, 8, true>(), KernelFor<kType, 16, true>(),
              KernelFor<kType, 24, true>(), nullptr, nullptr}}};
  }
}
Instances InstancesFor(ScoreType type) {
  switch (type) {
    case ScoreType::kBfloat16:
      return InstancesOf<ScoreType::kBfloat16>();
    case ScoreType::kFloat16:
      return InstancesOf<ScoreType::kFloat16>();
    default:
      return InstancesOf<ScoreType::kFloat32>();
  }
}

// The widest row of a score type a cluster of `parts` blocks holds.
int64_t MaxWidthFor(ScoreType type, int parts) {
  const int elems = type == ScoreType::kFloat32 ? kMaxElemsPerThread : kMaxElemsPerThread16;
  return int64_t{parts} * kThreads * elems;
}

// A block's shared memory, padded past half an SM's (228 KB) so that a cluster's blocks are
// always on distinct SMs (each then has an SM's load bandwidth): the narrower kernels use 40-64
// registers a thread, which would let two or three blocks share an SM.
constexpr int kSharedBytes =
    static_cast<int>(sizeof(ClusterShared) > 116 * 1024 ? sizeof(ClusterShared) : 116 * 1024);

cudaLaunchConfig_t ClusterConfig(int64_t grid, int parts, int shared_bytes, cudaStream_t stream,
                                 cudaLaunchAttribute& attribute) {
  return ClusterLaunchConfig(grid, parts, kThreads, static_cast<size_t>(shared_bytes), stream,
                             attribute);
}

// What the host plans a launch by, for one device: its SMs, and how many clusters of each size
// it holds at once, resident[parts] for 2 to kMaxParts blocks (0: it cannot launch that size),
// with the kernels' attributes set.
struct DevicePlan {
  int sms = 0;
  int resident[kMaxParts + 1] = {};
};

DevicePlan ComputePlan(int device) {
  DevicePlan plan;
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      major < 9 ||
      cudaDeviceGetAttribute(&plan.sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    cudaGetLastError();
    return {};
  }
  const int shared_bytes = kSharedBytes;
  constexpr int kMaxKernels = 3 * 2 * kMaxInstances;
  const void* kernels[kMaxKernels] = {};
  int kernel_count = 0;
  for (const ScoreType type : {ScoreType::kFloat32, ScoreType::kBfloat16, ScoreType::kFloat16}) {
    const Instances instances = InstancesFor(type);
    for (int sorted = 0; sorted < 2; ++sorted) {
      for (const void* kernel : instances.kernels[sorted]) {
        if (kernel != nullptr) kernels[kernel_count++] = kernel;
      }
    }
  }
  // A build for older targets only, JIT-compiled here, has empty kernels: no plan.
  for (int i = 0; i < kernel_count; ++i) {
    if (!KernelHasClusterCode(kernels[i])) return {};
  }
  bool non_portable = true;
  for (int i = 0; i < kernel_count; ++i) {
    cudaFuncSetAttribute(kernels[i], cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes);
    non_portable &= cudaFuncSetAttribute(kernels[i], cudaFuncAttributeNonPortableClusterSizeAllowed,
                                         1) == cudaSuccess;
  }
  cudaGetLastError();  // a refused attribute is not sticky: clear it
  // The fewest clusters any instance holds (they differ only in registers).
  const auto resident = [&](int parts) {
    int fewest = INT_MAX;
    for (int i = 0; i < kernel_count; ++i) {
      cudaLaunchAttribute attribute;
      const cudaLaunchConfig_t config =
          ClusterConfig(parts, parts, shared_bytes, nullptr, attribute);
      int clusters = 0;
      if (cudaOccupancyMaxActiveClusters(&clusters, kernels[i], &config) != cudaSuccess) {
        clusters = 0;
      }
      fewest = min(fewest, clusters);
    }
    cudaGetLastError();
    return fewest;
  };
  for (int parts = 2; parts <= kMaxParts; ++parts) {
    plan.resident[parts] = parts <= kPortableParts || non_portable ? resident(parts) : 0;
  }
  return plan;
}

// ComputePlan(device), once per device.
DevicePlan PlanFor(int device) {
  constexpr int kMaxCachedDevices = 64;
  static std::mutex mutex;
  static DevicePlan plans[kMaxCachedDevices];
  static bool known[kMaxCachedDevices] = {};
  if (device < 0 || device >= kMaxCachedDevices) return ComputePlan(device);
  const std::lock_guard<std::mutex> lock(mutex);
  if (!known[device]) {
    plans[device] = ComputePlan(device);
    known[device] = true;
  }
  return plans[device];
}

// "off", "always", "only" or unset (nullptr) from the environment, read at each launch.
const char* Mode(const char* name) {
  const char* mode = std::getenv(name);
  if (mode != nullptr && std::strcmp(mode, "off") == 0) return "off";
  if (mode != nullptr && std::strcmp(mode, "always") == 0) return "always";
  if (mode != nullptr && std::strcmp(mode, "only") == 0) return "only";
  return nullptr;
}

// The blocks a row: the most, from 16 down to 8, whose clusters for every row are resident at
// once and hold the row (on the H200 fewer than 8 clusters of 10 to 16 blocks are, but 8 rows of
// 9 blocks: benches/NOTES.md "16-bit rows on the cluster kernel"); where none is, 16 for rows
// that 8 blocks cannot hold, else 8.
// JAX_TOPK_F32_CLUSTER_PARTS=2 to 16 forces a size (benchmarks, tests). 0: none that launches
// here (or holds the row). `waves`: how many times over the device's resident clusters the
// rows' clusters run (1: all at once).
int PartsFor(const TopkProblem& problem, const DevicePlan& plan, int64_t& waves) {
  const auto holds = [&](int parts) {
    return plan.resident[parts] > 0 && problem.width <= MaxWidthFor(problem.score_type, parts);
  };
  const char* forced = std::getenv("JAX_TOPK_F32_CLUSTER_PARTS");
  int parts = 0;
  if (forced != nullptr) {
    const int asked = std::atoi(forced);
    parts = asked >= 2 && asked <= kMaxParts && holds(asked) ? asked : 0;
  } else {
    for (int most = kMaxParts; most >= kPortableParts && parts == 0; --most) {
      if (holds(most) && plan.resident[most] >= problem.rows) parts = most;
    }
    if (parts == 0) {
      parts = holds(kPortableParts) ? kPortableParts : (holds(kMaxParts) ? kMaxParts : 0);
    }
  }
  const int resident = parts > 0 ? plan.resident[parts] : 0;
  waves = resident > 0 ? (problem.rows + resident - 1) / resident : 0;
  return parts;
}

// A block's slice of a row over `parts` blocks: whole 16-byte chunks of the row's type (4 or 8
// columns); and the keys a thread that covers.
int64_t SliceColumns(const TopkProblem& problem, int parts) {
  const int64_t chunk = problem.score_type == ScoreType::kFloat32 ? 4 : 8;
  return (problem.width + chunk * parts - 1) / (chunk * parts) * chunk;
}
int ElemsPerThread(const TopkProblem& problem, int parts) {
  return static_cast<int>((SliceColumns(problem, parts) + kThreads - 1) / kThreads);
}

// The launch of the fewest keys a thread that cover a slice (the caller checked the width).
void Launch(const TopkProblem& problem, int parts, cudaStream_t stream) {
  const Instances instances = InstancesFor(problem.score_type);
  const int64_t slice = SliceColumns(problem, parts);
  const int elems = ElemsPerThread(problem, parts);
  int chosen = 0;
  while (chosen + 1 < kMaxInstances && instances.elems[chosen] < elems &&
         instances.kernels[0][chosen + 1] != nullptr) {
    ++chosen;
  }
  const void* kernel = instances.kernels[problem.sorted ? 1 : 0][chosen];
  cudaLaunchAttribute attribute;
  const cudaLaunchConfig_t config =
      ClusterConfig(problem.rows * parts, parts, kSharedBytes, stream, attribute);
  const int slice_columns = static_cast<int>(slice);
  void* arguments[] = {const_cast<TopkProblem*>(&problem), const_cast<int*>(&slice_columns)};
  cudaLaunchKernelExC(&config, kernel, arguments);
}

}  // namespace

bool TopkF32ClusterForced() {
  const char* mode = Mode("JAX_TOPK_F32_CLUSTER");
  return mode != nullptr && std::strcmp(mode, "off") != 0;
}

bool TopkF32ClusterRequired() {
  const char* mode = Mode("JAX_TOPK_F32_CLUSTER");
  return mode != nullptr && std::strcmp(mode, "only") == 0;
}

bool TopkF32ClusterServes(const TopkProblem& problem) {
  if (problem.width > MaxWidthFor(problem.score_type, kMaxParts) || problem.rows < 1) {
    return false;
  }
  // Benchmarks and tests: "off", or "always" / "only" (every call it can take), read at each
  // launch. A choice made for topk_f32_rows (JAX_TOPK_F32_ROWS) is left to it.
  const char* mode = Mode("JAX_TOPK_F32_CLUSTER");
  if (mode != nullptr && std::strcmp(mode, "off") == 0) return false;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  const DevicePlan plan = PlanFor(device);
  int64_t waves = 0;
  const int parts = PartsFor(problem, plan, waves);
  if (parts == 0 || problem.rows > INT_MAX / parts) return false;
  if (mode != nullptr) return true;
  if (problem.width <= 8192) return false;  // not measured against the kernels that serve them
  if (problem.score_type != ScoreType::kFloat32) {
    // Measured on the H200 (benches/NOTES.md "16-bit rows on the cluster kernel"): the filtered
    // kernel takes 13-25 us on 1 to 16 16-bit rows of 16384 to 196608 columns, this kernel 7.5 to
    // 10.4 us a wave, sorted k = 2048 included; a second wave still wins at 16 keys a thread
    // (8 x 131072: 18.9 against 24.3 us) and loses at 24 (8 x 152064: 20.1 against 18.6).
    return waves == 1 || (waves == 2 && ElemsPerThread(problem, parts) <= 16);
  }
  if (Mode("JAX_TOPK_F32_ROWS") != nullptr) return false;
  // Measured on the H200 (benches/NOTES.md "topk_f32_cluster", "16-bit rows on the cluster
  // kernel"): faster with every row's cluster at once and at most 24 keys a thread (16 blocks:
  // 1 x 16384 to 1 x 152064, 4 x 32768; 8 blocks: 12 x 65536, 10.0 against 13.7 us); a second
  // wave, 32 keys a thread (1 x 262144; 8 x 131072 on 9 blocks, 13.4 against 14.6 us, too close
  // to take), rows of at most 8192 columns (topk_f32_rows') and the block radix sort of more than
  // 256 winners lose.
  if (problem.sorted && problem.k > kMaxRankedByCount) return false;
  return waves == 1 && ElemsPerThread(problem, parts) <= kMostServedElems;
}

cudaError_t LaunchTopkF32Cluster(const TopkProblem& problem, cudaStream_t stream) {
  if (problem.rows == 0) return cudaSuccess;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return cudaErrorInvalidDevice;
  int64_t waves = 0;
  const int parts = problem.rows > 0 ? PartsFor(problem, PlanFor(device), waves) : 0;
  if (parts == 0 || problem.rows > INT_MAX / parts || problem.width < 1 ||
      problem.width > MaxWidthFor(problem.score_type, parts) || problem.k < 1 ||
      problem.k > kMaxK || (problem.num_valid_rows != nullptr && problem.rows_per_group < 1)) {
    return cudaErrorInvalidValue;
  }
  Launch(problem, parts, stream);
  return cudaGetLastError();
}

}  // namespace jax_topk
