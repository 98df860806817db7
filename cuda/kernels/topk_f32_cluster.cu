// topk_f32_cluster: exact top-k of few float32 rows of at most kF32ClusterMaxWidth columns, a row
// per thread block cluster of 8 or 16 blocks, each block holding a contiguous slice of the row in
// registers (topk_f32_rows.cu's kernel spread over a cluster of SMs: one SM alone is slow to read
// and scan a 128 KB row). Per row:
//  1. Load: block b of the cluster keeps columns [b * slice, (b + 1) * slice), thread t of it a
//     contiguous kElems of them, as ordered keys (0: NaN or past the length).
//  2. Three radix digits (11+11+10 bits) of the k-th key: each block histograms its keys that
//     match the digits found so far and sums each 32 bins into a super-bin; after one cluster
//     barrier, warp 0 of every block reads every block's super-bins, then the 32 bins of the
//     chosen one, through distributed shared memory (the same sums in every block: no broadcast).
//     The same reads count the keys above the bin, and in it, in the blocks before this one.
//  3. Winners: the blocks own ascending column ranges, so block b's winners follow the greater
//     keys and the taken ties of the blocks before it; a block scan places the rest (ties to the
//     lowest columns). Unsorted: stored from the registers. Sorted: sent to block 0's shared
//     memory and stored from there (ranked by counting, or a block radix sort past 256).
// Traffic: each score read once; k indices (and values) written a row. No workspace. Needs
// sm_90 (clusters); the host never launches it elsewhere (TopkF32ClusterServes).
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "common/topk_common.h"
#include "kernels/cluster_launch.cuh"
#include "kernels/f32_rows/register_row.cuh"
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
static_assert(int64_t{kMaxParts} * kThreads * kMaxElemsPerThread == kF32ClusterMaxWidth,
              "the widest row fills every register slot of the largest cluster");
constexpr int kBinsPerSuper = 32;  // a warp's lanes
constexpr int kSuperBins = kDigitBins / kBinsPerSuper;
static_assert(kSuperBins == 64, "warp 0 reads two super-bins a lane");

// What warp 0 found of one digit, identical in every block of the cluster but the *_before
// fields (which count the blocks before this one).
struct DigitFound {
  uint32_t bin;            // the digit of the rank-th key
  uint32_t above;          // the cluster's matching keys in higher bins
  uint32_t above_before;   // of which in the blocks before this one
  uint32_t in_bin_before;  // the blocks before this one: their matching keys in the bin
  uint32_t valid;          // the first digit: the row's real keys
  uint32_t valid_before;   // of which in the blocks before this one
};

struct ClusterShared {
  // A histogram a digit (no reuse, so no barrier guards a rewrite): read by the whole cluster
  // after the digit's cluster barrier.
  uint32_t hist[kDigits][kDigitBins];
  uint32_t super_bins[kDigits][kSuperBins];
  // Sorted rows: the cluster's winners, in block 0 (the sort's space once they are read).
  union {
    StagedWinners staged;
    WinnerSort<kThreads>::TempStorage sort;
  };
  uint32_t warp_sums[kWarps];
  DigitFound found;
};

// This block's super-bins of `digit` (after a barrier that follows its histogram).
__device__ __forceinline__ void SumSuperBins(ClusterShared& s, int digit) {
  const int lane = threadIdx.x % 32;
  for (int super = threadIdx.x / 32; super < kSuperBins; super += kWarps) {
    const uint32_t count = __reduce_add_sync(0xFFFFFFFFu, s.hist[digit][super * 32 + lane]);
    if (lane == 0) s.super_bins[digit][super] = count;
  }
}

