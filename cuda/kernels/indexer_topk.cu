// indexer_topk on CUDA: the indices of topk_filtered over indexer_logits' bits, the logits kept
// out of memory (fused path) where the tensor-core kernel runs the problem. Launches, in order
// on the stream (none reads anything back to the host):
//  1. Sample: the tensor-core kernel over every s-th key tile (s = 32) writes those logits.
//  2. Cutoffs (a block a row): the ordered key of the (e + 4 sqrt(e) + 8)-th largest sampled
//     value (e = k / s); rows of at most kIndexerMaxCandidates columns keep every value, masked
//     and empty rows none. Also zeroes the row's counters.
//  3. Main pass: the tensor-core kernel with the KeepCandidates sink: each row's values >= its
//     cutoff's threshold (an upper set of the total order) go to its candidates.
//  4. Selection (a block a row): a row with k <= count <= capacity (or keeping every value)
//     holds every winner: the filtered kernel's candidate selection gives exactly its result.
//     Any other row (a fooled sample, massive ties) is marked, its query tile listed, for
//  5. recomputation of the listed tiles' logits into the workspace, and
//  6. the filtered kernel's exact radix selection of each marked row.
// Correctness never depends on the sample: it only decides which rows take steps 5-6.
// The unfused path (logits to the workspace, then the filtered kernel) measured faster at every
// shape (benches/NOTES.md, "fused indexer"), so it is the default; JAX_TOPK_INDEXER_TOPK=fused
// selects this one (read at trace time, which sizes the workspaces, and at each dispatch).
#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "common/indexer_topk_workspace.h"
#include "common/indexer_widened.h"
#include "kernels/filtered/elements.cuh"
#include "kernels/filtered/row_runner.cuh"
#include "kernels/indexer_cuda.h"
#include "kernels/topk_cuda.h"

