// indexer_logits on Hopper tensor cores (sm_90a wgmma): bf16 or fp8 e4m3 q/keys, H = 64, D = 128.
// 1. A persistent grid (one block per SM) takes equal contiguous runs of (sequence, query tile
//    of 4 queries (1 at M = 1), key tile of 64) units; a run's q tile stays in shared memory.
// 2. Two warpgroups take alternate key tiles (own cp.async rings, 128B swizzle), each issuing
//    wgmma.m64n256 (keys x (query, head)) for a tile as soon as it has read the previous
//    tile's products out of the accumulators (relu x weight in a fixed order): the rest of
//    that tile (the head sum over the quad, the sink, the next loads) runs under the new
//    chain, and the other warpgroup's chain covers the read. fp8 is widened to exact f16 for
//    f16 wgmma: in shared memory, or from 64 queries once into a workspace before the kernel
//    (WidenFp8Kernel; FP8_NATIVE: e4m3 wgmma). 3. Key tiles past the tile's
//    longest length are only written -inf. Traffic: keys once per query tile (from L2),
//    logits written once. ~80 % of 800 TFLOP/s bf16 at M >= 128 on an H200 (benches/NOTES.md).
// A finished [queries x 64 keys] tile goes to a sink: WriteLogits (the [M, N] logits, or a pass
// over every s-th key tile: indexer_topk's sample) or KeepCandidates (indexer_topk's filter),
// with the same bits either way (kernels/indexer_topk.cu relies on it).
// Limits: IndexerLogitsWgmmaSupports (H = 64, D = 128, compute capability 9.0, N < 2^25).

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <tuple>
#include <type_traits>

#include "common/indexer_problem.h"
#include "common/indexer_widened.h"
#include "kernels/indexer/wgmma.cuh"
#include "kernels/indexer_cuda.h"
#include "kernels/mbarrier.cuh"

// CMake defines this when it compiles this file for sm_90a (the only target with wgmma);
// elsewhere the kernel is empty and Supports() says no.
#if defined(JAX_TOPK_INDEXER_WGMMA_SM90A)
constexpr bool kBuiltForSm90a = true;
#else
constexpr bool kBuiltForSm90a = false;
#pragma nv_diag_suppress 177  // the device helpers below then go unused
#endif

namespace jax_topk {
namespace {

constexpr int kHeads = 64;
constexpr int kHeadDim = 128;
constexpr int kKeysPerTile = 64;  // wgmma's M
constexpr int kWarpgroups = 2;
constexpr int kThreadsPerWarpgroup = 128;
constexpr int kThreads = kWarpgroups * kThreadsPerWarpgroup;
// A 128B-swizzled K-major operand: 128 B a row (64 bf16/f16 or 128 fp8), 8-row atoms of 1024 B;
// a 16-bit D = 128 is two such parts one after the other, an fp8 one.
constexpr int kRowBytes = 128;
constexpr int kAtomBytes = 1024;
constexpr int kChunkBytes = 16;  // one cp.async
constexpr int kChunksPerPartRow = kRowBytes / kChunkBytes;
constexpr int kKStepBytes = 32;  // one wgmma k-step: 16 bf16/f16 or 32 fp8
using indexer::Bf16Input;
using indexer::Fp8AsF16Input;
using indexer::Fp8E4M3Input;
using indexer::Fp8WidenedInput;
// Bytes of one D row as an operand and in memory, and their 16-byte chunks, per input type.
template <typename Input>
struct RowShape {
  static constexpr int kBytes = kHeadDim * Input::kOperandBytes;
  static constexpr int kChunks = kBytes / kChunkBytes;  // 16 bf16/f16, 8 fp8
  static constexpr int kKeyTileBytes = kKeysPerTile * kBytes;
  static constexpr int kGlobalBytes = kHeadDim * static_cast<int>(sizeof(typename Input::Bits));
  static constexpr int kGlobalChunks = kGlobalBytes / kChunkBytes;
  static_assert(Input::kKStep * Input::kOperandBytes == kKStepBytes);
};
// Named barriers: 1 + warpgroup for a warpgroup's own sync; these two order the wgmma turns.
constexpr int kFirstTurnBarrier = 3;  // warpgroup g waits on kFirstTurnBarrier + g
// The probe builds with other values to measure what the turns and the ring depth buy. Turns
// (the warpgroups alternating at issuing) paid while each read its products right after its
// chain; with the next chain issued early they cost ~2 % (benches/NOTES.md), so they are off.
#ifndef JAX_TOPK_INDEXER_WGMMA_TURNS
#define JAX_TOPK_INDEXER_WGMMA_TURNS 0
#endif
#ifndef JAX_TOPK_INDEXER_WGMMA_STAGES
#define JAX_TOPK_INDEXER_WGMMA_STAGES 4
#endif
constexpr bool kTakeTurns = JAX_TOPK_INDEXER_WGMMA_TURNS != 0;
// 8 (every head); the probe's diagnostic build takes 1 to time the kernel without most of the
// epilogue's arithmetic (wrong logits).
#ifndef JAX_TOPK_INDEXER_WGMMA_PROBE_HEAD_GROUPS
#define JAX_TOPK_INDEXER_WGMMA_PROBE_HEAD_GROUPS 8
#endif
constexpr int kEpilogueHeadGroups = JAX_TOPK_INDEXER_WGMMA_PROBE_HEAD_GROUPS;
// Diagnostics (wrong logits): 1 loads no key tile past the ring's first ones; 1 skips the staging
// tile, its barrier and the sink.
#ifndef JAX_TOPK_INDEXER_WGMMA_PROBE_NO_KEY_LOADS
#define JAX_TOPK_INDEXER_WGMMA_PROBE_NO_KEY_LOADS 0
#endif
#ifndef JAX_TOPK_INDEXER_WGMMA_PROBE_NO_SINK
#define JAX_TOPK_INDEXER_WGMMA_PROBE_NO_SINK 0
#endif
// fp8 k-steps chained inside one wgmma accumulation before the sum moves to float32 registers on
// the CUDA cores (Hopper's fp8 tensor cores add with fewer bits than float32): 1 or 2 keep
// partial sums (2 queries a tile then: registers), 4 chains all of D = 128 (4 queries a tile).
#ifndef JAX_TOPK_INDEXER_WGMMA_FP8_CHAIN
#define JAX_TOPK_INDEXER_WGMMA_FP8_CHAIN 1
#endif
// fp8 inputs run e4m3 wgmma (1) or are widened to f16 in shared memory for f16 wgmma (0, the
// default): the e4m3 tensor cores align a k-step's products to the largest with 14 bits kept
// (DeepSeek-V3 report, section 3.5.2), so one 448^2 product under 31 smaller ones can lose
// ~30 * 2^-13 of it, over SPEC's 2e-4 bound whatever the chain; f16 holds every e4m3 exactly.
#ifndef JAX_TOPK_INDEXER_WGMMA_FP8_NATIVE
#define JAX_TOPK_INDEXER_WGMMA_FP8_NATIVE 0
#endif
using Fp8Input =
    std::conditional<JAX_TOPK_INDEXER_WGMMA_FP8_NATIVE != 0, Fp8E4M3Input, Fp8AsF16Input>::type;
constexpr int kFp8ChainSteps = JAX_TOPK_INDEXER_WGMMA_FP8_CHAIN;
static_assert(kFp8ChainSteps == 1 || kFp8ChainSteps == 2 || kFp8ChainSteps == 4);
// k-steps a chain, per input type: bf16 chains all 8 (float32 accumulation in the tensor core).
template <typename Input>
constexpr int ChainSteps() {
  return std::is_same<Input, Fp8E4M3Input>::value ? kFp8ChainSteps : kHeadDim / Input::kKStep;
}

template <typename Input, int kQueriesPerTile>
struct TileShape {
  static constexpr int kCols = kQueriesPerTile * kHeads;  // wgmma's N: (query, head) pairs
  static constexpr int kKeyStages = JAX_TOPK_INDEXER_WGMMA_STAGES;
  static constexpr int kKeyTileBytes = RowShape<Input>::kKeyTileBytes;
  // A ring stage holds a tile as loaded; a converting input adds the tile's operand after it.
  static constexpr int kStageBytes = kKeysPerTile * RowShape<Input>::kGlobalBytes;
  static constexpr int kWarpgroupKeyBytes =
      kKeyStages * kStageBytes + (Input::kConvert ? kKeyTileBytes : 0);
  static constexpr int kQBytes = kCols * RowShape<Input>::kBytes;
  static constexpr int kQOffset = 0;
  static constexpr int kKeysOffset = kQOffset + kQBytes;
  static constexpr int kWeightsOffset = kKeysOffset + kWarpgroups * kWarpgroupKeyBytes;
  static constexpr int kStagingOffset = kWeightsOffset + kCols * 4;
  static constexpr int kLengthsOffset =
      kStagingOffset + kWarpgroups * kQueriesPerTile * kKeysPerTile * 4;
  static constexpr int kBytes = kLengthsOffset + kQueriesPerTile * 4;
  static constexpr int kBytesWithAlignment = kBytes + kAtomBytes;  // room to align the base
  static constexpr int kSinkOffset = (kBytes + 15) / 16 * 16;      // a sink's own shared memory
};

// Byte offset of 16-byte chunk `chunk` (over D) of row `row` in a swizzled operand of `rows`
// rows: the chunk index within a 128-byte row XORs with the row's place in its atom.
__device__ __forceinline__ uint32_t SwizzledOffset(int row, int chunk, int rows) {
  const int part = chunk / kChunksPerPartRow;
  const int chunk_in_row = chunk % kChunksPerPartRow;
  return part * rows * kRowBytes + row * kRowBytes + ((chunk_in_row ^ (row & 7)) * kChunkBytes);
}

// 16 bytes global -> shared; src_bytes = 0 fills zeros (rows past the end).
__device__ __forceinline__ void CopyChunkAsync(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void CopyChunkAsync(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void CommitCopies() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void WaitCopies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}
// cp.async writes through the generic proxy; wgmma reads through the async proxy.
__device__ __forceinline__ void FenceForTensorCores() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void WarpgroupBarrier(int warpgroup) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(warpgroup + 1), "r"(kThreadsPerWarpgroup) : "memory");
}
// Turn barriers: the waiting warpgroup syncs, the other arrives (256 threads in all).
__device__ __forceinline__ void WaitTurn(int warpgroup) {
  if (kTakeTurns)
    asm volatile("bar.sync %0, %1;\n" ::"r"(kFirstTurnBarrier + warpgroup), "r"(kThreads)
                 : "memory");
}
__device__ __forceinline__ void PassTurn(int warpgroup) {
  if (kTakeTurns) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(kFirstTurnBarrier + 1 - warpgroup), "r"(kThreads)
                 : "memory");
  }
}

