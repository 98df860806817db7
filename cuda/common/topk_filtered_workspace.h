// The workspace topk_filtered asks for, as a pure function of the shapes (no GPU query), so
// the JAX shape rule can size the custom call's workspace output at trace time. Plain C++:
// compiled by g++ into the CPU module and by nvcc into kernels/topk_filtered.cu, which takes its
// split and slice constants from here. The kernel stays exact for any size >= 4096 bytes.
#pragma once

#include <cstddef>
#include <cstdint>

namespace jax_topk {

// The queue's counters; the kernel's own header never needs more than this.
constexpr int64_t kFilteredHeaderBytes = 4096;
// Worker slots budgeted: at least 2 blocks x the SM count of current GPUs (H200: 2 x 132).
// A GPU with more workers still runs exactly, with smaller overflow slices.
constexpr int64_t kFilteredWorkerSlots = 320;
// Candidates a worker may keep in global memory beyond its shared-memory buffer (8 bytes each).
constexpr int64_t kFilteredSliceEntries = 8192;
// A row is split across a cluster of blocks (KV-split) in parts of at least this many columns
// (of the width; a shorter row's parts are shorter), and in at most kFilteredMaxSplitParts.
constexpr int64_t kFilteredSplitPartColumns = 4096;
constexpr int64_t kFilteredMaxSplitParts = 16;

// The parts a row of `width` columns could use (before the kFilteredMaxSplitParts cap).
constexpr int64_t FilteredUsefulParts(int64_t width) {
  return (width + kFilteredSplitPartColumns - 1) / kFilteredSplitPartColumns;
}

constexpr size_t FilteredWorkspaceBytes(int64_t rows, int64_t width, int32_t k) {
  static_cast<void>(k);  // the slices are sized for kMaxK; smaller k only fills them less
  if (rows <= 0 || width <= 0) return static_cast<size_t>(kFilteredHeaderBytes);
  const int64_t slice_entries = width < kFilteredSliceEntries ? width : kFilteredSliceEntries;
  const int64_t useful_parts = FilteredUsefulParts(width);
  const int64_t parts_per_row =
      useful_parts < kFilteredMaxSplitParts ? useful_parts : kFilteredMaxSplitParts;
  // rows * parts_per_row bounds the blocks any launch can use (compared by division: no overflow).
  const int64_t workers =
      rows > kFilteredWorkerSlots / parts_per_row ? kFilteredWorkerSlots : rows * parts_per_row;
  return static_cast<size_t>(kFilteredHeaderBytes + workers * slice_entries * 8);
}

}  // namespace jax_topk
