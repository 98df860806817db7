// One row by one block: publish the job, take the sample, select through the cutoffs' routes
// (Route: the primary band, the secondary band, the exact route over the whole row) and write the
// winners. The queue worker runs every row through RunRow; a split launch runs its short rows
// through RunRow, and the rows its cluster does not settle through SelectJobRow (from a given
// route) or SelectKept (candidates merged by the cluster), then WriteRow.
//
// Contract: called by every thread of the block, after the job is published (PublishJob by thread
// 0, then a barrier). Uses all of SharedStorage but the mode's state; ends with WriteWinners'
// barrier, so that the next row may start at once.
#pragma once

#include "kernels/filtered/few_winners.cuh"
#include "kernels/filtered/filtering_pass.cuh"
#include "kernels/filtered/probe.cuh"
#include "kernels/filtered/sample.cuh"
#include "kernels/filtered/selection.cuh"
#include "kernels/filtered/winners.cuh"

namespace jax_topk {
namespace {

// What a launch passes every block.
struct FilteredLaunch {
  TopkProblem problem;
  unsigned long long* queue_next;  // the next row a worker takes (queue mode; zero at the launch)
  PassReads queue_reads;           // how a queue worker's passes read (the host's choice)
  uint2* slices;                   // [grid][slice_entries]
  int slice_entries;
#if JAX_TOPK_FILTERED_PROBE
  int probe;  // ProbeFlag values from the environment (probe.cuh)
#endif
};

// The row's valid length, or -1 when the row is masked out by num_valid_rows.
__device__ __forceinline__ int RowLength(const TopkProblem& problem, int64_t row) {
  if (!RowIsValid(row, problem.num_valid_rows, problem.rows_per_group)) return -1;
  if (problem.lengths == nullptr) return static_cast<int>(problem.width);
  return static_cast<int>(ClampLength(problem.lengths[row], problem.width));  // width <= INT_MAX
}

// This block's overflow slice: its own, so concurrent blocks never share one.
__device__ __forceinline__ uint2* WorkerSlice(const FilteredLaunch& launch) {
  return launch.slices + static_cast<int64_t>(blockIdx.x) * launch.slice_entries;
}

// Thread 0 publishes a row's index and length (-1: masked); a barrier must follow.
__device__ __forceinline__ void PublishJob(SharedStorage& s, int64_t row, int length,
                                           PassReads reads = PassReads::kPrefetched) {
  s.job.row = row;
  s.job.length = length;
  s.job.reads = ProbeOn(s, kProbeOldPassReads) ? PassReads::kPrefetched : reads;
  s.sample_largest = 0;
}

// The job's row of scores, elements of Elements::Storage.
template <class Elements>
__device__ __forceinline__ const typename Elements::Storage* JobScores(const SharedStorage& s,
                                                                       const TopkProblem& problem) {
  return static_cast<const typename Elements::Storage*>(problem.scores) + s.job.row * problem.width;
}

// The job's cutoffs; also pulls the start of columns [begin, end) into L2.
template <class Elements>
__device__ __forceinline__ void SampleJobCutoffs(SharedStorage& s, const TopkProblem& problem,
                                                 int rank_slack, int begin, int end) {
  const Cutoffs cutoffs = SampleCutoffs<Elements>(s, JobScores<Elements>(s, problem), s.job.length,
                                                  s.job.row, problem.k, rank_slack, begin, end);
  if (threadIdx.x == 0) s.job.cutoffs = cutoffs;
  __syncthreads();
}

// Whether the job's result is ordered through s.work.bitmap (else through s.work.selected). The
// bitmap holds columns only: a call that wants values takes s.work.selected, where each winner's
// value bits sit next to its column.
__device__ __forceinline__ bool OrdersByBitmap(const SharedStorage& s, const TopkProblem& problem) {
  return !problem.sorted && problem.values == nullptr && s.job.length <= kBitmapColumns;
}

// How a row's candidates are found, in the order they are tried: the values the primary cutoff
// keeps, those the deeper secondary keeps (the primary was short of k), then every value of the
// row (the exact route: radix passes over the row, when both bands are short or overflow).
enum class Route { kPrimary, kSecondary, kExact };

// The route tried after `route`.
__device__ __forceinline__ Route NextRoute(Route route) {
  return static_cast<Route>(static_cast<int>(route) + 1);
}

// The cutoff of a band route (kPrimary or kSecondary).
__device__ __forceinline__ uint32_t RouteCutoff(const RowJob& job, Route route) {
  return route == Route::kPrimary ? job.cutoffs.primary : job.cutoffs.secondary;
}

// Where the job's winners go: ordered through s.work.bitmap or through s.work.selected.
__device__ __forceinline__ WinnersTo JobWinnersTo(const SharedStorage& s,
                                                  const TopkProblem& problem) {
  return OrdersByBitmap(s, problem) ? WinnersTo::kBitmap : WinnersTo::kSelected;
}

// The job's top-k over `kept` candidates of `cutoff`, put in `keep` (s.candidates, then the
// slice) by this block or merged into s.candidates by a split row's cluster: by warps' sorted
// lists for k <= 64 of at most 4096 (few_winners.cuh), else by the radix selection.
template <class Elements>
__device__ __forceinline__ int SelectKept(SharedStorage& s, const CandidateSink& keep, int k,
                                          uint32_t cutoff, int kept, WinnersTo to) {
  if (UsesFewWinners(k, kept, keep.shared_capacity, to == WinnersTo::kSelected) &&
      !ProbeOn(s, kProbeOldFewWinners)) {
    const int m = SelectFewWinners(s, kept, k);
    ProbeStamp(s, kPhaseSelect);
    ProbeStamp(s, kPhasePut);
    return m;
  }
  const CandidateSource candidates{s.candidates, keep.shared_capacity, keep.global, kept};
  const Selection selection = SelectCandidates(s, candidates, k, KeepsAll(cutoff) ? 0u : cutoff,
                                               s.sample_largest, to, Elements::kKeyStepBits);
  ProbeStamp(s, kPhaseSelect);
  const int m = PutWinners(s, candidates, selection, to, s.job.length);
  ProbeStamp(s, kPhasePut);
  return m;
}

// Selects the job's row (see selection.cuh) by the routes from `route` on: each band filters the
// row into shared memory, then the slice, and is taken when it holds k (or keeps everything).
template <class Elements>
__device__ __forceinline__ int SelectJobRow(SharedStorage& s, const FilteredLaunch& launch,
                                            Route route) {
  const int k = launch.problem.k;
  const typename Elements::Storage* row = JobScores<Elements>(s, launch.problem);
  const CandidateSink keep{kSharedCandidates, WorkerSlice(launch), launch.slice_entries};
  const WinnersTo to = JobWinnersTo(s, launch.problem);
  for (; route < Route::kExact; route = NextRoute(route)) {
    const uint32_t cutoff = RouteCutoff(s.job, route);
    if (route == Route::kSecondary && cutoff == s.job.cutoffs.primary)
      break;  // same band: known short
    const int kept = FilterColumns<Elements>(s, row, 0, s.job.length, KeepThreshold(cutoff), keep);
    ProbeStamp(s, kPhasePass);
    if (route == Route::kSecondary) ProbeCount(s, kCountSecondary);
    // The streaming phases' own rate, what a block that only streams could reach (benches/NOTES.md
    // "The selecting phases at 8 warps"): the first pass, then nothing to select.
    if (ProbeOn(s, kProbeStreamOnly)) return 0;
    if (kept > keep.Capacity()) break;  // overflow: the exact route re-reads the row
    if (kept >= k || KeepsAll(cutoff)) {
      ProbeCount(s, kCountKept, kept);
      return SelectKept<Elements>(s, keep, k, cutoff, kept, to);
    }
  }
  ProbeCount(s, kCountExact);
  const RowSource<Elements> whole_row{row, 0, s.job.length};
  const Selection selection = SelectRow(s, whole_row, k);
  const int m = PutWinners(s, whole_row, selection, to, s.job.length);
  ProbeStamp(s, kPhaseExact);
  return m;
}

// Writes the job's m winners, then -1s (see WriteWinners).
__device__ __forceinline__ void WriteRow(SharedStorage& s, const TopkProblem& problem, int m) {
  WriteWinners(s, problem, m, 0, 0, s.job.length, OrdersByBitmap(s, problem), true);
}

// The job's row by this block alone, every route from the primary on. The two modes differ only
// in the parameters: the sample's rank slack (a split launch's short rows and a queue worker's
// rows take different ones: layout.cuh), and while_sampled(), which runs after the sample (and
// for an empty row) so that work of the caller's (the queue's next claim) hides behind the pass.
template <class Elements, class WhileSampled>
__device__ __forceinline__ void RunRow(SharedStorage& s, const FilteredLaunch& launch,
                                       int rank_slack, const WhileSampled& while_sampled) {
  int m = 0;
  ProbeStamp(s, kPhaseQueue);
  if (s.job.length > 0) {
    ProbeCount(s, kCountRows);
    SampleJobCutoffs<Elements>(s, launch.problem, rank_slack, 0, s.job.length);
    ProbeStamp(s, kPhaseSample);
    while_sampled();
    ProbeStamp(s, kPhaseClaim);
    m = SelectJobRow<Elements>(s, launch, Route::kPrimary);
  } else {
    while_sampled();
  }
  WriteRow(s, launch.problem, m);
  ProbeStamp(s, kPhaseWrite);
}

}  // namespace
}  // namespace jax_topk