namespace jax_topk {
namespace {

static_assert(kIndexerMaxCandidates <= kSharedCandidates,
              "step 4 copies a row's candidates into s.candidates");

// A quiet NaN: the main pass's `value >= threshold` keeps nothing at it.
constexpr uint32_t kNoValueKept = 0x7FC00000u;

// The per-row state arrays in the selection workspace (common/indexer_topk_workspace.h).
struct IndexerTopkState {
  int32_t* tile_count;
  float* thresholds;
  uint32_t* cutoffs;
  uint32_t* largest;
  int32_t* counts;
  int32_t* recompute;
  int32_t* tile_marked;
  int32_t* tile_list;
};

struct IndexerTopkLaunch {
  TopkProblem problem;       // the selection over rows = batch * queries
  int64_t queries;           // M: row r is query r % M of sequence r / M
  int32_t queries_per_tile;  // of the tensor-core kernel
  int32_t query_tiles;       // a sequence's
  const float* sample;       // [rows][sample_columns]
  int64_t sample_columns;
  int32_t sample_stride;  // the sample's tile t is key tile sample_stride * t
  uint2* candidates;      // [rows][capacity]
  int32_t capacity;
  const float* logits;  // [rows][width], for the recomputed rows
  IndexerTopkState state;
};

// The row's query tile, as the tensor-core kernel's tile list names it.
__device__ __forceinline__ int32_t TileOfRow(const IndexerTopkLaunch& launch, int64_t row) {
  const int64_t sequence = row / launch.queries;
  const int64_t query = row % launch.queries;
  return static_cast<int32_t>(sequence * launch.query_tiles + query / launch.queries_per_tile);
}

// Sampled columns below `length`: the sample's tile t is key tile stride * t, so they are a
// prefix.
__device__ __forceinline__ int SampledPositions(int length, int stride) {
  const int tiles = static_cast<int>((IndexerKeyTiles(length) + stride - 1) / stride);
  if (tiles == 0) return 0;
  const int last_start = (tiles - 1) * stride * static_cast<int>(kIndexerKeyTile);
  const int in_last = min(static_cast<int>(kIndexerKeyTile), length - last_start);
  return (tiles - 1) * static_cast<int>(kIndexerKeyTile) + in_last;
}

// The sampled rank whose value should leave at least k of the row above it: the expected rank
// of the k-th largest plus 4 standard deviations and a few.
__device__ __forceinline__ int CutoffRank(int k, int positions, int length) {
  const int64_t expected = (int64_t{k} * positions + length - 1) / length;
  return static_cast<int>(expected + 4 * static_cast<int64_t>(ceilf(sqrtf(expected))) + 8);
}

// Step 2: one block a row.
__global__ void __launch_bounds__(kThreadsPerBlock) CutoffKernel(const IndexerTopkLaunch launch) {
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  SharedStorage& s = *reinterpret_cast<SharedStorage*>(shared_bytes);
  ProbeStart(s, 0);  // the probe build's switches off: the release paths
  const int64_t row = blockIdx.x;
  const IndexerTopkState& state = launch.state;
  if (threadIdx.x == 0) {
    state.counts[row] = 0;
    state.recompute[row] = 0;
    state.tile_marked[TileOfRow(launch, row)] = 0;  // every tile has a row
    if (row == 0) *state.tile_count = 0;
    s.sample_largest = 0;
  }
  for (int bin = threadIdx.x; bin < kDigitBins; bin += kThreadsPerBlock) s.hist[bin] = 0;
  __syncthreads();
  const int length = RowLength(launch.problem, row);
  uint32_t cutoff = 0;  // keeps every value
  if (length > launch.capacity) {
    const int positions = SampledPositions(length, launch.sample_stride);
    const RowSource<RowElements<ScoreType::kFloat32>> sample{
        launch.sample + row * launch.sample_columns, 0, positions};
    sample.ForEach([&](uint32_t bits, int32_t, bool valid) {
      const uint32_t key = valid ? OrderedKeyF32(bits) : 0u;
      const uint32_t warp_largest = __reduce_max_sync(kFullMask, key);
      if (threadIdx.x % kWarpSize == 0 && warp_largest != 0)
        atomicMax(&s.sample_largest, warp_largest);
    });
    const RankValue rank =
        FindRankValue(s, sample, KeyOfValue{}, CutoffRank(launch.problem.k, positions, length));
    if (!rank.all) cutoff = rank.value;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    state.cutoffs[row] = cutoff;
    state.largest[row] = s.sample_largest;
    // A masked (length -1) or empty row keeps nothing: no value is >= NaN. (The tensor-core
    // kernel knows no num_valid_rows, so "keeps every value" would fill a masked row's
    // candidates for nothing.) Step 4 writes these rows' -1s before it reads their counts or
    // cutoffs, so none is marked for the recompute.
    state.thresholds[row] = length <= 0 ? __uint_as_float(kNoValueKept) : KeepThreshold(cutoff);
  }
}

// Step 4: one block a row.
__global__ void __launch_bounds__(kThreadsPerBlock)
    SelectCandidatesKernel(const IndexerTopkLaunch launch) {
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  SharedStorage& s = *reinterpret_cast<SharedStorage*>(shared_bytes);
  ProbeStart(s, 0);  // the probe build's switches off: the release paths
  const int64_t row = blockIdx.x;
  const IndexerTopkState& state = launch.state;
  const int k = launch.problem.k;
  if (threadIdx.x == 0) PublishJob(s, row, RowLength(launch.problem, row));
  for (int bin = threadIdx.x; bin < kDigitBins; bin += kThreadsPerBlock) s.hist[bin] = 0;
  __syncthreads();
  if (s.job.length <= 0) {  // masked or empty: every slot -1
    WriteRow(s, launch.problem, 0);
    return;
  }
  const int count = state.counts[row];
  const uint32_t cutoff = state.cutoffs[row];
  if (count > launch.capacity || (count < k && !KeepsAll(cutoff))) {
    if (threadIdx.x == 0) {  // the exact route's: mark the row, list its tile once
      state.recompute[row] = 1;
      const int32_t tile = TileOfRow(launch, row);
      if (atomicExch(&state.tile_marked[tile], 1) == 0)
        state.tile_list[atomicAdd(state.tile_count, 1)] = tile;
    }
    return;
  }
  const uint2* kept = launch.candidates + row * launch.capacity;
  for (int i = threadIdx.x; i < count; i += kThreadsPerBlock) s.candidates[i] = __ldcg(kept + i);
  __syncthreads();
  const CandidateSource candidates{s.candidates, kSharedCandidates, nullptr, count};
  const WinnersTo to = JobWinnersTo(s, launch.problem);  // the same `to` for both (selection.cuh)
  const Selection selection =
      SelectCandidates(s, candidates, k, KeepsAll(cutoff) ? 0u : cutoff, state.largest[row], to);
  const int m = PutWinners(s, candidates, selection, to, s.job.length);
  WriteRow(s, launch.problem, m);
}

// Step 6: one block a row; only the marked rows work.
__global__ void __launch_bounds__(kThreadsPerBlock)
    SelectRecomputedKernel(const IndexerTopkLaunch launch) {
  const int64_t row = blockIdx.x;
  if (launch.state.recompute[row] == 0) return;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  SharedStorage& s = *reinterpret_cast<SharedStorage*>(shared_bytes);
  ProbeStart(s, 0);  // the probe build's switches off: the release paths
  if (threadIdx.x == 0) PublishJob(s, row, RowLength(launch.problem, row));
  for (int bin = threadIdx.x; bin < kDigitBins; bin += kThreadsPerBlock) s.hist[bin] = 0;
  __syncthreads();
  const RowSource<RowElements<ScoreType::kFloat32>> whole_row{
      launch.logits + row * launch.problem.width, 0, s.job.length};
  const Selection selection = SelectRow(s, whole_row, launch.problem.k);
  const int m = PutWinners(s, whole_row, selection, JobWinnersTo(s, launch.problem), s.job.length);
  WriteRow(s, launch.problem, m);
}

std::atomic<int64_t> fused_launches{0};  // IndexerTopkFusedLaunches()

// Which path: JAX_TOPK_INDEXER_TOPK=fused asks for the fused one (tests, benchmarks); unset or
// anything else, the unfused one.
bool FusedAskedFor() {
  const char* path = std::getenv("JAX_TOPK_INDEXER_TOPK");
  return path != nullptr && std::strcmp(path, "fused") == 0;
}

// The sample's key-tile stride: kIndexerSampleTileStride, or a multiple of it from
// JAX_TOPK_INDEXER_SAMPLE_STRIDE (a probe's knob: a sparser sample fits the same workspace).
int32_t SampleStrideFromEnvironment() {
  const char* given = std::getenv("JAX_TOPK_INDEXER_SAMPLE_STRIDE");
  const int stride = given == nullptr ? 0 : std::atoi(given);
  constexpr int kStride = static_cast<int>(kIndexerSampleTileStride);
  return stride >= kStride && stride <= 1024 && stride % kStride == 0 ? stride : kStride;
}

// The logits into the logits workspace (fp8: the widened copies after them, where it holds
// them: common/indexer_widened.h), then the filtered kernel over them.
cudaError_t LaunchUnfused(const IndexerProblem& logits, const TopkProblem& selection,
                          void* logits_workspace, size_t logits_bytes, void* selection_workspace,
                          size_t selection_bytes, cudaStream_t stream) {
  IndexerProblem to_workspace = logits;
  to_workspace.logits = static_cast<float*>(logits_workspace);
  const size_t widened_offset =
      static_cast<size_t>(IndexerWidenedOffsetAfterLogits(selection.rows, selection.width));
  if (logits_bytes > widened_offset) {
    to_workspace.widened = static_cast<unsigned char*>(logits_workspace) + widened_offset;
    to_workspace.widened_capacity = logits_bytes - widened_offset;
  }
  TopkProblem over_workspace = selection;
  over_workspace.scores = to_workspace.logits;
  cudaError_t status = LaunchIndexerLogits(to_workspace, stream);
  if (status != cudaSuccess) return status;
  return LaunchTopkFiltered(over_workspace, selection_workspace, selection_bytes, stream);
}

template <typename Kernel>
cudaError_t LaunchRowBlocks(Kernel kernel, const IndexerTopkLaunch& launch, cudaStream_t stream) {
  const int shared_bytes = static_cast<int>(sizeof(SharedStorage));
  cudaError_t status =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes);
  if (status != cudaSuccess) return status;
  kernel<<<static_cast<unsigned int>(launch.problem.rows), kThreadsPerBlock, shared_bytes,
           stream>>>(launch);
  return cudaGetLastError();
}

}  // namespace

