// merge_topk for rows of m > 16384 candidates (shorter rows: merge_in_registers.cuh), one
// 512-thread block per row.
// 1. Each candidate becomes a 64-bit rank key R = ordered key << 32 | ~column (larger R ranks
//    first: higher value, then lower column); R = 0 marks an entry that is no candidate (column
//    < 0 or NaN: every other ordered key is > 0). R is recomputed from global memory each pass:
//    a row's keys (128 KiB to 1 MiB) do not fit the shared memory of every block we run on.
// 2. Radix select on R, 8 bits a digit from the top (the 16 zero bits of 16-bit keys skipped):
//    a shared histogram of the keys sharing the decided prefix, a warp scan from the top bin
//    finds the digit of the k-th largest. It stops as soon as the boundary bin holds exactly the
//    winners still needed, usually after the key's digits; ties go on into the column's.
// 3. Keys above the prefix, and the needed ones equal to it (after all 8 digits those are equal
//    (value, column) pairs, so which are taken cannot show), go to a shared list; one
//    cub::BlockRadixSort orders it (R descending, or column then key) and one pass writes it.
// Traffic: m x (value + 4 bytes) read by each pass over the row (the count, a digit's
// histogram, the winners; from L2 where it holds the row), k x (value + 4) written. Limits:
// merge_cuda.h.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cub/block/block_radix_sort.cuh>
#include <string_view>

#include "common/topk_common.h"
#include "common/value_traits.h"
#include "kernels/merge_cuda.h"
#include "kernels/merge_in_registers.cuh"

