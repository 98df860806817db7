// The workspaces of indexer_topk's CUDA path, as pure functions of the shapes (no GPU query), so
// the JAX lowering sizes the custom call's two workspace results at trace time. Plain C++:
// compiled into the CPU module (which exports the sizes to Python) and into
// kernels/indexer_topk.cu, which lays its buffers out by the same functions.
//
// The fused path (kernels/indexer_topk.cu) puts in the logits workspace, while no logits are in
// it, the sample's logits [rows][IndexerSampleColumns] and the kept candidates
// [rows][IndexerCandidateCapacity] (value bits, column); a row that falls back to the exact route
// later has its logits recomputed there ([rows][N] float32, the unfused path's layout). The
// selection workspace holds the per-row state that lives through every launch (IndexerRowState)
// and is at least topk_filtered's workspace, which the unfused path hands to the filtered kernel.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/topk_filtered_workspace.h"

namespace jax_topk {

// Key tiles of the tensor-core kernel (64 keys); the sample takes every
// kIndexerSampleTileStride-th.
constexpr int64_t kIndexerKeyTile = 64;
constexpr int64_t kIndexerSampleTileStride = 32;
// Candidates a row may keep (8 bytes each); a row of at most this many columns keeps them all.
constexpr int64_t kIndexerMaxCandidates = 8192;

constexpr int64_t IndexerKeyTiles(int64_t width) {
  return (width + kIndexerKeyTile - 1) / kIndexerKeyTile;
}
// The sample's columns a row: the first 64 keys of every kIndexerSampleTileStride-th key tile.
constexpr int64_t IndexerSampleColumns(int64_t width) {
  return (IndexerKeyTiles(width) + kIndexerSampleTileStride - 1) / kIndexerSampleTileStride *
         kIndexerKeyTile;
}
// A row's candidate capacity: every column where the row is short.
constexpr int64_t IndexerCandidateCapacity(int64_t width) {
  return width < kIndexerMaxCandidates ? width : kIndexerMaxCandidates;
}

// The selection workspace's per-row state, each an array of `rows` 32-bit words after a
// 16-byte header (the count of tiles to recompute).
enum class IndexerRowState : int64_t {
  kThreshold,   // float: a row keeps the values >= it (KeepThreshold of the cutoff)
  kCutoff,      // the ordered key of the sample's cutoff (0: keeps every value)
  kLargest,     // the sample's largest ordered key (0: none)
  kCount,       // candidates the row met (also past the capacity)
  kRecompute,   // 1: the row takes the exact route over recomputed logits
  kTileMarked,  // per query tile (indexed by tile, < rows of them): marked for recomputation
  kTileList,    // the marked tiles, in the order they were marked
  kStates,
};
constexpr int64_t kIndexerStateHeaderBytes = 16;

constexpr int64_t IndexerStateOffset(int64_t rows, IndexerRowState state) {
  return kIndexerStateHeaderBytes + static_cast<int64_t>(state) * rows * 4;
}

constexpr int64_t IndexerCandidatesOffset(int64_t rows, int64_t width) {
  return (rows * IndexerSampleColumns(width) * 4 + 15) / 16 * 16;
}

constexpr size_t IndexerTopkLogitsWorkspaceBytes(int64_t rows, int64_t width) {
  const int64_t logits = rows * width * 4;
  const int64_t fused =
      IndexerCandidatesOffset(rows, width) + rows * IndexerCandidateCapacity(width) * 8;
  return static_cast<size_t>(logits > fused ? logits : fused);
}

constexpr size_t IndexerTopkSelectionWorkspaceBytes(int64_t rows, int64_t width, int32_t k) {
  const size_t filtered = FilteredWorkspaceBytes(rows, width, k);
  const size_t state = static_cast<size_t>(IndexerStateOffset(rows, IndexerRowState::kStates));
  return filtered > state ? filtered : state;
}

}  // namespace jax_topk
