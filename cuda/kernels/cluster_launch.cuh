// The launch configuration of a grid of 1-D thread block clusters of `parts` blocks (one
// cluster a row), and whether a cluster kernel has its code on the current device; shared by the
// filtered kernel's split rows and topk_f32_cluster.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace jax_topk {

// `attribute` must outlive the launch: the configuration points at it.
inline cudaLaunchConfig_t ClusterLaunchConfig(int64_t grid, int parts, int threads,
                                              size_t shared_bytes, cudaStream_t stream,
                                              cudaLaunchAttribute& attribute) {
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = static_cast<unsigned int>(parts);
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned int>(grid));
  config.blockDim = dim3(static_cast<unsigned int>(threads));
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return config;
}

// Whether `kernel`, as the current device would run it, was compiled for sm_90 or later: cluster
// kernels compile to an empty body for older targets, and a device of compute capability 9+ runs
// such code when the build named only older targets (the driver JIT-compiles their PTX). The
// device's compute capability alone would then launch kernels that write nothing. ptxVersion is
// the virtual architecture the code came from (90 for sm_90a SASS; 80 for code JIT-compiled from
// compute_80), not the device's.
inline bool KernelHasClusterCode(const void* kernel) {
  cudaFuncAttributes attributes = {};
  if (cudaFuncGetAttributes(&attributes, kernel) != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it so that a later launch does not report it
    return false;
  }
  return attributes.ptxVersion >= 90;
}

}  // namespace jax_topk