// max(x, 0) with NaN kept, as the contract's relu (jnp.maximum, the CPU handler) has it:
// fmaxf would return 0 for a NaN dot. One instruction, as fmaxf's (max.NaN, sm_80+).
__device__ __forceinline__ float ReluKeepingNan(float x) {
  float relu;
  asm("max.NaN.f32 %0, %1, 0f00000000;\n" : "=f"(relu) : "f"(x));
  return relu;
}

// Whether a query's weight lets a key's scale multiply the finished head sum instead of each
// product (fp8 inputs): fp8 bounds every nonzero dot to 2^-18 <= |dot| <= 128 x 448^2 (2.6e7),
// so with 0 or 1e-30 <= |weight| <= 1e28 every term weight x relu(dot) is a normal float
// (no subnormal rounding for the scale to magnify) and no partial sum of 64 overflows
// (64 x 1e28 x 2.6e7 = 1.6e37) where the scaled terms' sum would not. NaN: no.
__device__ __forceinline__ bool WeightAllowsScaleAfterSum(float weight) {
  const float magnitude = fabsf(weight);
  return weight == 0.0f || (magnitude >= 1e-30f && magnitude <= 1e28f);
}
constexpr float kLargestFloat = 3.4028235e38f;

// 16 e4m3 codes (a loaded chunk) -> 16 exact f16 (two operand chunks), NaN kept.
__device__ __forceinline__ void WidenFp8Chunk(const uint4& codes, uint4 (&halves)[2]) {
  const uint32_t words[4] = {codes.x, codes.y, codes.z, codes.w};
  uint32_t out[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint16_t pair = static_cast<uint16_t>(words[i / 2] >> (16 * (i % 2)));
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(out[i]) : "h"(pair));
  }
  halves[0] = make_uint4(out[0], out[1], out[2], out[3]);
  halves[1] = make_uint4(out[4], out[5], out[6], out[7]);
}

// wgmma shared-memory descriptor: K-major, 128B swizzle, 8-row atoms 1024 B apart.
__device__ __forceinline__ uint64_t SwizzledOperandDescriptor(uint32_t address) {
  constexpr uint64_t kLeadingByteOffset = 1;  // unused by swizzled K-major operands
  constexpr uint64_t kStrideByteOffset = kAtomBytes >> 4;
  constexpr uint64_t kSwizzle128B = 1;
  return static_cast<uint64_t>((address & 0x3FFFF) >> 4) | (kLeadingByteOffset << 16) |
         (kStrideByteOffset << 32) | (kSwizzle128B << 62);
}

