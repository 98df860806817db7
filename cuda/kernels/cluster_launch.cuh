// The launch configuration of a grid of 1-D thread block clusters of `parts` blocks (one
// cluster a row), shared by the filtered kernel's split rows and topk_f32_cluster.
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

}  // namespace jax_topk