namespace jax_topk {
namespace {

constexpr int kThreadsPerBlock = 512;
constexpr int kWarpSize = 32;
constexpr int kSortItemsPerThread = kMaxK / kThreadsPerBlock;
constexpr int kDigitBits = 8;
constexpr int kBins = 1 << kDigitBits;
constexpr int kBinsPerLane = kBins / kWarpSize;
static_assert(kSortItemsPerThread * kThreadsPerBlock == kMaxK, "the sort holds k <= kMaxK");

// The first digit of R worth visiting: 16-bit keys leave bits 48..63 zero.
template <typename Values>
constexpr int kTopShift = 32 + Values::kKeyBits - kDigitBits;

template <typename Values>
__device__ __forceinline__ uint64_t RankKey(const typename Values::Bits* values,
                                            const int32_t* indices, int64_t j) {
  const int32_t column = indices[j];
  const typename Values::Bits bits = values[j];
  if (column < 0 || Values::IsNan(bits)) return 0;
  return (static_cast<uint64_t>(Values::Key(bits)) << 32) | static_cast<uint32_t>(~column);
}

// The block's shared state.
struct MergeShared {
  using Sort = cub::BlockRadixSort<uint64_t, kThreadsPerBlock, kSortItemsPerThread>;
  union {
    typename Sort::TempStorage sort;
    uint64_t winners[kMaxK];  // rank keys of the winners, in no order
  };
  uint32_t histogram[kBins];
  uint64_t prefix;        // the decided digits of the k-th largest R
  uint64_t decided_mask;  // which bits of R are decided
  int32_t needed;         // winners still to take among keys equal to the prefix
  int32_t done;           // the boundary bin held exactly `needed`
  int32_t candidates;     // valid entries in the row
  int32_t winner_count;
  int32_t equal_taken;
};

// Warp 0 finds, from the top bin down, the bin holding the needed-th largest key of the
// histogram; lane L owns bins [kBins - 1 - L*kBinsPerLane - i] for i < kBinsPerLane.
__device__ void FindBoundaryBin(MergeShared& shared, int shift) {
  const int lane = threadIdx.x;
  const int32_t needed = shared.needed;  // read by every lane before one lane writes it
  int32_t counts[kBinsPerLane];
  int32_t lane_total = 0;
  for (int i = 0; i < kBinsPerLane; ++i) {
    counts[i] = shared.histogram[kBins - 1 - lane * kBinsPerLane - i];
    lane_total += counts[i];
  }
  int32_t inclusive = lane_total;
  for (int offset = 1; offset < kWarpSize; offset <<= 1) {
    const int32_t other = __shfl_up_sync(0xFFFFFFFFu, inclusive, offset);
    if (lane >= offset) inclusive += other;
  }
  __syncwarp();
  int32_t above = inclusive - lane_total;
  if (above < needed && needed <= inclusive) {
    for (int i = 0; i < kBinsPerLane; ++i) {
      if (above + counts[i] >= needed) {
        const uint64_t bin = kBins - 1 - lane * kBinsPerLane - i;
        shared.needed = needed - above;
        shared.done = counts[i] == needed - above;
        shared.prefix |= bin << shift;
        shared.decided_mask |= static_cast<uint64_t>(kBins - 1) << shift;
        break;
      }
      above += counts[i];
    }
  }
}

template <typename Values>
__global__ void __launch_bounds__(kThreadsPerBlock)
    MergeTopkKernel(const typename Values::Bits* values, const int32_t* indices, int64_t width,
                    int32_t k, bool sorted, typename Values::Bits* out_values,
                    int32_t* out_indices) {
  __shared__ MergeShared shared;
  const int64_t row = blockIdx.x;
  values += row * width;
  indices += row * width;
  auto rank_key = [&](int64_t j) { return RankKey<Values>(values, indices, j); };

  // 1. The number of candidates.
  if (threadIdx.x == 0) {
    shared.candidates = 0;
    shared.prefix = 0;
    shared.decided_mask = 0;
    shared.needed = k;
    shared.done = 0;
    shared.winner_count = 0;
    shared.equal_taken = 0;
  }
  __syncthreads();
  int32_t my_candidates = 0;
  for (int64_t j = threadIdx.x; j < width; j += kThreadsPerBlock) {
    my_candidates += rank_key(j) != 0;
  }
  atomicAdd(&shared.candidates, my_candidates);
  __syncthreads();
  const int32_t candidates = shared.candidates;
  const int32_t taken = candidates < k ? candidates : k;

  // 2. Radix select, unless every candidate wins (then the empty prefix takes them all).
  if (candidates <= k) {
    if (threadIdx.x == 0) shared.needed = candidates;
  } else {
    for (int shift = kTopShift<Values>; shift >= 0; shift -= kDigitBits) {
      for (int bin = threadIdx.x; bin < kBins; bin += kThreadsPerBlock) shared.histogram[bin] = 0;
      __syncthreads();
      const uint64_t prefix = shared.prefix;
      const uint64_t decided_mask = shared.decided_mask;
      for (int64_t j = threadIdx.x; j < width; j += kThreadsPerBlock) {
        const uint64_t key = rank_key(j);
        if (key != 0 && (key & decided_mask) == prefix)
          atomicAdd(&shared.histogram[(key >> shift) & (kBins - 1)], 1u);
      }
      __syncthreads();
      if (threadIdx.x < kWarpSize) FindBoundaryBin(shared, shift);
      __syncthreads();
      if (shared.done) break;
    }
  }
  __syncthreads();

  // 3. The winners: above the prefix, and `needed` equal to it.
  const uint64_t prefix = shared.prefix;
  const uint64_t decided_mask = shared.decided_mask;
  const int32_t equal_quota = shared.needed;
  for (int64_t j = threadIdx.x; j < width; j += kThreadsPerBlock) {
    const uint64_t key = rank_key(j);
    if (key == 0) continue;
    const uint64_t decided = key & decided_mask;
    if (decided > prefix || (decided == prefix && atomicAdd(&shared.equal_taken, 1) < equal_quota))
      shared.winners[atomicAdd(&shared.winner_count, 1)] = key;
  }
  __syncthreads();

  // Sort keys: R descending for rank order; column ascending then key descending otherwise.
  // Unused slots get a key that sorts last.
  uint64_t sort_keys[kSortItemsPerThread];
  for (int i = 0; i < kSortItemsPerThread; ++i) {
    const int slot = threadIdx.x * kSortItemsPerThread + i;
    const uint64_t key = slot < taken ? shared.winners[slot] : 0;
    if (sorted) {
      sort_keys[i] = key;
    } else {
      const uint32_t column = ~static_cast<uint32_t>(key);
      const uint32_t inverted_key = ~static_cast<uint32_t>(key >> 32);
      sort_keys[i] = slot < taken ? (static_cast<uint64_t>(column) << 32 | inverted_key) : ~0ull;
    }
  }
  __syncthreads();  // the winners' storage becomes the sort's
  if (sorted) {
    MergeShared::Sort(shared.sort).SortDescendingBlockedToStriped(sort_keys);
  } else {
    MergeShared::Sort(shared.sort).SortBlockedToStriped(sort_keys);
  }
  out_values += row * k;
  out_indices += row * k;
  for (int i = 0; i < kSortItemsPerThread; ++i) {
    const int slot = i * kThreadsPerBlock + threadIdx.x;  // striped: coalesced stores
    if (slot >= k) continue;
    const uint64_t key = sort_keys[i];
    const uint32_t ordered =
        static_cast<uint32_t>(sorted ? key >> 32 : ~static_cast<uint32_t>(key));
    const int32_t column = static_cast<int32_t>(sorted ? ~static_cast<uint32_t>(key) : key >> 32);
    const bool filled = slot < taken;
    out_indices[slot] = filled ? column : kEmptySlot;
    out_values[slot] = filled ? Values::FromKey(ordered) : Values::kEmpty;
  }
}

// Which of the register kernel's steps run. By default: the sampled cutoff, the fine-bucket
// rank (benches/NOTES.md, helper merge-rank) and the staged row. Timing switch, read at each
// launch (a fresh jit each, so one process times them all): JAX_TOPK_MERGE_VARIANT=old (none),
// sampled (the cutoff, ranked by 11-bit buckets), staged (that and the staged row: the sorted
// default before the fine rank), fine-unstaged (the cutoff and the fine rank), fine (the
// default's steps, unsorted winners placed twice), flag (unsorted winners flagged, placed once).
struct RegisterVariant {
  bool sampled, fine, staged, flag_winners;
};
constexpr bool kFlagWinners = false;  // unsorted rows: winners flagged (helper merge-prefetch)
RegisterVariant ChosenVariant() {
  const char* name = std::getenv("JAX_TOPK_MERGE_VARIANT");
  const std::string_view chosen = name == nullptr ? "" : name;
  if (chosen == "old") return {false, false, false, false};
  if (chosen == "sampled") return {true, false, false, false};
  if (chosen == "staged") return {true, false, true, false};
  if (chosen == "fine-unstaged") return {true, true, false, kFlagWinners};
  if (chosen == "fine") return {true, true, true, false};
  if (chosen == "flag") return {true, true, true, true};
  return {true, true, true, kFlagWinners};
}

// Rows pulled into L2 ahead of the staged one (helper merge-prefetch's measurement).
constexpr int kLookahead = 1;

// The probe build's switches (merge_in_registers.cuh Options), from the environment:
// JAX_TOPK_MERGE_PROBE_STOP=N ends the sampled path after phase N, JAX_TOPK_MERGE_LOOKAHEAD=L
// pulls L rows ahead into L2, JAX_TOPK_MERGE_PROBE_NO_COPY=1 works on each block's first row
// over and over (no copies: the work alone).
void ReadProbeSwitches(merge_registers::Options& options) {
  const auto number = [](const char* name, int otherwise) {
    const char* text = std::getenv(name);
    return text == nullptr || *text == 0 ? otherwise : std::atoi(text);
  };
  options.probe_stop = number("JAX_TOPK_MERGE_PROBE_STOP", 0);
  options.lookahead = number("JAX_TOPK_MERGE_LOOKAHEAD", kLookahead);
  options.probe_no_copy = number("JAX_TOPK_MERGE_PROBE_NO_COPY", 0) != 0;
}

// Allows `kernel` the most dynamic shared memory any of its launches asks for, once per
// device (`allowed`: a bit a device; devices past 63 ask every launch).
template <typename Kernel>
cudaError_t AllowSharedOnce(Kernel kernel, size_t bytes, std::atomic<uint64_t>& allowed) {
  int device = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) return status;
  const uint64_t bit = device < 64 ? uint64_t{1} << device : 0;
  if (bit != 0 && (allowed.load(std::memory_order_acquire) & bit) != 0) return cudaSuccess;
  status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(bytes));
  if (status == cudaSuccess) allowed.fetch_or(bit, std::memory_order_release);
  return status;
}