int64_t IndexerTopkFusedLaunches() {
  return fused_launches.load(std::memory_order_relaxed);
}

cudaError_t LaunchIndexerTopk(const IndexerProblem& logits, const TopkProblem& selection,
                              void* logits_workspace, size_t logits_bytes,
                              void* selection_workspace, size_t selection_bytes,
                              cudaStream_t stream) {
  const int64_t rows = selection.rows;
  const int64_t width = selection.width;
  if (rows <= 0) return cudaSuccess;
  int device = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) return status;
  const bool fused =
      FusedAskedFor() && rows <= INT32_MAX && selection.k >= 1 && selection.k <= kMaxK &&
      IndexerLogitsWgmmaSupports(logits, device) &&
      logits_bytes >= IndexerTopkLogitsWorkspaceBytes(rows, width) &&
      selection_bytes >= IndexerTopkSelectionWorkspaceBytes(rows, width, selection.k);
  if (!fused) {
    return LaunchUnfused(logits, selection, logits_workspace, logits_bytes, selection_workspace,
                         selection_bytes, stream);
  }
  fused_launches.fetch_add(1, std::memory_order_relaxed);
  unsigned char* const state_base = static_cast<unsigned char*>(selection_workspace);
  const auto state_of = [&](IndexerRowState which) {
    return state_base + IndexerStateOffset(rows, which);
  };
  IndexerTopkLaunch launch;
  launch.problem = selection;
  launch.queries = logits.queries;
  launch.queries_per_tile = IndexerWgmmaQueriesPerTile(logits);
  launch.query_tiles = static_cast<int32_t>((logits.queries + launch.queries_per_tile - 1) /
                                            launch.queries_per_tile);
  float* const logits_base = static_cast<float*>(logits_workspace);
  launch.sample = logits_base;
  launch.sample_columns = IndexerSampleColumns(width);
  launch.sample_stride = SampleStrideFromEnvironment();
  launch.candidates = reinterpret_cast<uint2*>(static_cast<unsigned char*>(logits_workspace) +
                                               IndexerCandidatesOffset(rows, width));
  launch.capacity = static_cast<int32_t>(IndexerCandidateCapacity(width));
  launch.logits = logits_base;
  IndexerTopkState& state = launch.state;
  state.tile_count = reinterpret_cast<int32_t*>(state_base);
  state.thresholds = reinterpret_cast<float*>(state_of(IndexerRowState::kThreshold));
  state.cutoffs = reinterpret_cast<uint32_t*>(state_of(IndexerRowState::kCutoff));
  state.largest = reinterpret_cast<uint32_t*>(state_of(IndexerRowState::kLargest));
  state.counts = reinterpret_cast<int32_t*>(state_of(IndexerRowState::kCount));
  state.recompute = reinterpret_cast<int32_t*>(state_of(IndexerRowState::kRecompute));
  state.tile_marked = reinterpret_cast<int32_t*>(state_of(IndexerRowState::kTileMarked));
  state.tile_list = reinterpret_cast<int32_t*>(state_of(IndexerRowState::kTileList));

  // 1. The sample, where some row may be longer than its candidates' capacity.
  if (width > launch.capacity) {
    IndexerWgmmaPass sample;
    sample.key_tile_stride = launch.sample_stride;
    sample.logits = logits_base;
    sample.logits_pitch = launch.sample_columns;
    status = LaunchIndexerWgmmaPass(logits, sample, stream);
    if (status != cudaSuccess) return status;
  }
  // 2. The cutoffs.
  status = LaunchRowBlocks(CutoffKernel, launch, stream);
  if (status != cudaSuccess) return status;
  // 3. The candidates.
  IndexerWgmmaPass keep;
  keep.keeps_candidates = true;
  keep.thresholds = state.thresholds;
  keep.counts = state.counts;
  keep.candidates = launch.candidates;
  keep.capacity = launch.capacity;
  status = LaunchIndexerWgmmaPass(logits, keep, stream);
  if (status != cudaSuccess) return status;
  // 4. Their selection.
  status = LaunchRowBlocks(SelectCandidatesKernel, launch, stream);
  if (status != cudaSuccess) return status;
  // 5, 6. The marked rows' logits and their exact route.
  IndexerWgmmaPass recompute;
  recompute.tile_list = state.tile_list;
  recompute.tile_count = state.tile_count;
  recompute.logits = logits_base;
  recompute.logits_pitch = width;
  status = LaunchIndexerWgmmaPass(logits, recompute, stream);
  if (status != cudaSuccess) return status;
  return LaunchRowBlocks(SelectRecomputedKernel, launch, stream);
}

}  // namespace jax_topk
