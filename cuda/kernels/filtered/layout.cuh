// topk_filtered's shape: the block size, the tile and buffer sizes every phase is built around,
// and SharedStorage, the one block's shared memory that all phases share.
//
// Contract: constants and types only. SharedStorage is the kernel's dynamic shared memory (one
// per block, sizeof(SharedStorage) bytes, or more for a split launch that wants its SM alone).
// Phases own its fields in turn, never at once: `candidates` belongs to the filtering pass, then
// to the winners' ordering; `work` is the selection's frontier, then its winners, then the sort or
// bitmap of the write; `hist` is zero between uses (whoever fills it clears it). The last union
// holds the state of one mode: `queue` (a worker's next row) or `cluster` (what the blocks of a
// split row read from each other's shared memory); a launch touches only its own.
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cub/block/block_radix_sort.cuh>

#include "common/topk_common.h"
#include "common/topk_filtered_workspace.h"

namespace jax_topk {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreadsPerBlock = 512;
constexpr int kWarpSize = 32;
constexpr int kWarpsPerBlock = kThreadsPerBlock / kWarpSize;
constexpr unsigned kFullMask = 0xFFFFFFFFu;
constexpr int kBlocksPerSm = 2;

// Rows are read in 16-byte chunks of e elements (4 float32 or 8 16-bit: elements.cuh); chunk c
// of thread t in a tile starts at column e * (t + kThreadsPerBlock * c), so each warp load covers
// 512 contiguous bytes. In the filtering pass a thread keeps kFilterChunks chunks of a tile in
// flight whatever the element width (64 bytes: 16 float32 or 32 16-bit values, so a tile is
// kFilterTileBytes for every type and the bytes in flight do not halve for 16-bit rows: measured,
// benches/NOTES.md "topk16-speed"); the exact route keeps kScanItems values of a tile (more would
// spill at 64 registers). The filtering pass adds L2 prefetches (kPrefetchTiles tiles ahead).
constexpr int kFilterChunks = 4;
constexpr int kFilterTileBytes = 16 * kFilterChunks * kThreadsPerBlock;
constexpr int kScanItems = 16;
constexpr int kScanTile = kScanItems * kThreadsPerBlock;

// Kept candidates in shared memory (then the workspace slice), and the radix-select survivors.
constexpr int kSharedCandidates = 8192;
constexpr int kFrontierCapacity = 8192;

// Radix digits of a 32-bit ordered value, most significant first: 11 + 11 + 10 bits.
constexpr int kDigitBins = 2048;
constexpr int kBinsPerThread = kDigitBins / kThreadsPerBlock;
constexpr int kNumDigits = 3;
__host__ __device__ constexpr int DigitShift(int digit) {
  return digit == 0 ? 21 : (digit == 1 ? 10 : 0);
}
__host__ __device__ constexpr uint32_t DigitMask(int digit) {
  return digit == 2 ? 0x3FFu : 0x7FFu;
}

// The sample: whole 128-byte lines (one per warp load), at most kSampleLines of them, taken every
// `stride` lines with stride >= kMinSampleStride. The primary cutoff keeps ~kRetention * k expected
// candidates plus kRankSlack sampled ranks; the secondary keeps kSecondaryFactor times more ranks.
constexpr int kSampleLineElems = kWarpSize;
constexpr int kSampleLines = 128;
constexpr int kSampleLinesPerWarp = kSampleLines / kWarpsPerBlock;
constexpr int kMinSampleStride = 8;
// Measured (benches/NOTES.md): 1 x k plus 32 ranks beats 2 x k plus 8 by 4-12 %; the slack
// keeps the primary's under-fill (and its secondary re-read) rare. A whole row by one block
// takes less slack (filtered step 6: 24 ranks, ~1 % faster); a split row keeps 32 (24 made
// 32 x 32768 10 % slower: one under-filled row makes every part of its cluster re-read).
constexpr int kRetention = 1;
constexpr int kRankSlack = 32;
constexpr int kWholeRowRankSlack = 24;
constexpr int kSecondaryFactor = 2;

// The filtering pass pulls the row into L2 kPrefetchTiles tiles (kPrefetchBytes) ahead of its
// loads: memory parallelism that costs no registers. The first of them are pulled while the
// sample is taken.
constexpr int kPrefetchLineBytes = 128;
constexpr int kPrefetchTiles = 2;
constexpr int kPrefetchBytes = kPrefetchTiles * kFilterTileBytes;
static_assert(kPrefetchBytes <= kPrefetchLineBytes * kThreadsPerBlock, "one line per thread");

// Unsorted results of rows up to kBitmapColumns are put in column order through a bitmap of the
// row (one bit per column, up to kBitmapWordsPerThread words per thread). Measured
// (benches/NOTES.md, filtered step 6): faster than the block radix sort up to 262144 columns.
constexpr int kBitmapWordsPerThread = 16;
constexpr int kBitmapColumns = kBitmapWordsPerThread * 32 * kThreadsPerBlock;

// The k results are sorted over the block, kSortItemsPerThread each.
constexpr int kSortItemsPerThread = kMaxK / kThreadsPerBlock;
static_assert(kSortItemsPerThread * kThreadsPerBlock == kMaxK, "sort covers kMaxK");

// Split mode: a row per thread block cluster of up to kMaxClusterParts blocks (16 needs the
// non-portable cluster size; the launch takes the largest whose clusters are all resident at once).
// The parts' histograms are added up in two steps: super-bins of a warp's worth of adjacent bins,
// then the bins of the one super-bin that holds the rank.
constexpr int kMaxClusterParts = static_cast<int>(kFilteredMaxSplitParts);
constexpr int kSuperBins = kDigitBins / kWarpSize;

using ColumnSort = cub::BlockRadixSort<uint32_t, kThreadsPerBlock, kSortItemsPerThread>;
using RankSort = cub::BlockRadixSort<uint32_t, kThreadsPerBlock, kSortItemsPerThread, uint32_t>;
// Rank order's one composite-key sort (winners.cuh SortByRank), kRankKeyRadixBits a pass:
// measured (benches/probes/rank_sort_radix.cu, 2048 keys of 26 bits a block), 4 bits 9.9 us a
// sort, 5 bits 11.1, 6 bits 13.1 (the counters' scan grows faster than the passes shrink).
constexpr int kRankKeyRadixBits = 4;
using RankKeySort = cub::BlockRadixSort<uint32_t, kThreadsPerBlock, kSortItemsPerThread,
                                        cub::NullType, kRankKeyRadixBits>;

// How a filtering pass reads its row (benches/NOTES.md "the queue pass's reads"): every tile
// loaded into registers with the row pulled into L2 ahead (split rows, few rows); every other
// tile copied into shared memory as well, so that two tiles are in flight (a queue of more rows
// than workers); or loaded without L2 prefetches (a block a row for more rows than SMs, where
// every block streams at once and the prefetches only add L2 traffic).
enum class PassReads : int { kPrefetched, kStaged, kPlain };

// Cutoffs are ordered keys; a row keeps the non-NaN values whose key is >= the cutoff.
struct Cutoffs {
  uint32_t primary;    // 22-bit: keeps ~kRetention * k expected candidates
  uint32_t secondary;  // 11-bit, <= primary: a deeper band for an underfilled primary
};
// The row a block works on. Kept in shared memory so that the passes do not carry it.
struct RowJob {
  int64_t row;
  int length;  // -1: a masked row
  Cutoffs cutoffs;
  PassReads reads;
};

struct BinFound {
  uint32_t bin;
  uint32_t above;  // items in the bins above
  uint32_t count;  // items in the bin
};

// Queue mode's own state.
struct QueueState {
  unsigned long long next_row;  // the row thread 0 claimed, published at the row's start
};

// Split mode's own state: what the blocks of a row's cluster share.
struct ClusterState {
  uint32_t super[kSuperBins];  // this part's candidates per super-bin (read by the others)
  uint2 boundary[kWarpSize];   // this part's candidates in the k-th key's bin (read by the others)
  int boundary_count;
  uint32_t super_sum[kSuperBins];  // the cluster's super-bins (all parts, and earlier parts)
  uint32_t super_before[kSuperBins];
  uint32_t bins_of_part[kMaxClusterParts][kWarpSize];  // every part's bins of the rank's super-bin
  uint32_t part_offset[kMaxClusterParts];  // where each part's candidates go when merged
  uint32_t total;                          // candidates kept over the cluster
  bool overflow;                           // a part kept more than its sink holds
  BinFound kth_bin;                        // the rank's bin over the cluster
  uint32_t own_above;                      // this part's candidates in the bins above it
  uint32_t above_before;                   // the earlier parts' candidates there
  uint32_t kth_key;                        // the settled row's k-th key ...
  uint32_t column_limit;                   // ... and the last column of it that wins
  uint32_t members_before;                 // winning boundary members in earlier parts
  uint32_t members_mine;                   // ... and in this part
};

struct SharedStorage {
  uint2 candidates[kSharedCandidates];  // (value bits, column), in no particular order
  union {
    uint32_t frontier[kFrontierCapacity];  // the boundary group of a radix selection
    struct {
      uint32_t bits[kMaxK];
      uint32_t col[kMaxK];
    } selected;  // the winners, in no particular order
    ColumnSort::TempStorage column_sort;
    RankSort::TempStorage rank_sort;
    RankKeySort::TempStorage rank_key_sort;
    uint32_t bitmap[kBitmapColumns / 32];  // the winners' columns (unsorted rows or split parts)
    uint4 staged_chunks[kFilterChunks * kThreadsPerBlock];  // a pass's staged tile (PassReads)
  } work;
  uint32_t hist[kDigitBins];                     // all zero between uses
  uint32_t warp_sums[kWarpsPerBlock];            // BlockExclusiveSum's per-warp totals
  uint2 warp_key_range[kWarpsPerBlock];          // the winners' (lowest, highest) key of each warp
  uint32_t warp_bucket_largest[kWarpsPerBlock];  // the fullest rank-order bucket of each warp
  BinFound found[2];
  int kept;  // append counters; kept is read by the other blocks of a split row's cluster
  int frontier_count;
  int selected_count;
  RowJob job;
  uint32_t sample_largest;  // the largest sampled key of the job's row (0: none)
  uint2 bin_key_range;      // a crowded relative bin's (lowest, highest) key (GatherOneKeyBin)
#if JAX_TOPK_FILTERED_PROBE
  int probe;                       // the launch's ProbeFlag values (probe.cuh)
  unsigned long long probe_last;   // thread 0's last phase stamp
  unsigned long long probe_start;  // the block's start (its lifetime, printed per launch)
  long long probe_start_cycles;    // the SM's cycle count at the block's start
#endif
  union {  // a launch's mode: one or the other, never both
    QueueState queue;
    ClusterState cluster;
  };
};
static_assert(sizeof(uint32_t) * kBitmapColumns / 32 <= sizeof(uint32_t) * kFrontierCapacity,
              "the bitmap shares the frontier's space");
static_assert(sizeof(uint4) * kFilterChunks * kThreadsPerBlock <=
                  sizeof(uint32_t) * kFrontierCapacity,
              "a staged tile shares the frontier's space");

}  // namespace
}  // namespace jax_topk