struct IndexerArgs {
  const void* q;  // bf16 or fp8 bits
  const void* keys;
  const float* weights;
  const float* key_scales;  // or nullptr
  const int32_t* lengths;   // or nullptr
  int32_t queries;
  int32_t keys_count;
  int32_t query_tiles;
  int32_t key_tiles;  // of the pass: every key_tile_stride-th key tile
  int32_t key_tile_stride;
  int64_t units;  // batch * query_tiles * key_tiles (without a tile list)
  // With a tile list: only *tile_count rows of tiles (sequence * query_tiles + query tile).
  const int32_t* tile_list;
  const int32_t* tile_count;
  // WriteLogits: the pass's tile t goes to columns 64 t.. of rows of logits_pitch floats.
  float* logits;
  int64_t logits_pitch;
  // KeepCandidates: row r keeps its values >= thresholds[r] in candidates[r][0, capacity).
  const float* thresholds;
  int32_t* counts;
  uint2* candidates;
  int32_t capacity;
};

// Where a finished tile of logits goes; the kernel hands it the tile in shared memory. `tile`
// holds [kQueriesPerTile][64] logits of queries first_query.. and keys first_key.. (the pass's
// tile first_column / 64); called by the 128 threads of one warpgroup.

// The logits (or the sample's) to memory; tiles past every length of the tile are -inf.
struct WriteLogits {
  template <int kQueriesPerTile>
  static constexpr int kWarpgroupBytes = 0;  // no shared memory of its own
  __device__ static void Start(unsigned char*, int) {}
  template <int kQueriesPerTile>
  __device__ static void EndRun(const IndexerArgs&, unsigned char*, int64_t, int, int, int) {}
  // Entry i of the tile (query i / 64, key i % 64) gets value(i). A thread stores one key of
  // every second query: one row offset computed a tile, then a pitch a store.
  template <int kQueriesPerTile, typename Value>
  __device__ static void Store(const IndexerArgs& args, int64_t sequence, int first_query,
                               int first_key, int first_column, int thread, const Value& value) {
    constexpr int kQueriesPerPass = kThreadsPerWarpgroup / kKeysPerTile;
    const int key_in_tile = thread % kKeysPerTile;
    const int query_in_pass = thread / kKeysPerTile;
    if (first_key + key_in_tile >= args.keys_count) return;
    float* out = args.logits +
                 (sequence * args.queries + first_query + query_in_pass) * args.logits_pitch +
                 first_column + key_in_tile;
#pragma unroll
    for (int j = query_in_pass; j < kQueriesPerTile; j += kQueriesPerPass) {
      if (first_query + j < args.queries) *out = value(j * kKeysPerTile + key_in_tile);
      out += kQueriesPerPass * args.logits_pitch;
    }
  }
  template <int kQueriesPerTile>
  __device__ static void Tile(const IndexerArgs& args, unsigned char*, int64_t sequence,
                              int first_query, int first_key, int first_column, const float* tile,
                              int thread, int) {
    Store<kQueriesPerTile>(args, sequence, first_query, first_key, first_column, thread,
                           [&](int i) { return tile[i]; });
  }
  template <int kQueriesPerTile>
  __device__ static void Invisible(const IndexerArgs& args, int64_t sequence, int first_query,
                                   int first_key, int first_column, int thread) {
    Store<kQueriesPerTile>(args, sequence, first_query, first_key, first_column, thread,
                           [](int) { return -INFINITY; });
  }
};

// indexer_topk's filter: each value >= its row's threshold at a column below the row's length
// (NaN never) goes to the row's candidates, staged in this warpgroup's shared memory (a shared
// atomic a warp with a hit) and flushed to the row's global buffer when nearly full and at the
// end of each run (one global atomic a flush: a global atomic a tile would put its round trip
// into every tile's epilogue). The count goes on past the capacity, so the selection sees it.
struct KeepCandidates {
  static constexpr int kStaged = 256;      // a query's staged entries; a tile adds at most 64
  static constexpr int kHeaderBytes = 32;  // counts[4], bases[4]
  template <int kQueriesPerTile>
  static constexpr int kWarpgroupBytes = kHeaderBytes + kQueriesPerTile * kStaged * 8;
  __device__ static int* Counts(unsigned char* space) { return reinterpret_cast<int*>(space); }
  __device__ static uint2* Staged(unsigned char* space, int query) {
    return reinterpret_cast<uint2*>(space + kHeaderBytes) + query * kStaged;
  }
  __device__ static void Start(unsigned char* space, int thread) {
    if (thread < 4) Counts(space)[thread] = 0;  // visible after the first run's barrier
  }
  // Moves query j's staged entries to its row's buffer; called by the whole warpgroup.
  __device__ static void Flush(const IndexerArgs& args, unsigned char* space, int64_t row, int j,
                               int count, int thread, int warpgroup) {
    int* bases = Counts(space) + 4;
    if (thread == 0) bases[j] = atomicAdd(args.counts + row, count);
    WarpgroupBarrier(warpgroup);
    const int base = bases[j];
    const uint2* staged = Staged(space, j);
    for (int e = thread; e < count; e += kThreadsPerWarpgroup) {
      if (base + e < args.capacity) args.candidates[row * args.capacity + base + e] = staged[e];
    }
    WarpgroupBarrier(warpgroup);  // every thread is done with the entries and the base
    if (thread == 0) Counts(space)[j] = 0;
  }
  template <int kQueriesPerTile>
  __device__ static void Tile(const IndexerArgs& args, unsigned char* space, int64_t sequence,
                              int first_query, int first_key, int, const float* tile, int thread,
                              int warpgroup) {
    static_assert(kQueriesPerTile <= 4, "the header holds counts[4] and bases[4]");
    int* counts = Counts(space);
    // A warp's 32 entries are one query's (64 keys a query): one shared atomic a warp.
    for (int i = thread; i < kQueriesPerTile * kKeysPerTile; i += kThreadsPerWarpgroup) {
      const int j = i / kKeysPerTile;
      const int query = first_query + j;
      const int key = first_key + i % kKeysPerTile;
      const int64_t row = sequence * args.queries + query;
      const float value = tile[i];
      bool keep = false;
      if (query < args.queries) {
        const int32_t given = args.lengths == nullptr ? args.keys_count : args.lengths[row];
        const int32_t length = given < 0 ? 0 : (given < args.keys_count ? given : args.keys_count);
        keep = key < length && value >= __ldg(args.thresholds + row);
      }
      const uint32_t keepers = __ballot_sync(0xFFFFFFFFu, keep);
      if (keepers == 0) continue;
      const int lane = thread % 32;
      const int leader = __ffs(keepers) - 1;
      int base = 0;
      if (lane == leader) base = atomicAdd(counts + j, __popc(keepers));
      base = __shfl_sync(0xFFFFFFFFu, base, leader);
      if (keep) {
        Staged(space, j)[base + __popc(keepers & ((1u << lane) - 1u))] =
            make_uint2(__float_as_uint(value), static_cast<uint32_t>(key));
      }
    }
    WarpgroupBarrier(warpgroup);
#pragma unroll
    for (int j = 0; j < kQueriesPerTile; ++j) {
      const int count = counts[j];  // the same for every thread: read after the barrier
      if (count > kStaged - kKeysPerTile)
        Flush(args, space, sequence * args.queries + first_query + j, j, count, thread, warpgroup);
    }
  }
  // The run's last staged entries (the next run has other rows).
  template <int kQueriesPerTile>
  __device__ static void EndRun(const IndexerArgs& args, unsigned char* space, int64_t sequence,
                                int first_query, int thread, int warpgroup) {
    WarpgroupBarrier(warpgroup);
#pragma unroll
    for (int j = 0; j < kQueriesPerTile; ++j) {
      const int count = Counts(space)[j];
      if (count > 0)
        Flush(args, space, sequence * args.queries + first_query + j, j, count, thread, warpgroup);
    }
  }
  template <int kQueriesPerTile>
  __device__ static void Invisible(const IndexerArgs&, int64_t, int, int, int, int) {}
};