// Whether rows of m <= 8192 take the narrow instances (two blocks an SM).
// JAX_TOPK_MERGE_NARROW=off (read at each launch; a call replayed from a captured command buffer
// keeps the mode of its capture, so compile afresh) keeps them on the wide one, for benchmarks
// and tests.
bool NarrowInstanceChosen() {
  const char* const mode = std::getenv("JAX_TOPK_MERGE_NARROW");
  return mode == nullptr || std::string_view(mode) != "off";
}

// Rows of m <= merge_registers::kMaxWidth: a persistent grid of kBlocksPerSmOf blocks an SM
// (the kernel's registers allow no more), each pulling a row ahead into L2 and, for the wide
// instance where the row's two parts are 16-byte multiples at 16-byte addresses, the next row
// into shared memory by bulk copies while it works on this one (sm_90 only). The narrow
// instances stage nothing (kStagesRowsOf).
template <typename Values, int kChunks>
cudaError_t LaunchInRegisters(const MergeProblem& p, cudaStream_t stream) {
  using Bits = typename Values::Bits;
  constexpr bool kStages = merge_registers::kStagesRowsOf<kChunks>;
  const RegisterVariant variant = ChosenVariant();
  const bool flag_winners = variant.flag_winners && !p.sorted;
  const auto kernel = flag_winners
                          ? merge_registers::MergeInRegistersKernel<Values, true, kChunks>
                          : merge_registers::MergeInRegistersKernel<Values, false, kChunks>;
  int device = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) return status;
  // Staged rows need sm_90's bulk copies and a block of up to 224 KB of shared memory (more
  // than sm_80's or sm_120's blocks may have): other devices read every row from global memory.
  int major = 0;
  int per_block = 0;
  status = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (status != cudaSuccess) return status;
  status = cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (status != cudaSuccess) return status;
  const bool stages =
      kStages && major >= 9 &&
      static_cast<size_t>(per_block) >=
          merge_registers::SharedBytes<Bits>(true, merge_registers::kWidthOf<kChunks>);
  static std::atomic<uint64_t> allowed[2] = {0, 0};
  status = AllowSharedOnce(
      kernel, merge_registers::SharedBytes<Bits>(stages, merge_registers::kWidthOf<kChunks>),
      allowed[flag_winners]);
  if (status != cudaSuccess) return status;
  int sms = 0;
  status = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (status != cudaSuccess) return status;
  const int64_t pool = int64_t{sms} * merge_registers::kBlocksPerSmOf<kChunks>;
  const int64_t grid = p.rows < pool ? p.rows : pool;
  const bool vector_loads = p.width % merge_registers::kChunk == 0 &&
                            reinterpret_cast<uintptr_t>(p.values) % (4 * sizeof(Bits)) == 0 &&
                            reinterpret_cast<uintptr_t>(p.indices) % 16 == 0;
  const bool staged = stages && variant.staged && (p.width * sizeof(Bits)) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(p.values) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(p.indices) % 16 == 0;
  const size_t shared_bytes = merge_registers::SharedBytes<Bits>(staged, p.width);
  merge_registers::Options options{
      vector_loads, variant.sampled, variant.fine, staged, kLookahead, 0, false};
  if (merge_registers::kProbe) ReadProbeSwitches(options);
  kernel<<<static_cast<unsigned>(grid), merge_registers::kThreads, shared_bytes, stream>>>(
      static_cast<const Bits*>(p.values), p.indices, p.rows, p.width, p.k, p.sorted, options,
      static_cast<Bits*>(p.out_values), p.out_indices);
  return cudaGetLastError();
}

