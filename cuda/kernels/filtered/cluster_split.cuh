// Split mode: a row per thread block cluster; part p of its blocks filters columns
// [begin_p, end_p) into its own sink. The parts add up their candidates' relative-bin histograms
// through distributed shared memory, one warp in each ranks the few candidates of the k-th key's
// bin, and every part writes its own winners, in column order, after the winners of the parts
// before it. An underfilled primary is retried by every part with the secondary cutoff. A row
// this does not settle (a crowded k-th bin, sorted results, cutoffs that keep everything) is
// merged into part 0 when its candidates fit there, else done whole by part 0 (re-filtered, or
// the exact route).
//
// Contract: RunClusterPart is called by every thread of every block of a split launch (a cluster
// of `parts` blocks per row). Every branch around a cluster barrier (cluster.sync, or
// barrier_arrive/barrier_wait around the final writes) is taken alike by all the cluster's
// blocks. Owns s.cluster; other parts read this part's s.kept, s.hist, s.candidates and
// s.cluster.{super, boundary} between the cluster barriers that bracket those reads.
#pragma once

#include "kernels/filtered/row_runner.cuh"

namespace jax_topk {
namespace {

// Thread block clusters need sm_90: for older targets the split kernel compiles empty, and the
// host, which asks the kernel what its code was compiled for, never launches it (MaxSplitParts).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define JAX_TOPK_HAS_CLUSTERS 1
#else
#define JAX_TOPK_HAS_CLUSTERS 0
#endif
#if JAX_TOPK_HAS_CLUSTERS

// Zeroes s.hist (each thread its BinOf bins).
__device__ __forceinline__ void ClearHistogram(SharedStorage& s) {
#pragma unroll
  for (int j = 0; j < kBinsPerThread; ++j) s.hist[BinOf(j)] = 0;
}

// Starts a row of a split launch.
__device__ __forceinline__ void StartJob(SharedStorage& s, const TopkProblem& problem,
                                         int64_t row) {
  if (threadIdx.x == 0) PublishJob(s, row, RowLength(problem, row));
  __syncthreads();
}

// The first column of `part` (parts: the row's end); rounded down to 32 columns (bitmap words).
__device__ __forceinline__ int PartBegin(int64_t length, int part, int parts) {
  return part == parts ? static_cast<int>(length)
                       : static_cast<int>((length * part / parts) & ~int64_t{31});
}

// Reads every part's kept count (after a cluster barrier): s.cluster's total, overflow and
// part_offset (where each part's candidates go when merged).
__device__ __forceinline__ void TallyCluster(SharedStorage& s, const cg::cluster_group& cluster,
                                             int parts, int capacity) {
  if (threadIdx.x < kWarpSize) {
    const int lane = threadIdx.x;
    const int kept = lane < parts ? *cluster.map_shared_rank(&s.kept, lane) : 0;
    const int inclusive = WarpInclusiveSum(kept);  // <= the row's length
    const bool overflow = __any_sync(kFullMask, kept > capacity);
    if (lane < parts) s.cluster.part_offset[lane] = static_cast<uint32_t>(inclusive - kept);
    if (lane == kWarpSize - 1) {
      s.cluster.total = static_cast<uint32_t>(inclusive);
      s.cluster.overflow = overflow;
    }
  }
  __syncthreads();
}

// This part's candidates per super-bin, for the other parts (after RelativeHistogram).
__device__ __forceinline__ void PublishSuperBins(SharedStorage& s) {
  const int lane = threadIdx.x % kWarpSize;
  for (int super = threadIdx.x / kWarpSize; super < kSuperBins; super += kWarpsPerBlock) {
    const uint32_t count = __reduce_add_sync(kFullMask, s.hist[super * kWarpSize + lane]);
    if (lane == 0) s.cluster.super[super] = count;
  }
}

// Adds part q's count to a cluster-wide and, for parts before this one, an earlier-parts tally.
__device__ __forceinline__ void AddPartCount(uint32_t* sum, uint32_t* before, int q, int part,
                                             uint32_t count) {
  if (count == 0) return;
  atomicAdd(sum, count);
  if (q < part) atomicAdd(before, count);
}

// Finds the bin of the rank-th largest candidate over the cluster (rank <= the cluster's total;
// after a cluster barrier that follows every part's PublishSuperBins): s.cluster's kth_bin,
// own_above and above_before. The super-bins of every part first, then the 32 bins of the one
// holding the rank, each part's kept in s.cluster.bins_of_part.
__device__ __forceinline__ void FindClusterRank(SharedStorage& s, const cg::cluster_group& cluster,
                                                int parts, int part, uint32_t rank) {
  static_assert(kSuperBins * kMaxClusterParts <= 2 * kThreadsPerBlock, "two super-bins a thread");
  static_assert(kWarpSize * kMaxClusterParts <= kThreadsPerBlock, "one bin a thread");
  const int lane = threadIdx.x % kWarpSize;
  const bool first_warp = threadIdx.x < kWarpSize;
  uint32_t counts[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {  // both loads first
    const int item = threadIdx.x + kThreadsPerBlock * i;
    counts[i] = item < kSuperBins * parts
                    ? cluster.map_shared_rank(s.cluster.super, item / kSuperBins)[item % kSuperBins]
                    : 0u;
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int item = threadIdx.x + kThreadsPerBlock * i;
    AddPartCount(&s.cluster.super_sum[item % kSuperBins],
                 &s.cluster.super_before[item % kSuperBins], item / kSuperBins, part, counts[i]);
  }
  __syncthreads();
  // One warp finds the super-bin, two a lane, the top ones first.
  if (first_warp) {
    const int high = kSuperBins - 1 - 2 * lane;
    const uint32_t in_high = s.cluster.super_sum[high];
    const uint32_t in_pair = in_high + s.cluster.super_sum[high - 1];
    const uint32_t above_pair =
        static_cast<uint32_t>(WarpInclusiveSum(static_cast<int>(in_pair))) - in_pair;
    const bool holds = above_pair < rank && rank <= above_pair + in_pair;
    const int holder = __ffs(__ballot_sync(kFullMask, holds)) - 1;
    const bool in_high_bin = __shfl_sync(kFullMask, above_pair + in_high, holder) >= rank;
    const int super = kSuperBins - 1 - 2 * holder - (in_high_bin ? 0 : 1);
    const uint32_t above =
        __shfl_sync(kFullMask, in_high_bin ? above_pair : above_pair + in_high, holder);
    // The earlier parts' and this part's candidates in the super-bins above it.
    const bool high_above = high > super;
    const bool low_above = high - 1 > super;
    const uint32_t before =
        __reduce_add_sync(kFullMask, (high_above ? s.cluster.super_before[high] : 0u) +
                                         (low_above ? s.cluster.super_before[high - 1] : 0u));
    const uint32_t own =
        __reduce_add_sync(kFullMask, (high_above ? s.cluster.super[high] : 0u) +
                                         (low_above ? s.cluster.super[high - 1] : 0u));
    if (lane == 0) {  // kth_bin holds the super-bin until the bin is found below
      s.cluster.kth_bin = {static_cast<uint32_t>(super), above, 0};
      s.cluster.above_before = before;
      s.cluster.own_above = own;
    }
  }
  __syncthreads();
  const int super = static_cast<int>(s.cluster.kth_bin.bin);
  if (threadIdx.x < kWarpSize * parts) {  // part q's bin of the super-bin, top first
    const int q = threadIdx.x / kWarpSize;
    s.cluster.bins_of_part[q][lane] =
        cluster.map_shared_rank(s.hist, q)[super * kWarpSize + kWarpSize - 1 - lane];
  }
  __syncthreads();
  if (first_warp) {  // lane l: the super-bin's l-th bin from the top
    uint32_t in_bin = 0;
    uint32_t before = 0;
    for (int q = 0; q < parts; ++q) {
      const uint32_t count = s.cluster.bins_of_part[q][lane];
      in_bin += count;
      before += q < part ? count : 0u;
    }
    const uint32_t own = s.cluster.bins_of_part[part][lane];
    const uint32_t remaining = rank - s.cluster.kth_bin.above;  // in [1, the super-bin's count]
    const uint32_t above =
        static_cast<uint32_t>(WarpInclusiveSum(static_cast<int>(in_bin))) - in_bin;
    const int holder =
        __ffs(__ballot_sync(kFullMask, above < remaining && remaining <= above + in_bin)) - 1;
    const bool bin_above = lane < holder;
    const uint32_t before_above = __reduce_add_sync(kFullMask, bin_above ? before : 0u);
    const uint32_t own_above = __reduce_add_sync(kFullMask, bin_above ? own : 0u);
    __syncwarp();  // every lane has read s.cluster.kth_bin before the holder rewrites it
    if (lane == holder) {
      const uint32_t bin = static_cast<uint32_t>(super * kWarpSize + kWarpSize - 1 - lane);
      s.cluster.kth_bin = {bin, s.cluster.kth_bin.above + above, in_bin};
      s.cluster.above_before += before_above;
      s.cluster.own_above += own_above;
    }
  }
  __syncthreads();
}

// One warp ranks the members of s.cluster.kth_bin in every part (at most a warp's worth):
// s.cluster gets the k-th key, the last column of it that wins, and how many winning members lie
// in the parts before this one and in this one. Columns are distinct, so ties order strictly.
__device__ __forceinline__ void RankClusterBoundary(SharedStorage& s,
                                                    const cg::cluster_group& cluster, int parts,
                                                    int part, int k) {
  const int group = static_cast<int>(s.cluster.kth_bin.count);
  const int remaining = k - static_cast<int>(s.cluster.kth_bin.above);
  if (threadIdx.x >= kWarpSize) return;
  const int lane = threadIdx.x;
  // The bin's slot in bins_of_part (see FindClusterRank).
  const int slot = kWarpSize - 1 - static_cast<int>(s.cluster.kth_bin.bin % kWarpSize);
  const int count = lane < parts ? static_cast<int>(s.cluster.bins_of_part[lane][slot]) : 0;
  const int first = WarpInclusiveSum(count) - count;  // lane q: part q's first member
  int holder = 0;                                     // the part holding member `lane`
  for (int q = 1; q < parts; ++q) holder = __shfl_sync(kFullMask, first, q) <= lane ? q : holder;
  const int holder_first = __shfl_sync(kFullMask, first, holder);
  uint2 member = make_uint2(0, 0);
  if (lane < group)
    member = cluster.map_shared_rank(s.cluster.boundary, holder)[lane - holder_first];
  const uint32_t key = lane < group ? OrderedKeyF32(member.x) : 0u;
  const WarpRank r = RankInWarp<true>(key, member.y, group);
  const int equal_before = r.equal_before;  // members of this key at lower columns
  const bool holds_rank = lane < group && r.greater < remaining && remaining <= r.greater + r.equal;
  // remaining is in [1, group]: some lane holds it.
  const int kth_lane = __ffs(__ballot_sync(kFullMask, holds_rank)) - 1;
  const uint32_t kth_key = __shfl_sync(kFullMask, key, kth_lane);
  const int quota = remaining - __shfl_sync(kFullMask, r.greater, kth_lane);
  const bool all_ties_win = quota == __shfl_sync(kFullMask, r.equal, kth_lane);
  const bool wins = lane < group && (key > kth_key || (key == kth_key && equal_before < quota));
  const bool last_tie = lane < group && key == kth_key && equal_before == quota - 1;
  const uint32_t last_tie_col =
      __shfl_sync(kFullMask, member.y, __ffs(__ballot_sync(kFullMask, last_tie)) - 1);
  const uint32_t wins_before = __ballot_sync(kFullMask, wins && holder < part);
  const uint32_t wins_mine = __ballot_sync(kFullMask, wins && holder == part);
  if (lane == 0) {
    s.cluster.kth_key = kth_key;
    s.cluster.column_limit = all_ties_win ? 0xFFFFFFFFu : last_tie_col;
    s.cluster.members_before = __popc(wins_before);
    s.cluster.members_mine = __popc(wins_mine);
  }
}

// The row settled: s.cluster.kth_bin, the k-th key's bin over the cluster, holds at most a warp's
// worth of candidates. Ranks them and writes this part's winners after the earlier parts'.
__device__ __forceinline__ void FinishSettledRow(SharedStorage& s, const FilteredLaunch& launch,
                                                 const cg::cluster_group& cluster, int parts,
                                                 int part, int begin, int end,
                                                 const CandidateSource& mine,
                                                 const RelativeBins& bins) {
  const uint32_t kth_bin = s.cluster.kth_bin.bin;
  CompactCandidates(
      mine, &s.cluster.boundary_count,
      [&](uint32_t bits, int32_t) { return bins(OrderedKeyF32(bits)) == kth_bin; },
      [&](int position, uint2 c) { s.cluster.boundary[position] = c; });  // position < kWarpSize
  cluster.sync();  // members published; no part reads another's histogram any more
  ClearHistogram(s);
  RankClusterBoundary(s, cluster, parts, part, launch.problem.k);
  __syncthreads();
  ProbeStamp(s, kPhaseSelect);
  ProbeCount(s, kCountSettled);
  cluster.barrier_arrive();  // done reading the other parts' shared memory
  const Wins wins{s.cluster.kth_key, s.cluster.column_limit};
  const int m = static_cast<int>(s.cluster.own_above + s.cluster.members_mine);
  const int first_slot = static_cast<int>(s.cluster.above_before + s.cluster.members_before);
  const int span = end - begin;
  // The bitmap holds columns only: values come with the winners gathered in s.work.selected.
  const bool by_bitmap = span <= kBitmapColumns && launch.problem.values == nullptr;
  if (by_bitmap) {
    MarkWinners(s, mine, wins, begin, span);
  } else {
    GatherWinners(s, mine, wins);
  }
  ProbeStamp(s, kPhasePut);
  WriteWinners(s, launch.problem, m, first_slot, begin, span, by_bitmap, false);
  cluster.barrier_wait();  // no part leaves while another may still read its shared memory
  ProbeStamp(s, kPhaseWrite);
}

// The part holding merged entry `entry` (s.cluster.part_offset is non-decreasing).
__device__ __forceinline__ int PartHolding(const SharedStorage& s, uint32_t entry, int parts) {
  int part = 0;
#pragma unroll
  for (int step = kMaxClusterParts / 2; step > 0; step /= 2) {
    if (part + step < parts && s.cluster.part_offset[part + step] <= entry) part += step;
  }
  return part;
}

// Part 0 copies the other parts' candidates (all in their shared memory) after its own.
__device__ __forceinline__ void MergeIntoPartZero(SharedStorage& s,
                                                  const cg::cluster_group& cluster, int parts) {
  constexpr int kBatch = 8;  // remote loads a thread has in flight
  const uint32_t total = s.cluster.total;
  for (uint32_t base = s.cluster.part_offset[1]; base < total; base += kBatch * kThreadsPerBlock) {
    uint2 entries[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const uint32_t entry = base + kThreadsPerBlock * i + threadIdx.x;
      if (entry < total) {
        const int holder = PartHolding(s, entry, parts);
        entries[i] =
            cluster.map_shared_rank(s.candidates, holder)[entry - s.cluster.part_offset[holder]];
      }
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const uint32_t entry = base + kThreadsPerBlock * i + threadIdx.x;
      if (entry < total) s.candidates[entry] = entries[i];
    }
  }
  __syncthreads();
}

// One part of a row's cluster. Every branch around a cluster barrier is taken alike by all the
// cluster's blocks: it depends only on the row, the sample (the same in every part) and tallies
// over the whole cluster.
template <class Elements>
__device__ __forceinline__ void RunClusterPart(SharedStorage& s, const FilteredLaunch& launch) {
  const cg::cluster_group cluster = cg::this_cluster();
  const int parts = static_cast<int>(cluster.num_blocks());
  const int part = static_cast<int>(cluster.block_rank());
  const TopkProblem& problem = launch.problem;
  StartJob(s, problem, blockIdx.x / parts);
  if (s.job.length <= kSharedCandidates) {  // masked, empty or short: no sample, one block
    // No sample: the cutoffs keep all.
    if (part == 0) RunRow<Elements>(s, launch, kRankSlack, [] {});
    return;
  }
  ProbeStamp(s, kPhaseQueue);
  ProbeCount(s, kCountRows);  // a part: the probe's means are per block of a split row
  const int begin = PartBegin(s.job.length, part, parts);
  const int end = PartBegin(s.job.length, part + 1, parts);
  SampleJobCutoffs<Elements>(s, problem, kRankSlack, begin, end);  // the same cutoffs in every part
  ProbeStamp(s, kPhaseSample);
  const typename Elements::Storage* row = JobScores<Elements>(s, problem);
  const CandidateSink sink{kSharedCandidates, WorkerSlice(launch), launch.slice_entries};
  Route route = Route::kPrimary;  // a band: kPrimary, then kSecondary
  uint32_t cutoff;
  bool short_of_k;
  for (;; route = Route::kSecondary) {
    cutoff = RouteCutoff(s.job, route);
    const int kept = FilterColumns<Elements>(s, row, begin, end, KeepThreshold(cutoff), sink);
    ProbeStamp(s, kPhasePass);
    ProbeCount(s, kCountKept, kept);
    if (route == Route::kSecondary) ProbeCount(s, kCountSecondary);
    if (threadIdx.x == 0) s.cluster.boundary_count = 0;
    if (threadIdx.x < kSuperBins)
      s.cluster.super_sum[threadIdx.x] = s.cluster.super_before[threadIdx.x] = 0;
    const CandidateSource mine{s.candidates, sink.shared_capacity, sink.global,
                               min(kept, sink.Capacity())};
    // Sorted results are ordered by key over the whole row: part 0 does that (below).
    const bool relative = !problem.sorted && RelativeBins::Usable(cutoff, s.sample_largest);
    const RelativeBins bins(cutoff, relative ? s.sample_largest : cutoff);
    if (relative && kept <= sink.Capacity()) {
      RelativeHistogram(s, mine, bins);
      PublishSuperBins(s);
    }
    cluster.sync();  // kept counts and histograms published
    TallyCluster(s, cluster, parts, sink.Capacity());
    short_of_k = !s.cluster.overflow && s.cluster.total < static_cast<uint32_t>(problem.k) &&
                 !KeepsAll(cutoff);
    if (relative && !s.cluster.overflow && s.cluster.total >= static_cast<uint32_t>(problem.k)) {
      FindClusterRank(s, cluster, parts, part, static_cast<uint32_t>(problem.k));
      ProbeStamp(s, kPhaseClaim);
      // Not the edge bins here: a crowded edge bin (the one that matters) is never a warp's.
      if (RelativeBins::Settles(s.cluster.kth_bin, /*edges=*/false)) {
        FinishSettledRow(s, launch, cluster, parts, part, begin, end, mine, bins);
        return;
      }
    }
    cluster.sync();  // no part reads another's histogram any more
    ClearHistogram(s);
    __syncthreads();  // the histogram is zero before its next use
    // Short of k: every part re-reads its columns with the deeper cutoff, once.
    if (!short_of_k || route == Route::kSecondary ||
        s.job.cutoffs.secondary == s.job.cutoffs.primary)
      break;
  }
  // Not settled by the cluster: part 0 selects over the cluster's candidates, merged into its
  // shared memory when they fit and certify the row; else it re-reads the row with the same
  // cutoff (its own sink holds twice what fits in shared memory), or, short of k or when a part
  // overflowed, takes the exact route.
  const uint32_t total = s.cluster.total;
  const bool merged = !s.cluster.overflow && total <= kSharedCandidates &&
                      (total >= static_cast<uint32_t>(problem.k) || KeepsAll(cutoff));
  if (merged) {
    if (part == 0) MergeIntoPartZero(s, cluster, parts);
    cluster.sync();  // no part leaves while part 0 reads its candidates
    ProbeCount(s, kCountMerged);
  }
  ProbeStamp(s, kPhaseClaim);
  if (part != 0) return;
  int m;
  if (merged) {
    m = SelectKept<Elements>(s, sink, problem.k, cutoff, static_cast<int>(total),
                             JobWinnersTo(s, problem));
  } else {
    m = SelectJobRow<Elements>(s, launch, s.cluster.overflow || short_of_k ? Route::kExact : route);
  }
  WriteRow(s, problem, m);
  ProbeStamp(s, kPhaseWrite);
}

#endif  // JAX_TOPK_HAS_CLUSTERS

}  // namespace
}  // namespace jax_topk