// One key tile's products, keys x (query, head), into `acc` (the CUDA-core float32 sum of
// partial chains where the input asks for them), between this warpgroup's turns.
template <typename Input, int kCols>
struct TileProducts {
  static constexpr int kSteps = kHeadDim / Input::kKStep;
  static constexpr int kChainSteps = ChainSteps<Input>();
  static constexpr int kChains = kSteps / kChainSteps;
  // Partial chains in flight (ping-pong); none where one chain covers D.
  static constexpr int kPartials = kChains == 1 ? 0 : 2;
  float partial[kPartials == 0 ? 1 : kPartials][kPartials == 0 ? 1 : kCols / 2];

  // The k-steps of chain `chain` into `out`. The descriptors' address fields count 16-byte
  // units; a D row is kRowBytes-wide parts, each `rows` rows of the operand.
  __device__ __forceinline__ static void IssueChain(float (&out)[kCols / 2], int chain,
                                                    uint64_t desc_keys, uint64_t desc_q) {
#pragma unroll
    for (int step = chain * kChainSteps; step < (chain + 1) * kChainSteps; ++step) {
      const int part = step * kKStepBytes / kRowBytes;
      const int step_bytes = step * kKStepBytes % kRowBytes;
      indexer::Wgmma<Input, kCols>(
          out, desc_keys + ((part * kKeysPerTile * kRowBytes + step_bytes) >> 4),
          desc_q + ((part * kCols * kRowBytes + step_bytes) >> 4), step != chain * kChainSteps);
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  }

  // Waits for this warpgroup's turn, issues the tile's chain and passes the turn on; the products
  // land while the warpgroup finishes the previous tile (Wait collects them). Partial chains add
  // on the CUDA cores between chains, so they issue, add and wait here.
  __device__ __forceinline__ void Issue(float (&acc)[kCols / 2], int warpgroup, uint64_t desc_keys,
                                        uint64_t desc_q) {
    WaitTurn(warpgroup);
    FenceAccumulators(acc);
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    if constexpr (kPartials == 0) {
      IssueChain(acc, 0, desc_keys, desc_q);
      PassTurn(warpgroup);  // the other warpgroup's chain queues behind this one
      FenceAccumulators(acc);
    } else {
      // Chains 0 and 1 in flight; each finished one is added (in chain order) and its
      // registers take chain c + 2.
      // The turn passes after the last chain is issued.
      IssueChain(partial[0], 0, desc_keys, desc_q);
      IssueChain(partial[1], 1, desc_keys, desc_q);
      if (kChains == 2) PassTurn(warpgroup);
#pragma unroll
      for (int chain = 0; chain < kChains; ++chain) {
        float (&done)[kCols / 2] = partial[chain % 2];
        if (chain + 1 < kChains) {
          asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
        } else {
          asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        }
        FenceAccumulators(done);  // the compiler must not read the registers before the wait
#pragma unroll
        for (int i = 0; i < kCols / 2; ++i) acc[i] = chain == 0 ? done[i] : acc[i] + done[i];
        if (chain + 2 < kChains) {
          asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
          IssueChain(done, chain + 2, desc_keys, desc_q);
          if (chain + 3 == kChains) PassTurn(warpgroup);
        }
      }
    }
  }
  // The issued tile's products are in `acc`.
  __device__ __forceinline__ static void Wait(float (&acc)[kCols / 2]) {
    if constexpr (kPartials == 0) {
      asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
      FenceAccumulators(acc);
    }
  }
  // Registers the async products write: no read or write of them may move across this.
  __device__ __forceinline__ static void FenceAccumulators(float (&registers)[kCols / 2]) {
#pragma unroll
    for (int i = 0; i < kCols / 2; ++i) asm volatile("" : "+f"(registers[i])::"memory");
  }
};

// Sums `slots` over the 4 lanes of a quad; lane % 4 = c keeps slots c + 4 n (n < kSlots / 4) in
// `finished`, or with 2 slots slot c % 2 (lanes c < 2 store it). Each level halves the slots: a
// lane sends the half its partner keeps. Every lane's sum is (l0 + l1) + (l2 + l3) exactly.
template <int kSlots, int kFinished = (kSlots >= 4 ? kSlots / 4 : 1)>
__device__ __forceinline__ void HeadSumOverQuad(const float (&slots)[kSlots], int lane,
                                                float (&finished)[kFinished]) {
  static_assert(kSlots == 2 || kSlots % 4 == 0);
  const bool odd = (lane & 1) != 0;
  float half[kSlots / 2];
#pragma unroll
  for (int m = 0; m < kSlots / 2; ++m) {
    const float send = odd ? slots[2 * m] : slots[2 * m + 1];
    const float keep = odd ? slots[2 * m + 1] : slots[2 * m];
    half[m] = keep + __shfl_xor_sync(0xFFFFFFFFu, send, 1);
  }
  if constexpr (kSlots == 2) {
    finished[0] = half[0] + __shfl_xor_sync(0xFFFFFFFFu, half[0], 2);
  } else {
    const bool upper = (lane & 2) != 0;
#pragma unroll
    for (int n = 0; n < kSlots / 4; ++n) {
      const float send = upper ? half[2 * n] : half[2 * n + 1];
      const float keep = upper ? half[2 * n + 1] : half[2 * n];
      finished[n] = keep + __shfl_xor_sync(0xFFFFFFFFu, send, 2);
    }
  }
}

template <typename Input, int kQueriesPerTile, bool kHasScales, typename Sink>
__global__ void __launch_bounds__(kThreads, 1) IndexerLogitsWgmmaKernel(const IndexerArgs args) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Shape = TileShape<Input, kQueriesPerTile>;
  using Bits = typename Input::Bits;
  constexpr int kCols = Shape::kCols;
  constexpr int kStages = Shape::kKeyStages;
  constexpr int kStageBytes = Shape::kStageBytes;
  constexpr int kChunksPerRow = RowShape<Input>::kGlobalChunks;  // as loaded
  constexpr int kElemsPerChunk = kChunkBytes / static_cast<int>(sizeof(Bits));
  constexpr int kSlots = 2 * kQueriesPerTile;  // (query, key row) sums a thread finishes
  constexpr int kStoredSlots = kSlots >= 4 ? kSlots / 4 : 1;
  // A tile's copies: each thread one chunk column, rows kRowsPerCopy apart (a multiple of 8).
  constexpr int kRowsPerCopy = kThreadsPerWarpgroup / kChunksPerRow;
  constexpr int kCopiesPerThread = kKeysPerTile / kRowsPerCopy;
  static_assert(kRowsPerCopy % 8 == 0 && kKeysPerTile % kRowsPerCopy == 0);
  // A converting input's stage is row-major as loaded; the others' the swizzled operand.
  constexpr int kCopyStride =
      kRowsPerCopy * (Input::kConvert ? RowShape<Input>::kGlobalBytes : kRowBytes);
  extern __shared__ unsigned char shared_raw[];
  // Aligned by an offset from the array (not by casting an integer back), so the compiler
  // knows every pointer below is shared memory: LDS / STS, not generic loads and stores.
  unsigned char* shared =
      shared_raw + ((kAtomBytes - SharedAddress(shared_raw) % kAtomBytes) % kAtomBytes);
  unsigned char* q_tile = shared + Shape::kQOffset;
  float* weights_tile = reinterpret_cast<float*>(shared + Shape::kWeightsOffset);
  int32_t* lengths_tile = reinterpret_cast<int32_t*>(shared + Shape::kLengthsOffset);