// Warp 0 (after the digit's cluster barrier): the bin of `digit` holding the rank-th largest
// matching key of the cluster, into s.found. For the first digit, a rank past the row's real
// keys finds no bin (s.found.valid says so).
__device__ __forceinline__ void FindClusterBin(ClusterShared& s, const cg::cluster_group& cluster,
                                               int digit, int parts, int part, uint32_t rank) {
  const unsigned full = 0xFFFFFFFFu;
  const int lane = threadIdx.x;
  // Lane l: super-bins 63 - 2l and 62 - 2l, so lane order is descending bin order.
  const int high = kSuperBins - 1 - 2 * lane;
  // Every block's two counts loaded before any is added, so all are in flight at once (blocks
  // past `parts` reread block 0 and count nothing).
  uint32_t part_high[kMaxParts];
  uint32_t part_low[kMaxParts];
#pragma unroll
  for (int q = 0; q < kMaxParts; ++q) {
    const uint32_t* supers = cluster.map_shared_rank(s.super_bins[digit], q < parts ? q : 0);
    part_high[q] = supers[high];
    part_low[q] = supers[high - 1];
  }
  uint32_t high_count = 0;
  uint32_t low_count = 0;
  uint32_t high_before = 0;
  uint32_t low_before = 0;
#pragma unroll
  for (int q = 0; q < kMaxParts; ++q) {
    const bool counts = q < parts;
    high_count += counts ? part_high[q] : 0u;
    low_count += counts ? part_low[q] : 0u;
    high_before += q < part ? part_high[q] : 0u;
    low_before += q < part ? part_low[q] : 0u;
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
  const int super = kSuperBins - 1 - 2 * holder - (in_high ? 0 : 1);
  const uint32_t above = __shfl_sync(full, in_high ? pair_above : pair_above + high_count, holder);
  uint32_t above_before =
      __reduce_add_sync(full, lane < holder ? high_before + low_before
                                            : (lane == holder && !in_high ? high_before : 0u));
  // Lane l: the chosen super-bin's l-th bin from the top.
  const int bin = super * kBinsPerSuper + kBinsPerSuper - 1 - lane;
  uint32_t part_in_bin[kMaxParts];
#pragma unroll
  for (int q = 0; q < kMaxParts; ++q) {
    part_in_bin[q] = cluster.map_shared_rank(s.hist[digit], q < parts ? q : 0)[bin];
  }
  uint32_t in_bin = 0;
  uint32_t in_bin_before = 0;
#pragma unroll
  for (int q = 0; q < kMaxParts; ++q) {
    in_bin += q < parts ? part_in_bin[q] : 0u;
    in_bin_before += q < part ? part_in_bin[q] : 0u;
  }
  const uint32_t bin_inclusive =
      above + static_cast<uint32_t>(WarpInclusiveSum(static_cast<int>(in_bin)));
  const uint32_t bin_above = bin_inclusive - in_bin;
  const int bin_holder =
      __ffs(__ballot_sync(full, bin_above < rank && rank <= bin_inclusive)) - 1;  // one exists
  above_before += __reduce_add_sync(full, lane < bin_holder ? in_bin_before : 0u);
  const uint32_t holder_above = __shfl_sync(full, bin_above, bin_holder);
  const uint32_t holder_before = __shfl_sync(full, in_bin_before, bin_holder);
  if (lane == 0) {
    s.found.bin = static_cast<uint32_t>(super * kBinsPerSuper + kBinsPerSuper - 1 - bin_holder);
    s.found.above = holder_above;
    s.found.above_before = above_before;
    s.found.in_bin_before = holder_before;
  }
}

// Where this block's winners start and what it takes: the k-th key of the row and the ties left
// to this block, found over the cluster. Every thread of every block of the cluster calls it;
// a cluster barrier a digit. Returns the row's real keys in `valid`.
template <int kElems>
__device__ __forceinline__ Pivot FindClusterPivot(ClusterShared& s,
                                                  const cg::cluster_group& cluster,
                                                  const RowKeys<kElems>& row, int parts, int part,
                                                  int k, int probe_syncs, int& valid,
                                                  int& block_first_slot) {
  uint32_t rank = static_cast<uint32_t>(k);
  uint32_t prefix = 0;
  uint32_t prefix_mask = 0;
  uint32_t greater_before = 0;
#pragma unroll
  for (int digit = 0; digit < kDigits; ++digit) {
    const int shift = DigitShift(digit);
    const uint32_t mask = DigitMask(digit);
#pragma unroll
    for (int i = 0; i < kElems; ++i) {
      const uint32_t key = row.key[i];
      // Real keys are >= 0x007FFFFF: after the first digit a matching key is never 0.
      const bool counted = digit == 0 ? key != 0 : (key & prefix_mask) == prefix;
      if (counted) atomicAdd(&s.hist[digit][(key >> shift) & mask], 1u);
    }
    __syncthreads();
    SumSuperBins(s, digit);
    cluster.sync();  // every block's histogram and super-bins of this digit are complete
    for (int i = 0; i < probe_syncs; ++i) cluster.sync();
    if (threadIdx.x < 32) FindClusterBin(s, cluster, digit, parts, part, rank);
    __syncthreads();
    const DigitFound found = s.found;
    if (digit == 0) {
      valid = static_cast<int>(found.valid);
      if (found.valid <= rank) {  // at most k real keys: all of them (every key > 0)
        block_first_slot = static_cast<int>(found.valid_before);
        return {0, 0};
      }
    }
    rank -= found.above;
    greater_before += found.above_before;
    prefix |= found.bin << shift;
    prefix_mask |= mask << shift;
    if (digit == kDigits - 1) {
      // The ties of the blocks before this one are taken first (lower columns).
      const uint32_t equal_before = found.in_bin_before;
      block_first_slot = static_cast<int>(greater_before + min(equal_before, rank));
      return {prefix, static_cast<int>(rank > equal_before ? rank - equal_before : 0)};
    }
  }
  return {0, 0};  // not reached
}

template <int kElems, bool kSorted>
__global__ void __launch_bounds__(kThreads, 1)
    TopkF32ClusterKernel(const TopkProblem problem, int slice, int probe_syncs) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ uint4 shared_words[];
  ClusterShared& s = *reinterpret_cast<ClusterShared*>(shared_words);
  const cg::cluster_group cluster = cg::this_cluster();
  const int parts = static_cast<int>(cluster.num_blocks());
  const int part = static_cast<int>(cluster.block_rank());
  const int64_t row = blockIdx.x / parts;
  const int k = problem.k;
  const RowOutput output(problem, row);
  // The row's empty slots are spread over the whole cluster.
  const int cluster_thread = part * kThreads + static_cast<int>(threadIdx.x);
  const int cluster_threads = parts * kThreads;
  if (!RowIsValid(row, problem.num_valid_rows, problem.rows_per_group)) {
    for (int slot = cluster_thread; slot < k; slot += cluster_threads) output.StoreEmpty(slot);
    return;  // the same for every block of the cluster: no barrier waits for it
  }
  const int length =
      static_cast<int>(problem.lengths != nullptr ? ClampLength(problem.lengths[row], problem.width)
                                                  : problem.width);
  for (int i = threadIdx.x; i < kDigits * kDigitBins; i += kThreads) (&s.hist[0][0])[i] = 0;
  const int begin = part * slice;
  RowKeys<kElems> keys;
  LoadRow(static_cast<const float*>(problem.scores) + row * problem.width,
          begin + static_cast<int>(threadIdx.x) * kElems, min(length, begin + slice), keys);
  __syncthreads();  // the histograms are zero

  int valid = 0;
  int block_first_slot = 0;
  const Pivot pivot =
      FindClusterPivot(s, cluster, keys, parts, part, k, probe_syncs, valid, block_first_slot);
  const int selected = min(valid, k);
  const WinnerMasks masks = WinnerMasksOf(keys, pivot);
  uint32_t total;
  TakenKeys taken =
      TakeWinners(masks, BlockExclusiveSum(s.warp_sums, PackedCounts(masks), total), pivot.quota);
  taken.position += block_first_slot;
  if constexpr (!kSorted) {
    cluster.barrier_arrive();  // done reading the other blocks' shared memory
    ForEachTaken(keys, taken,
                 [&](int slot, int32_t column, uint32_t key) { output.Store(slot, column, key); });
    for (int slot = selected + cluster_thread; slot < k; slot += cluster_threads) {
      output.StoreEmpty(slot);
    }
    cluster.barrier_wait();  // no block leaves while another may read its shared memory
  } else {
    StagedWinners& gathered = *cluster.map_shared_rank(&s.staged, 0);
    ForEachTaken(keys, taken, [&](int slot, int32_t column, uint32_t key) {
      gathered.columns[slot] = column;
      gathered.keys[slot] = key;
    });
    cluster.sync();  // block 0 holds the row's winners in column order
    if (part == 0) StoreStagedWinners<kThreads, kSorted>(s.staged, s.sort, output, k, selected);
  }
#endif
}

