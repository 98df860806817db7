// The host's launch planning: queue or split mode, how many blocks a split row gets (the most
// whose clusters are all resident at once), whether a split launch spreads one block per SM, and
// how the workspace divides into per-block slices. Device queries are cached per device.
//
// Contract: host code only, called by LaunchTopkFiltered on the launching thread; nothing here
// launches, synchronises or allocates. The split kernel is passed in as `split_kernel`; the
// queries about it are cached per kernel (one per element type: the template argument Elements
// names it) and per device.
#pragma once

#include "kernels/cluster_launch.cuh"
#include "kernels/filtered/layout.cuh"

namespace jax_topk {
namespace {

// A bound on the queue's pool (its slices shrink past kFilteredWorkerSlots).
constexpr int kMaxPoolBlocks = 480;
// The cluster size every sm_90 device launches; up to kMaxClusterParts needs the non-portable size.
constexpr int kPortableClusterParts = 8;
constexpr int kMinSplitSliceEntries = 1024;  // below this a split part would overflow too often
// A split launch of at most kSpreadBytesPerSm of scores per SM runs one block per SM (its shared
// memory padded past half an SM's): a block alone on its SM takes its sample and its cluster's
// steps at twice the issue rate. Longer rows keep two blocks per SM, which their pass needs to
// stream (measured, benches/NOTES.md filtered step 8).
constexpr int64_t kSpreadBytesPerSm = int64_t{192} << 10;

constexpr int kMaxCachedDevices = 64;

// compute() (>= 0) for `device`, computed once per device: cache[device] holds it plus one, so
// that 0 means not yet known. Racing writers store the same value.
template <class Compute>
int CachedPerDevice(int (&cache)[kMaxCachedDevices], int device, const Compute& compute) {
  if (device < 0 || device >= kMaxCachedDevices) return compute();
  if (cache[device] == 0) cache[device] = compute() + 1;
  return cache[device] - 1;
}

int SmCount(int device) {
  static int cache[kMaxCachedDevices] = {};
  return CachedPerDevice(cache, device, [&] {
    int count = 0;
    if (cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
        count <= 0) {
      count = 1;  // still exact: a pool of kBlocksPerSm workers
    }
    return count;
  });
}

// The workspace: the queue's counters, then an overflow slice for each block.
struct WorkspacePlan {
  int parts = 1;  // > 1: split mode, a cluster of `parts` blocks per row
  int64_t grid = 0;
  int slice_entries = 0;
};

// The queue's one counter, queue_next; the slices start at kFilteredHeaderBytes.
constexpr size_t kCounterBytes = sizeof(unsigned long long);

WorkspacePlan PlanWorkspace(int64_t rows, int parts, int pool, size_t workspace_bytes) {
  WorkspacePlan plan;
  plan.parts = parts;
  plan.grid = parts > 1 ? rows * parts : (rows < pool ? rows : pool);
  const size_t free_bytes =
      workspace_bytes > kFilteredHeaderBytes ? workspace_bytes - kFilteredHeaderBytes : 0;
  const size_t entries = free_bytes / (plan.grid * sizeof(uint2));
  plan.slice_entries =
      static_cast<int>(entries < kFilteredSliceEntries ? entries : kFilteredSliceEntries);
  return plan;
}

// The cluster's launch configuration for `parts` blocks per row.
cudaLaunchConfig_t ClusterConfig(int64_t grid, int parts, size_t shared_bytes, cudaStream_t stream,
                                 cudaLaunchAttribute& attribute) {
  return ClusterLaunchConfig(grid, parts, kThreadsPerBlock, static_cast<size_t>(shared_bytes),
                             stream, attribute);
}

// The dynamic shared memory of a split block that has its SM alone: just over half an SM's
// (cached; sizeof(SharedStorage) where the device cannot give a block that much).
int SpreadSharedBytes(int device) {
  static int cache[kMaxCachedDevices] = {};
  return CachedPerDevice(cache, device, [&] {
    int per_sm = 0;
    int per_block = 0;
    const int own = static_cast<int>(sizeof(SharedStorage));
    if (cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device) !=
            cudaSuccess ||
        cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
            cudaSuccess) {
      cudaGetLastError();
      return own;
    }
    const int half_and_more = per_sm / 2 + 16;
    return half_and_more > own && half_and_more <= per_block ? half_and_more : own;
  });
}

// The dynamic shared memory of a split block (spread: one block per SM).
int SplitSharedBytes(int device, bool spread) {
  return spread ? SpreadSharedBytes(device) : static_cast<int>(sizeof(SharedStorage));
}

// How many clusters of `parts` blocks the device holds at once (cached; 0: none).
template <class Elements>
int ResidentClusters(const void* split_kernel, int device, int parts, bool spread) {
  static int cache[2][kMaxClusterParts + 1][kMaxCachedDevices] = {};
  return CachedPerDevice(cache[spread][parts], device, [&] {
    cudaLaunchAttribute attribute;
    const cudaLaunchConfig_t config =
        ClusterConfig(parts, parts, SplitSharedBytes(device, spread), nullptr, attribute);
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, split_kernel, &config) != cudaSuccess) {
      cudaGetLastError();  // a size this device cannot launch: not used
      clusters = 0;
    }
    return clusters;
  });
}

// The most parts a split row may have on `device`: 1 (no split mode) before sm_90, whose thread
// block clusters it needs, and where the split kernel's code was compiled for an older target
// (its body is empty); the portable cluster size where the non-portable one is refused. Per
// kernel: the non-portable size is a kernel's own attribute.
template <class Elements>
int MaxSplitParts(const void* split_kernel, int device) {
  static int cache[kMaxCachedDevices] = {};
  return CachedPerDevice(cache, device, [&] {
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        major < 9 || !KernelHasClusterCode(split_kernel)) {
      return 1;
    }
    if (cudaFuncSetAttribute(split_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) !=
        cudaSuccess) {
      cudaGetLastError();  // not sticky: clear it so that the launch does not report it
      return kPortableClusterParts;
    }
    return kMaxClusterParts;
  });
}

// Split mode's parts a row: the most, up to the row's useful parts, whose clusters for all the
// rows are resident at once (a second wave would double the launch); 1: none (queue mode).
template <class Elements>
int SplitParts(const void* split_kernel, int device, int64_t rows, int64_t useful_parts,
               bool spread) {
  const int limit = MaxSplitParts<Elements>(split_kernel, device);
  const int most = static_cast<int>(useful_parts < limit ? useful_parts : limit);
  for (int parts = most; parts > 1; --parts) {
    if (ResidentClusters<Elements>(split_kernel, device, parts, spread) >= rows) return parts;
  }
  return 1;
}

}  // namespace
}  // namespace jax_topk