  const int warpgroup = threadIdx.x / kThreadsPerWarpgroup;
  const int thread = threadIdx.x % kThreadsPerWarpgroup;
  const int warp = thread / 32;
  const int lane = thread % 32;
  const int copy_row = thread / kChunksPerRow;
  const int copy_chunk = thread % kChunksPerRow;
  const uint32_t copy_offset =
      Input::kConvert ? thread * kChunkBytes : SwizzledOffset(copy_row, copy_chunk, kKeysPerTile);
  unsigned char* my_stages = shared + Shape::kKeysOffset + warpgroup * Shape::kWarpgroupKeyBytes;
  unsigned char* my_operand = my_stages + kStages * kStageBytes;  // converting inputs only
  // The sink's own shared memory, after the kernel's: a part for each warpgroup.
  unsigned char* my_sink_space =
      shared + Shape::kSinkOffset + warpgroup * Sink::template kWarpgroupBytes<kQueriesPerTile>;
  Sink::Start(my_sink_space, thread);
  float* my_staging = reinterpret_cast<float*>(shared + Shape::kStagingOffset) +
                      warpgroup * kQueriesPerTile * kKeysPerTile;

  // With a tile list, its count (clamped: it is device data) sets the units.
  int64_t units = args.units;
  if (args.tile_list != nullptr) {
    const int64_t tiles = args.units / args.key_tiles;  // every (sequence, query tile)
    const int32_t count = *args.tile_count;
    const int64_t listed = count < 0 ? 0 : (count < tiles ? count : tiles);
    units = listed * args.key_tiles;
  }
  const int64_t unit_begin = units * blockIdx.x / gridDim.x;
  const int64_t unit_end = units * (blockIdx.x + 1) / gridDim.x;
  // The first key of the pass's tile t.
  const int key_tile_stride = args.key_tile_stride;
  const auto key_of_tile = [key_tile_stride](int tile) {
    return tile * key_tile_stride * kKeysPerTile;
  };
  float acc[kCols / 2];
#pragma unroll
  for (int i = 0; i < kCols / 2; ++i) acc[i] = 0.0f;
  TileProducts<Input, kCols> products;
  // Warpgroup 0 has the first turn; it takes that arrival back at the end.
  if (warpgroup == 1) PassTurn(warpgroup);

  for (int64_t unit = unit_begin; unit < unit_end;) {
    int64_t row_of_tiles = unit / args.key_tiles;  // (sequence, query tile)
    if (args.tile_list != nullptr) row_of_tiles = args.tile_list[row_of_tiles];
    const int first_tile = static_cast<int>(unit % args.key_tiles);
    const int end_tile =
        static_cast<int>(std::min<int64_t>(args.key_tiles, first_tile + (unit_end - unit)));
    unit += end_tile - first_tile;
    const int64_t sequence = row_of_tiles / args.query_tiles;
    const int first_query = static_cast<int>(row_of_tiles % args.query_tiles) * kQueriesPerTile;

    // The query tile: q rows (query, head) swizzled, weights, lengths. Zeros past M.
    __syncthreads();  // the previous run is done with them
    const Bits* q_rows = static_cast<const Bits*>(args.q) +
                         (sequence * args.queries + first_query) * kHeads * kHeadDim;
    for (int i = threadIdx.x; i < kCols * kChunksPerRow; i += kThreads) {
      const int row = i / kChunksPerRow;
      const int chunk = i % kChunksPerRow;
      const bool inside = first_query + row / kHeads < args.queries;
      const Bits* src = q_rows + row * kHeadDim + chunk * kElemsPerChunk;
      if constexpr (Input::kConvert) {  // loaded, widened and stored here (once a run)
        uint4 halves[2] = {make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0)};
        if (inside) WidenFp8Chunk(*reinterpret_cast<const uint4*>(src), halves);
        for (int h = 0; h < 2; ++h) {
          *reinterpret_cast<uint4*>(q_tile + SwizzledOffset(row, 2 * chunk + h, kCols)) = halves[h];
        }
      } else {
        CopyChunkAsync(SharedAddress(q_tile + SwizzledOffset(row, chunk, kCols)),
                       inside ? static_cast<const void*>(src) : args.q, inside ? 16 : 0);
      }
    }
    CommitCopies();
    // fp8 with key scales: the tile's queries with a weight that rules out taking the scales
    // after the head sum (bit j: query j of the tile; below).
    constexpr bool kMayScaleAfterSum = kHasScales && Input::kFp8Values;
    uint32_t my_scaled_queries = 0;
    for (int i = threadIdx.x; i < kCols; i += kThreads) {
      const int query = first_query + i / kHeads;
      const float weight =
          query < args.queries
              ? args.weights[(sequence * args.queries + query) * kHeads + i % kHeads]
              : 0.0f;
      weights_tile[i] = weight;
      if (kMayScaleAfterSum && !WeightAllowsScaleAfterSum(weight))
        my_scaled_queries |= 1u << (i / kHeads);
    }
    if (threadIdx.x < kQueriesPerTile) {
      const int query = first_query + threadIdx.x;
      int32_t length = 0;
      if (query < args.queries) {
        length = args.lengths == nullptr ? args.keys_count
                                         : args.lengths[sequence * args.queries + query];
        length = std::min(std::max(length, 0), args.keys_count);
      }
      lengths_tile[threadIdx.x] = length;
    }
    WaitCopies<0>();
    FenceForTensorCores();
    uint32_t scaled_queries = 0;  // the same in every thread
    if constexpr (kMayScaleAfterSum) {
#pragma unroll
      for (int j = 0; j < kQueriesPerTile; ++j)
        scaled_queries |= __syncthreads_or((my_scaled_queries >> j) & 1u) != 0 ? 1u << j : 0u;
    } else {
      __syncthreads();
    }