template <int kElems, bool kSorted>
const void* KernelFor() {
  return reinterpret_cast<const void*>(&TopkF32ClusterKernel<kElems, kSorted>);
}

// A block's shared memory. No padding is needed to keep one block an SM: 512 threads of >= 96
// registers (ptxas) leave no room for a second block's registers.
constexpr int kSharedBytes = static_cast<int>(sizeof(ClusterShared));

cudaLaunchConfig_t ClusterConfig(int64_t grid, int parts, int shared_bytes, cudaStream_t stream,
                                 cudaLaunchAttribute& attribute) {
  return ClusterLaunchConfig(grid, parts, kThreads, static_cast<size_t>(shared_bytes), stream,
                             attribute);
}

// What the host plans a launch by, for one device: its SMs, and how many clusters of 8 and of 16
// blocks it holds at once (0: it cannot launch that size), with the kernels' attributes set.
struct DevicePlan {
  int sms = 0;
  int resident_portable = 0;
  int resident_most = 0;
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
  const void* kernels[] = {KernelFor<4, false>(),  KernelFor<8, false>(),  KernelFor<16, false>(),
                           KernelFor<24, false>(), KernelFor<32, false>(), KernelFor<4, true>(),
                           KernelFor<8, true>(),   KernelFor<16, true>(),  KernelFor<24, true>(),
                           KernelFor<32, true>()};
  bool non_portable = true;
  for (const void* kernel : kernels) {
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes);
    non_portable &= cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed,
                                         1) == cudaSuccess;
  }
  cudaGetLastError();  // a refused attribute is not sticky: clear it
  // The fewest clusters any instance holds (they differ only in registers).
  const auto resident = [&](int parts) {
    int fewest = INT_MAX;
    for (const void* kernel : kernels) {
      cudaLaunchAttribute attribute;
      const cudaLaunchConfig_t config =
          ClusterConfig(parts, parts, shared_bytes, nullptr, attribute);
      int clusters = 0;
      if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) != cudaSuccess) clusters = 0;
      fewest = min(fewest, clusters);
    }
    cudaGetLastError();
    return fewest;
  };
  plan.resident_portable = resident(kPortableParts);
  plan.resident_most = non_portable ? resident(kMaxParts) : 0;
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