template <typename Values>
cudaError_t Launch(const MergeProblem& p, cudaStream_t stream) {
  using merge_registers::kMidChunks, merge_registers::kNarrowChunks, merge_registers::kWidthOf;
  if (p.width <= kWidthOf<kMidChunks> && NarrowInstanceChosen()) {
    return p.width <= kWidthOf<kNarrowChunks> ? LaunchInRegisters<Values, kNarrowChunks>(p, stream)
                                              : LaunchInRegisters<Values, kMidChunks>(p, stream);
  }
  if (p.width <= merge_registers::kMaxWidth)
    return LaunchInRegisters<Values, merge_registers::kWideChunks>(p, stream);
  // A block a row: rows beyond the grid's x extent (unreachable in memory: 2^31 rows of more
  // than 16384 candidates) are refused; the persistent kernel above takes any row count.
  if (p.rows > 0x7FFFFFFF) return cudaErrorInvalidValue;
  MergeTopkKernel<Values><<<static_cast<unsigned>(p.rows), kThreadsPerBlock, 0, stream>>>(
      static_cast<const typename Values::Bits*>(p.values), p.indices, p.width, p.k, p.sorted,
      static_cast<typename Values::Bits*>(p.out_values), p.out_indices);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchMergeTopk(const MergeProblem& problem, cudaStream_t stream) {
  if (problem.k < 1 || problem.k > kMaxK || problem.k > problem.width ||
      problem.width > kMaxMergeWidth)
    return cudaErrorInvalidValue;
  if (problem.rows == 0) return cudaSuccess;
  switch (problem.score_type) {
    case ScoreType::kFloat32:
      return Launch<F32Values>(problem, stream);
    case ScoreType::kBfloat16:
      return Launch<Bf16Values>(problem, stream);
    case ScoreType::kFloat16:
      return Launch<F16Values>(problem, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace jax_topk