    int32_t longest = 0;
#pragma unroll
    for (int j = 0; j < kQueriesPerTile; ++j) longest = std::max(longest, lengths_tile[j]);
    // The pass's tiles that start below `longest`.
    const int visible_tiles =
        ((longest + kKeysPerTile - 1) / kKeysPerTile + key_tile_stride - 1) / key_tile_stride;
    const int visible_end_tile =
        max(first_tile, visible_tiles < end_tile ? visible_tiles : end_tile);
    const Bits* sequence_keys =
        static_cast<const Bits*>(args.keys) + sequence * args.keys_count * kHeadDim;
    const float* sequence_scales =
        kHasScales ? args.key_scales + sequence * args.keys_count : nullptr;

    // This warpgroup's visible tiles: first_tile + warpgroup + 2 i. Both take the same number
    // of turns (warpgroup 1 may have one tile fewer).
    const int my_tiles = std::max(0, (visible_end_tile - first_tile - warpgroup + 1) / kWarpgroups);
    const int turns = (visible_end_tile - first_tile + 1) / kWarpgroups;
    const auto tile_of = [&](int index) { return first_tile + warpgroup + kWarpgroups * index; };
    const auto first_key_of = [&](int index) { return key_of_tile(tile_of(index)); };
    // This thread's copies of a tile: chunk copy_chunk of rows copy_row + kRowsPerCopy c. A
    // row's place in its 8-row atom, hence the chunk's swizzle, is the same for every c.
    auto load_tile = [&](int index) {
      const int first_key = first_key_of(index);
      const Bits* src = sequence_keys + static_cast<int64_t>(first_key + copy_row) * kHeadDim +
                        copy_chunk * kElemsPerChunk;
      const uint32_t stage = SharedAddress(my_stages + (index % kStages) * kStageBytes);
      if (first_key + kKeysPerTile <= args.keys_count) {  // every row inside: fixed offsets
#pragma unroll
        for (int c = 0; c < kCopiesPerThread; ++c)
          CopyChunkAsync(stage + copy_offset + c * kCopyStride, src + c * kRowsPerCopy * kHeadDim);
      } else {  // the sequence's last tile: rows past its end are zeros
        const int rows_left = args.keys_count - first_key - copy_row;
#pragma unroll
        for (int c = 0; c < kCopiesPerThread; ++c) {
          const bool inside = c * kRowsPerCopy < rows_left;
          CopyChunkAsync(
              stage + copy_offset + c * kCopyStride,
              inside ? static_cast<const void*>(src + c * kRowsPerCopy * kHeadDim) : args.keys,
              inside ? 16 : 0);
        }
      }
    };
    // Tile `index` landed (and widened), its chain issued; then the load of the tile that goes
    // into the stage the previous chain read (that chain is done: every thread waited for it
    // before the barrier here).
    const uint64_t desc_q = SwizzledOperandDescriptor(SharedAddress(q_tile));
    auto issue_tile = [&](int index) {
      WaitCopies<kStages - 2>();
      FenceForTensorCores();
      WarpgroupBarrier(warpgroup);
      unsigned char* stage = my_stages + (index % kStages) * kStageBytes;
      if constexpr (Input::kConvert) {  // widen into the operand, visible to the tensor cores
#pragma unroll
        for (int j = 0; j < kKeysPerTile * kChunksPerRow / kThreadsPerWarpgroup; ++j) {
          const int i = thread + j * kThreadsPerWarpgroup;
          uint4 halves[2];
          WidenFp8Chunk(reinterpret_cast<const uint4*>(stage)[i], halves);
          for (int h = 0; h < 2; ++h) {
            *reinterpret_cast<uint4*>(my_operand + SwizzledOffset(i / kChunksPerRow,
                                                                  2 * (i % kChunksPerRow) + h,
                                                                  kKeysPerTile)) = halves[h];
          }
        }
        FenceForTensorCores();
        WarpgroupBarrier(warpgroup);
      }
      const uint64_t desc_keys =
          SwizzledOperandDescriptor(SharedAddress(Input::kConvert ? my_operand : stage));
      products.Issue(acc, warpgroup, desc_keys, desc_q);
      if (index + kStages - 1 < my_tiles && !JAX_TOPK_INDEXER_WGMMA_PROBE_NO_KEY_LOADS)
        load_tile(index + kStages - 1);
      CommitCopies();
    };
    // Thread holds keys row0 = 16 warp + lane / 4 and row0 + 8; acc[4 j + 2 r + e] is column
    // 8 j + 2 (lane % 4) + e: query j / 8, head 8 (j % 8) + 2 (lane % 4) + e. Its share of slot
    // s = 2 query + r is the relu x weight sum over its 16 heads of the query at key row0 + 8 r.
    // A key's scale: for fp8 inputs, where the key's scale is finite and >= 0 and the query's
    // weights allow it (WeightAllowsScaleAfterSum), relu(scale x dot) = scale x relu(dot), so
    // the scale multiplies the finished head sum (one multiply a slot instead of one a product:
    // the epilogue's issue bounds this kernel); otherwise it multiplies each product before its
    // relu, as the contract states it. Both stay within SPEC's bound. Which way depends only on
    // the (query, key) pair, so a logit's bits do not depend on its neighbours (sharded calls
    // equal unsharded ones): a thread holding a pair of each kind takes the per-product loop
    // with a factor 1 (exact) for the other pairs, which then get the same bits.
    const int row0 = 16 * warp + lane / 4;
    float tile_scales[2] = {1.0f, 1.0f};  // the thread's two keys', for finish_tile
    uint32_t scaled_keys = 3;             // bit r: key row0 + 8 r scales each product
    auto reduce_tile = [&](int index, float (&sums)[kSlots]) {
      if (kHasScales) {
        scaled_keys = 0;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int key = first_key_of(index) + row0 + 8 * r;
          tile_scales[r] = key < args.keys_count ? sequence_scales[key] : 0.0f;
          // False for NaN too; -0 counts as 0.
          const bool after_sum =
              kMayScaleAfterSum && tile_scales[r] >= 0.0f && tile_scales[r] <= kLargestFloat;
          scaled_keys |= after_sum ? 0u : 1u << r;
        }
      }
      const auto sum_heads = [&](bool scaled) {
#pragma unroll
        for (int query = 0; query < kQueriesPerTile; ++query) {
          float factor[2] = {1.0f, 1.0f};  // a product's, before its relu
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            sums[2 * query + r] = 0.0f;
            const bool each = ((scaled_queries >> query) & 1u) != 0 || ((scaled_keys >> r) & 1u);
            if (scaled && each) factor[r] = tile_scales[r];
          }
#pragma unroll
          for (int j8 = 0; j8 < kEpilogueHeadGroups; ++j8) {
            const int j = query * 8 + j8;
            // Heads 8 j8 + 2 (lane % 4) + {0, 1} of this query (broadcast within the quads).
            const float2 weight = reinterpret_cast<const float2*>(weights_tile)[j * 4 + lane % 4];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
              const float product0 = scaled ? factor[r] * acc[4 * j + 2 * r] : acc[4 * j + 2 * r];
              const float product1 =
                  scaled ? factor[r] * acc[4 * j + 2 * r + 1] : acc[4 * j + 2 * r + 1];
              float& sum = sums[2 * query + r];
              sum = fmaf(weight.x, ReluKeepingNan(product0), sum);
              sum = fmaf(weight.y, ReluKeepingNan(product1), sum);
            }
          }
        }
      };
      if (kHasScales && (scaled_keys != 0 || scaled_queries != 0)) {
        sum_heads(true);
      } else {
        sum_heads(false);
      }
    };
    // The quad's head sums to the staging tile (-inf past each query's length), then the sink.
    auto finish_tile = [&](int index, const float (&sums)[kSlots]) {
      const int tile_index = tile_of(index);
      const int first_key = key_of_tile(tile_index);
      if (JAX_TOPK_INDEXER_WGMMA_PROBE_NO_SINK) {  // keep the sums live, store nothing
        float all = 0.0f;
#pragma unroll
        for (int slot = 0; slot < kSlots; ++slot) all += sums[slot];
        if (all == 1.2345f) my_staging[0] = all;  // inside this warpgroup's staging
        return;
      }
      // Lane % 4 = c ends with slots c + 4 n: 6 shuffles for 8 slots (a butterfly: 16).
      float finished[kStoredSlots];
      HeadSumOverQuad<kSlots>(sums, lane, finished);
#pragma unroll
      for (int n = 0; n < kStoredSlots; ++n) {
        const int slot = kSlots >= 4 ? 4 * n + lane % 4 : lane % 4;
        const int query = slot / 2;
        const int key_in_tile = row0 + 8 * (slot % 2);
        if (kMayScaleAfterSum) {  // slot % 2 = lane % 2: selects, not an indexed (local) array
          const uint32_t r = lane & 1;
          const bool each = ((scaled_queries >> query) & 1u) != 0 || ((scaled_keys >> r) & 1u);
          const float scale = each ? 1.0f : (r != 0 ? tile_scales[1] : tile_scales[0]);
          // Unfused (an FMA would keep the sign): a negative sum times a scale that underflows
          // is -0, and + 0 makes it the per-product way's +0.
          finished[n] = __fadd_rn(__fmul_rn(finished[n], scale), 0.0f);
        }
        if (kSlots >= 4 || lane % 4 < kSlots) {
          my_staging[query * kKeysPerTile + key_in_tile] =
              first_key + key_in_tile < lengths_tile[query] ? finished[n] : -INFINITY;
        }
      }
      WarpgroupBarrier(warpgroup);
      Sink::template Tile<kQueriesPerTile>(args, my_sink_space, sequence, first_query, first_key,
                                           tile_index * kKeysPerTile, my_staging, thread,
                                           warpgroup);
    };