// "off", "always" or unset (nullptr) from the environment, read at each launch.
const char* Mode(const char* name) {
  const char* mode = std::getenv(name);
  if (mode != nullptr && std::strcmp(mode, "off") == 0) return "off";
  if (mode != nullptr && std::strcmp(mode, "always") == 0) return "always";
  return nullptr;
}

// The blocks a row: 16 where every row's cluster is resident at once, else 8 (rows of at most
// 131072 columns); JAX_TOPK_F32_CLUSTER_PARTS=8 or 16 forces a size (benchmarks, tests). 0: none
// that launches here. `one_wave` says whether all the rows' clusters are resident at once.
int PartsFor(const TopkProblem& problem, const DevicePlan& plan, bool& one_wave) {
  const bool fits_portable =
      problem.width <= int64_t{kPortableParts} * kThreads * kMaxElemsPerThread;
  const bool can_most = plan.resident_most > 0;
  const bool can_portable = plan.resident_portable > 0 && fits_portable;
  const char* forced = std::getenv("JAX_TOPK_F32_CLUSTER_PARTS");
  int parts = 0;
  if (forced != nullptr && std::strcmp(forced, "8") == 0) {
    parts = can_portable ? kPortableParts : 0;
  } else if (forced != nullptr && std::strcmp(forced, "16") == 0) {
    parts = can_most ? kMaxParts : 0;
  } else if (can_most && (problem.rows <= plan.resident_most || !can_portable)) {
    parts = kMaxParts;
  } else if (can_portable) {
    parts = kPortableParts;
  }
  const int resident = parts == kMaxParts ? plan.resident_most : plan.resident_portable;
  one_wave = parts > 0 && problem.rows <= resident;
  return parts;
}

