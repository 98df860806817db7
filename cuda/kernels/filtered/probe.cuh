// The probe build's switches and phase stamps (benches/probes/filtered_phases.py): with
// JAX_TOPK_FILTERED_PROBE defined (a CMake option of the same name), the launch reads the
// environment variable JAX_TOPK_FILTERED_PROBE (a sum of ProbeFlag values) and the kernel can run
// the loops and selection steps a measured change replaced, so that one build times old against
// new, and thread 0 of each block adds the time of each phase of its rows (globaltimer ns) and
// counts of the routes taken to device counters, which the last block of the launch prints and
// clears. In every other build each function here is a no-op and the flags read false.
//
// Contract: the functions are called by every thread (only thread 0 acts); s.probe and
// s.probe_last are written by thread 0 at the kernel's start, before its first barrier.
#pragma once

#include <cstdio>

#include "kernels/filtered/layout.cuh"
#include "kernels/global_timer.cuh"

namespace jax_topk {
namespace {

enum ProbeFlag : int {
  kProbeOld16BitLoop = 1,     // the 16-bit filtering tile widened a value at a time
  kProbeStamps = 2,           // phase stamps and route counts, printed by the launch's last block
  kProbeOldSelection = 4,     // crowded bins and tie groups of 33+ by radix digits only
  kProbeOldBinEdges = 8,      // the first and last relative bins never settle the k-th key
  kProbeOldBuckets = 16,      // rank-order buckets by key - lowest key, never by dense key ranks
  kProbeOldPassReads = 32,    // every queue pass prefetched, none staged or plain (PassReads)
  kProbeOldMarks = 64,        // a crowded one-key bin of bitmap winners ranked, not marked at once
  kProbeStreamOnly = 128,     // a row's primary pass, then no selection: its result empty
  kProbeOldFewWinners = 256,  // k <= 64 of a few kept candidates by the radix route
};

enum ProbePhase : int {
  kPhaseQueue,         // from the last stamp (the previous row's end) to a row's start
  kPhaseSampleLoads,   // the sample's loads, as warp 0 waits for its own
  kPhaseSampleCoarse,  // the sample's first histogram and search (and the other warps' loads)
  kPhaseSample,        // the sample's second histogram and search (the cutoffs)
  kPhaseClaim,         // the queue's next row (its claim and length) after the sample; in a
                       // split row, the cluster's tallies, histograms and rank search, or the
                       // merge into part 0
  kPhasePass,          // every filtering pass of the row
  kPhaseSelect,        // the k-th key and the tie quota over the candidates
  kPhasePut,           // winners marked or gathered
  kPhaseExact,         // the exact route (selection over the row and its winners)
  kPhaseWrite,         // ordering and writing the winners
  kPhaseTail,          // from the last row's end to the block's exit
  kProbePhases
};

enum ProbeCounter : int {
  kCountRows,
  kCountSecondary,    // rows that took the secondary band
  kCountExact,        // rows that took the exact route
  kCountWarpRank,     // k-th key ranked by one warp in its relative bin
  kCountBlockRank,    // ... by the block (33 to kBlockRankMembers members)
  kCountOneKeyBin,    // ... read off a crowded bin of one key
  kCountGatheredBin,  // ... of those, with the winners gathered in the same pass
  kCountMarkedBin,    // ... or marked in the same pass
  kCountDigitRank,    // ... by three radix digits
  kCountTieBlock,     // tie quota by the block
  kCountTieBitmap,    // tie quota by a bitmap of the tie group's columns
  kCountTieDigits,    // tie quota by three radix digits
  kCountBucketSpill,  // sorted rows whose rank-order buckets overflowed to the radix sort
  kCountDenseRanks,   // sorted rows whose buckets took dense key ranks
  kCountKept,         // candidates of the band taken, summed over rows (split rows: parts)
  kCountSettled,      // parts of split rows settled by the cluster's rank (FinishSettledRow)
  kCountMerged,       // parts of split rows merged into part 0 (part 0 counted too)
  kProbeCounters
};

#if JAX_TOPK_FILTERED_PROBE
__device__ unsigned long long g_probe_ns[kProbePhases];
__device__ unsigned long long g_probe_counts[kProbeCounters];
__device__ unsigned int g_probe_blocks_done;
// The launch's block edges: the first start, the last start, the first end, the last end. The
// firsts are kept complemented, so that a zeroed word and atomicMax serve both.
__device__ unsigned long long g_probe_block_edges[4];
__device__ unsigned long long g_probe_block_lifetimes;  // summed over the blocks
__device__ unsigned long long g_probe_block_cycles;     // SM clock cycles, summed over the blocks
#endif

// Whether the launch asked for `flag` (always false outside the probe build).
__device__ __forceinline__ bool ProbeOn(const SharedStorage& s, ProbeFlag flag) {
#if JAX_TOPK_FILTERED_PROBE
  return (s.probe & flag) != 0;
#else
  (void)s;
  (void)flag;
  return false;
#endif
}

// Thread 0 records the launch's flags and the block's start.
__device__ __forceinline__ void ProbeStart(SharedStorage& s, int flags) {
#if JAX_TOPK_FILTERED_PROBE
  if (threadIdx.x == 0) {
    s.probe = flags;
    s.probe_last = GlobalTimerNs();
    s.probe_start = s.probe_last;
    s.probe_start_cycles = clock64();
    if (flags & kProbeStamps) {
      atomicMax(&g_probe_block_edges[0], ~s.probe_start);
      atomicMax(&g_probe_block_edges[1], s.probe_start);
    }
  }
#else
  (void)s;
  (void)flags;
#endif
}

// Adds the time since the last stamp to `phase`.
__device__ __forceinline__ void ProbeStamp(SharedStorage& s, ProbePhase phase) {
#if JAX_TOPK_FILTERED_PROBE
  if (threadIdx.x == 0 && (s.probe & kProbeStamps)) {
    const unsigned long long now = GlobalTimerNs();
    atomicAdd(&g_probe_ns[phase], now - s.probe_last);
    s.probe_last = now;
  }
#else
  (void)s;
  (void)phase;
#endif
}

__device__ __forceinline__ void ProbeCount(SharedStorage& s, ProbeCounter counter,
                                           unsigned long long by = 1) {
#if JAX_TOPK_FILTERED_PROBE
  if (threadIdx.x == 0 && (s.probe & kProbeStamps)) atomicAdd(&g_probe_counts[counter], by);
#else
  (void)s;
  (void)counter;
  (void)by;
#endif
}

// The block's exit: the last block of the launch prints the sums per row and clears them, and
// where the blocks started and ended: the launch's time outside every block's stamps (its start
// skew and its tail) is the gap between a call's device time and a block's summed phases.
__device__ __forceinline__ void ProbeFinish(SharedStorage& s) {
#if JAX_TOPK_FILTERED_PROBE
  ProbeStamp(s, kPhaseTail);
  if (threadIdx.x != 0 || !(s.probe & kProbeStamps)) return;
  const unsigned long long end = GlobalTimerNs();
  atomicMax(&g_probe_block_edges[2], ~end);
  atomicMax(&g_probe_block_edges[3], end);
  atomicAdd(&g_probe_block_lifetimes, end - s.probe_start);
  atomicAdd(&g_probe_block_cycles,
            static_cast<unsigned long long>(clock64() - s.probe_start_cycles));
  __threadfence();
  if (atomicAdd(&g_probe_blocks_done, 1u) != gridDim.x - 1) return;
  __threadfence();
  unsigned long long ns[kProbePhases];
  unsigned long long counts[kProbeCounters];
  for (int p = 0; p < kProbePhases; ++p) ns[p] = atomicExch(&g_probe_ns[p], 0ull);
  for (int c = 0; c < kProbeCounters; ++c) counts[c] = atomicExch(&g_probe_counts[c], 0ull);
  atomicExch(&g_probe_blocks_done, 0u);
  const double rows = counts[kCountRows] > 0 ? static_cast<double>(counts[kCountRows]) : 1.0;
  printf(
      "probe grid=%u rows=%llu us/row/block: queue %.2f sample loads %.2f, rest %.2f + %.2f "
      "claim %.2f pass %.2f "
      "select %.2f put %.2f exact %.2f write %.2f tail(total) %.1f | rows: secondary %llu "
      "exact %llu; rank warp %llu block %llu one-key bin %llu (gathered %llu, marked %llu) "
      "digits %llu; ties block %llu bitmap %llu digits %llu; dense-rank buckets %llu, spills "
      "%llu; kept/row %.0f; split parts settled %llu, merged %llu\n",
      gridDim.x, counts[kCountRows], ns[kPhaseQueue] / rows / 1e3,
      ns[kPhaseSampleLoads] / rows / 1e3, ns[kPhaseSampleCoarse] / rows / 1e3,
      ns[kPhaseSample] / rows / 1e3, ns[kPhaseClaim] / rows / 1e3, ns[kPhasePass] / rows / 1e3,
      ns[kPhaseSelect] / rows / 1e3, ns[kPhasePut] / rows / 1e3, ns[kPhaseExact] / rows / 1e3,
      ns[kPhaseWrite] / rows / 1e3, ns[kPhaseTail] / 1e3, counts[kCountSecondary],
      counts[kCountExact], counts[kCountWarpRank], counts[kCountBlockRank], counts[kCountOneKeyBin],
      counts[kCountGatheredBin], counts[kCountMarkedBin], counts[kCountDigitRank],
      counts[kCountTieBlock], counts[kCountTieBitmap], counts[kCountTieDigits],
      counts[kCountDenseRanks], counts[kCountBucketSpill], counts[kCountKept] / rows,
      counts[kCountSettled], counts[kCountMerged]);
  unsigned long long edges[4];
  for (int e = 0; e < 4; ++e) edges[e] = atomicExch(&g_probe_block_edges[e], 0ull);
  const unsigned long long first_start = ~edges[0];
  const unsigned long long lifetimes = atomicExch(&g_probe_block_lifetimes, 0ull);
  const unsigned long long cycles = atomicExch(&g_probe_block_cycles, 0ull);
  // The SM clock over the blocks' lifetimes: whether a slower launch ran at a lower clock.
  printf(
      "probe blocks=%u: starts over %.2f us, ends from %.2f to %.2f us after the first start, "
      "lifetime %.2f us on average, SM clock %.0f MHz\n",
      gridDim.x, (edges[1] - first_start) / 1e3, (~edges[2] - first_start) / 1e3,
      (edges[3] - first_start) / 1e3, lifetimes / 1e3 / gridDim.x,
      lifetimes > 0 ? 1e3 * static_cast<double>(cycles) / static_cast<double>(lifetimes) : 0.0);
#else
  (void)s;
#endif
}

}  // namespace
}  // namespace jax_topk