#pragma unroll
    for (int index = 0; index < kStages - 1; ++index) {
      if (index < my_tiles) load_tile(index);
      CommitCopies();
    }
    // Tile index's chain runs while tile index - 1 is finished: its products were read into
    // `sums` before the chain was issued.
    float sums[kSlots];
    for (int index = 0; index < my_tiles; ++index) {
      issue_tile(index);
      if (index > 0) finish_tile(index - 1, sums);
      products.Wait(acc);
      reduce_tile(index, sums);
    }
    if (my_tiles > 0) finish_tile(my_tiles - 1, sums);
    if (my_tiles < turns) {  // warpgroup 1's empty last turn
      WaitTurn(warpgroup);
      PassTurn(warpgroup);
    }
    WaitCopies<0>();  // no copy may land in a stage after the next run starts
    Sink::template EndRun<kQueriesPerTile>(args, my_sink_space, sequence, first_query, thread,
                                           warpgroup);

    // Tiles past every length of the tile: no products (-inf logits).
    for (int tile = visible_end_tile + warpgroup; tile < end_tile; tile += kWarpgroups) {
      Sink::template Invisible<kQueriesPerTile>(args, sequence, first_query, key_of_tile(tile),
                                                tile * kKeysPerTile, thread);
    }
  }
  if (warpgroup == 0) WaitTurn(warpgroup);
#endif
}

// fp8 q and keys to their f16 copies (common/indexer_widened.h): 16 codes a thread a step.
// Empty where the tensor-core kernel is (launched only where Supports() says yes).
__global__ void __launch_bounds__(256)
    WidenFp8Kernel(const uint4* codes, uint4* halves, int64_t chunks) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < chunks;
       i += int64_t{gridDim.x} * blockDim.x) {
    uint4 widened[2];
    WidenFp8Chunk(codes[i], widened);
    halves[2 * i] = widened[0];
    halves[2 * i + 1] = widened[1];
  }
#endif
}

// Per device: compute capability 9.0 (0 not asked yet, -1 no, 1 yes) and multiprocessor count.
constexpr int kMaxDevices = 64;
std::atomic<int> device_is_sm90[kMaxDevices];
std::atomic<int> device_sm_count[kMaxDevices];

bool DeviceIsSm90(int device) {
  if (device < 0 || device >= kMaxDevices) return false;
  int known = device_is_sm90[device].load(std::memory_order_acquire);
  if (known == 0) {
    int major = 0, minor = 0, sms = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    device_sm_count[device].store(sms, std::memory_order_relaxed);
    known = (major == 9 && minor == 0) ? 1 : -1;
    device_is_sm90[device].store(known, std::memory_order_release);  // after the count
  }
  return known == 1;
}