template <bool kSorted>
void Launch(const TopkProblem& problem, int parts, int device, cudaStream_t stream) {
  // The slice a block: a multiple of 4 columns (whole float4 loads), kElems covering it.
  const int64_t slice = (problem.width + 4 * parts - 1) / (4 * parts) * 4;
  const int elems = static_cast<int>((slice + kThreads - 1) / kThreads);
  const void* kernel = elems <= 4    ? KernelFor<4, kSorted>()
                       : elems <= 8  ? KernelFor<8, kSorted>()
                       : elems <= 16 ? KernelFor<16, kSorted>()
                       : elems <= 24 ? KernelFor<24, kSorted>()
                                     : KernelFor<32, kSorted>();
  cudaLaunchAttribute attribute;
  const cudaLaunchConfig_t config =
      ClusterConfig(problem.rows * parts, parts, kSharedBytes, stream, attribute);
  const int slice_columns = static_cast<int>(slice);
  // A probe for benchmarks: this many more cluster barriers a digit, to time one.
  const char* probe = std::getenv("JAX_TOPK_F32_CLUSTER_PROBE_SYNCS");
  const int probe_syncs = probe != nullptr ? std::atoi(probe) : 0;
  void* arguments[] = {const_cast<TopkProblem*>(&problem), const_cast<int*>(&slice_columns),
                       const_cast<int*>(&probe_syncs)};
  cudaLaunchKernelExC(&config, kernel, arguments);
}

}  // namespace

bool TopkF32ClusterServes(const TopkProblem& problem) {
  if (problem.score_type != ScoreType::kFloat32 || problem.width > kF32ClusterMaxWidth ||
      problem.rows < 1) {
    return false;
  }
  // Benchmarks and tests: "off" or "always" (every call it can take), read at each launch. A
  // choice made for topk_f32_rows (JAX_TOPK_F32_ROWS) is left to it.
  const char* mode = Mode("JAX_TOPK_F32_CLUSTER");
  if (mode != nullptr && std::strcmp(mode, "off") == 0) return false;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  const DevicePlan plan = PlanFor(device);
  bool one_wave = false;
  const int parts = PartsFor(problem, plan, one_wave);
  if (parts == 0 || problem.rows > INT_MAX / parts) return false;
  if (mode != nullptr) return true;
  if (Mode("JAX_TOPK_F32_ROWS") != nullptr) return false;
  // Measured on the H200 (benches/NOTES.md "topk_f32_cluster"): faster only with 16 blocks a row
  // for every row at once and at most 24 keys a thread (1 x 16384 to 1 x 152064, 4 x 32768);
  // 8 blocks a row (8 x 131072), 32 keys a thread (1 x 262144), rows of at most 8192 columns
  // (topk_f32_rows') and the block radix sort of more than 256 winners lose.
  if (problem.sorted && problem.k > kMaxRankedByCount) return false;
  return parts == kMaxParts && one_wave && problem.width > 8192 &&
         problem.width <= int64_t{kMaxParts} * kThreads * kMostServedElems;
}

cudaError_t LaunchTopkF32Cluster(const TopkProblem& problem, cudaStream_t stream) {
  if (problem.rows == 0) return cudaSuccess;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return cudaErrorInvalidDevice;
  bool one_wave = false;
  const int parts = problem.rows > 0 ? PartsFor(problem, PlanFor(device), one_wave) : 0;
  if (parts == 0 || problem.rows > INT_MAX / parts || problem.width < 1 ||
      problem.width > kF32ClusterMaxWidth || problem.k < 1 || problem.k > kMaxK ||
      problem.score_type != ScoreType::kFloat32 ||
      (problem.num_valid_rows != nullptr && problem.rows_per_group < 1)) {
    return cudaErrorInvalidValue;
  }
  if (problem.sorted) {
    Launch<true>(problem, parts, device, stream);
  } else {
    Launch<false>(problem, parts, device, stream);
  }
  return cudaGetLastError();
}

}  // namespace jax_topk