template <typename Input, int kQueriesPerTile, bool kHasScales, typename Sink>
cudaError_t LaunchTiles(const IndexerProblem& problem, const IndexerWgmmaPass& pass, int device,
                        cudaStream_t stream) {
  using Shape = TileShape<Input, kQueriesPerTile>;
  auto kernel = IndexerLogitsWgmmaKernel<Input, kQueriesPerTile, kHasScales, Sink>;
  constexpr int kSharedBytes = Shape::kSinkOffset + kAtomBytes +
                               kWarpgroups * Sink::template kWarpgroupBytes<kQueriesPerTile>;
  // The shared-memory limit is per device and per kernel; raised once each.
  static std::atomic<bool> limit_raised[kMaxDevices];
  if (!limit_raised[device].load(std::memory_order_relaxed)) {
    cudaError_t status =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes);
    if (status != cudaSuccess) return status;
    limit_raised[device].store(true, std::memory_order_relaxed);
  }
  IndexerArgs args;
  args.q = problem.q;
  args.keys = problem.keys;
  args.weights = problem.weights;
  args.key_scales = problem.key_scales;
  args.lengths = problem.lengths;
  args.queries = static_cast<int32_t>(problem.queries);
  args.keys_count = static_cast<int32_t>(problem.keys_count);
  args.query_tiles =
      static_cast<int32_t>((problem.queries + kQueriesPerTile - 1) / kQueriesPerTile);
  const int32_t stride = std::max(pass.key_tile_stride, 1);
  const int64_t all_key_tiles = (problem.keys_count + kKeysPerTile - 1) / kKeysPerTile;
  args.key_tiles = static_cast<int32_t>((all_key_tiles + stride - 1) / stride);
  args.key_tile_stride = stride;
  args.units = problem.batch * args.query_tiles * args.key_tiles;
  args.tile_list = pass.tile_list;
  args.tile_count = pass.tile_count;
  args.logits = pass.logits;
  args.logits_pitch = pass.logits_pitch;
  args.thresholds = pass.thresholds;
  args.counts = pass.counts;
  args.candidates = static_cast<uint2*>(pass.candidates);
  args.capacity = pass.capacity;
  // A listed pass's units are known on the device only: one block an SM, the spare ones idle.
  const int64_t sms = device_sm_count[device].load();
  const int64_t blocks = pass.tile_list != nullptr ? sms : std::min<int64_t>(args.units, sms);
  kernel<<<static_cast<unsigned>(blocks), kThreads, kSharedBytes, stream>>>(args);
  return cudaGetLastError();
}

// One query a tile only where there is one query: four (two for fp8's partial chains, whose
// registers double the accumulators) share each key tile's wgmma otherwise.
template <typename Input>
constexpr int QueriesPerTile(int64_t queries) {
  return queries == 1 ? 1 : (TileProducts<Input, 4 * kHeads>::kPartials == 0 ? 4 : 2);
}
template <typename Input, int kQueriesPerTile, typename Sink>
cudaError_t LaunchForScales(const IndexerProblem& problem, const IndexerWgmmaPass& pass, int device,
                            cudaStream_t stream) {
  return problem.key_scales != nullptr
             ? LaunchTiles<Input, kQueriesPerTile, true, Sink>(problem, pass, device, stream)
             : LaunchTiles<Input, kQueriesPerTile, false, Sink>(problem, pass, device, stream);
}
template <typename Input, typename Sink>
cudaError_t LaunchForInput(const IndexerProblem& problem, const IndexerWgmmaPass& pass, int device,
                           cudaStream_t stream) {
  constexpr int kQueriesPerTile = QueriesPerTile<Input>(2);
  if (problem.queries == 1) return LaunchForScales<Input, 1, Sink>(problem, pass, device, stream);
  return LaunchForScales<Input, kQueriesPerTile, Sink>(problem, pass, device, stream);
}
template <typename Sink>
cudaError_t LaunchForSink(const IndexerProblem& problem, const IndexerWgmmaPass& pass, int device,
                          cudaStream_t stream) {
  return problem.input == IndexerInput::kFloat8E4M3
             ? LaunchForInput<Fp8Input, Sink>(problem, pass, device, stream)
             : LaunchForInput<Bf16Input, Sink>(problem, pass, device, stream);
}

}  // namespace

bool IndexerLogitsWgmmaSupports(const IndexerProblem& problem, int device) {
  constexpr int64_t kInt32Limit = 0x7FFFFFFF;
  return kBuiltForSm90a &&
         (problem.input == IndexerInput::kBfloat16 || problem.input == IndexerInput::kFloat8E4M3) &&
         problem.heads == kHeads && problem.head_dim == kHeadDim && problem.batch >= 1 &&
         problem.queries >= 1 && problem.keys_count >= 1 && problem.queries <= kInt32Limit &&
         problem.keys_count <= kInt32Limit / kKeysPerTile && DeviceIsSm90(device);
}

int IndexerWgmmaQueriesPerTile(const IndexerProblem& problem) {
  return problem.input == IndexerInput::kFloat8E4M3 ? QueriesPerTile<Fp8Input>(problem.queries)
                                                    : QueriesPerTile<Bf16Input>(problem.queries);
}

cudaError_t LaunchIndexerWgmmaPass(const IndexerProblem& problem, const IndexerWgmmaPass& pass,
                                   cudaStream_t stream) {
  int device = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) return status;
  if (!IndexerLogitsWgmmaSupports(problem, device)) return cudaErrorInvalidValue;
  return pass.keeps_candidates ? LaunchForSink<KeepCandidates>(problem, pass, device, stream)
                               : LaunchForSink<WriteLogits>(problem, pass, device, stream);
}

cudaError_t LaunchIndexerLogitsWgmma(const IndexerProblem& problem, cudaStream_t stream) {
  IndexerWgmmaPass pass;
  pass.logits = problem.logits;
  pass.logits_pitch = problem.keys_count;
  // The one place that decides between the copies and widening in shared memory.
  const int64_t widened_bytes =
      IndexerWidenedBytes(problem.input == IndexerInput::kFloat8E4M3, problem.batch,
                          problem.queries, problem.heads, problem.head_dim, problem.keys_count);
  if (widened_bytes == 0 || problem.widened == nullptr ||
      problem.widened_capacity < static_cast<size_t>(widened_bytes)) {
    return LaunchIndexerWgmmaPass(problem, pass, stream);
  }
  // Enough queries: q and the keys widened to f16 once, then the kernel reads them as bf16's
  // reads its inputs (no widening in shared memory). Same f16 operands, same instruction, same
  // order: the same bits as widening in the ring.
  int device = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) return status;
  if (!IndexerLogitsWgmmaSupports(problem, device)) return cudaErrorInvalidValue;
  unsigned char* const copies = static_cast<unsigned char*>(problem.widened);
  IndexerProblem widened = problem;
  widened.q = copies;
  widened.keys = copies + IndexerWidenedKeysOffset(problem.batch, problem.queries, problem.heads,
                                                   problem.head_dim);
  const int64_t sms = device_sm_count[device].load();
  for (const auto& [from, to, codes] :
       {std::tuple{problem.q, widened.q, problem.batch * problem.queries * problem.heads},
        std::tuple{problem.keys, widened.keys, problem.batch * problem.keys_count}}) {
    const int64_t chunks = codes * problem.head_dim / 16;  // D = 128: whole 16-byte chunks
    const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(8 * sms, (chunks + 255) / 256));
    WidenFp8Kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(
        static_cast<const uint4*>(from), static_cast<uint4*>(const_cast<void*>(to)), chunks);
    status = cudaGetLastError();
    if (status != cudaSuccess) return status;
  }
  return LaunchForScales<Fp8WidenedInput, QueriesPerTile<Fp8WidenedInput>(2), WriteLogits>(
      widened, pass, device, stream);
}

}  // namespace jax_topk
