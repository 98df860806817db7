// What a step of topk_f32_cluster's exchanges costs on this GPU (benches/NOTES.md
// "topk_f32_cluster, by phase"), timed inside one kernel of a 16-block cluster of 512 threads
// (one block an SM), globaltimer ns over many repetitions, thread 0 of block 0 reporting:
//   ring:      a token pushed (st.async + mbarrier) to the next block, waited for: one hop;
//   exchange:  every block pushes 64 words to every block, warp 0 waits for all 16 (the other
//              warps run ahead): the exchanges' throughput;
//   exchange+: the same with the 512 threads' __syncthreads before and after (as in the kernel);
//   remote ld: a dependent chain of loads from the next block's shared memory (generic address);
//   sync:      __syncthreads of 512 threads;  cluster: cluster.sync of 16 blocks.
// nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Icuda cluster_latency.cu
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdio>

#include "kernels/cluster_push.cuh"

namespace cg = cooperative_groups;
using namespace jax_topk;

constexpr int kParts = 16;
constexpr int kRounds = 64;
constexpr int kExchangeRounds = 16;

struct Shared {
  uint64_t ring_arrived[kRounds];
  uint64_t exchange_arrived[2][kExchangeRounds];
  uint32_t ring_token[kRounds];
  uint32_t exchange_words[2][kExchangeRounds][kParts][64];
  uint32_t chase[64];
};

__device__ unsigned long long g_ns[8];

__device__ __forceinline__ unsigned long long Now() {
  unsigned long long ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  return ns;
}

__global__ void __launch_bounds__(512, 1) Latency(int dummy) {
  extern __shared__ uint4 words[];
  Shared& s = *reinterpret_cast<Shared*>(words);
  const cg::cluster_group cluster = cg::this_cluster();
  const uint32_t part = cluster.block_rank();
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    for (int r = 0; r < kRounds; ++r) MbarrierInit(&s.ring_arrived[r], 1);
    for (int r = 0; r < kExchangeRounds; ++r) {
      MbarrierInit(&s.exchange_arrived[0][r], 1);
      MbarrierInit(&s.exchange_arrived[1][r], 1);
    }
    for (int r = 0; r < kRounds; ++r) MbarrierExpectBytes(&s.ring_arrived[r], 4);
    for (int r = 0; r < kExchangeRounds; ++r) {
      MbarrierExpectBytes(&s.exchange_arrived[0][r], kParts * 256);
      MbarrierExpectBytes(&s.exchange_arrived[1][r], kParts * 256);
    }
    FenceMbarrierInit();
  }
  for (int i = threadIdx.x; i < 64; i += 512) s.chase[i] = (i + 1 + dummy) % 64;
  cluster.sync();
  // Ring: block 0 starts, each block forwards when its token arrives.
  const uint32_t next = (part + 1) % kParts;
  unsigned long long start = Now();
  if (threadIdx.x == 0) {
    for (int r = 0; r < kRounds; ++r) {
      if (part != 0) MbarrierWaitFirstPhase(&s.ring_arrived[r]);
      PushWord(MapToBlock(SharedAddress(&s.ring_token[r]), next),
               MapToBlock(SharedAddress(&s.ring_arrived[r]), next), r);
      if (part == 0) MbarrierWaitFirstPhase(&s.ring_arrived[r]);
    }
    if (part == 0) g_ns[0] = Now() - start;  // kRounds * kParts hops
  }
  cluster.sync();
  // Exchange: warp w pushes this block's 64 words to block w; warp 0 waits.
  start = Now();
  // Warp w pushes this block's 64 words to block w and waits for its own block's round: the
  // warps run ahead of each other (what the exchange's bandwidth allows).
  for (int r = 0; r < kExchangeRounds; ++r) {
    if (warp < kParts) {
      PushWords(MapToBlock(SharedAddress(&s.exchange_words[0][r][part][2 * lane]), warp),
                MapToBlock(SharedAddress(&s.exchange_arrived[0][r]), warp), r, lane);
    }
    if (warp == 0) MbarrierWaitFirstPhase(&s.exchange_arrived[0][r]);
  }
  if (threadIdx.x == 0 && part == 0) g_ns[1] = Now() - start;
  cluster.sync();
  start = Now();
  for (int r = 0; r < kExchangeRounds; ++r) {
    __syncthreads();
    if (warp < kParts) {
      PushWords(MapToBlock(SharedAddress(&s.exchange_words[1][r][part][2 * lane]), warp),
                MapToBlock(SharedAddress(&s.exchange_arrived[1][r]), warp), r, lane);
    }
    if (warp == 0) MbarrierWaitFirstPhase(&s.exchange_arrived[1][r]);
    __syncthreads();
  }
  if (threadIdx.x == 0 && part == 0) g_ns[2] = Now() - start;
  cluster.sync();
  // Remote load chain.
  if (threadIdx.x == 0) {
    const uint32_t* remote = cluster.map_shared_rank(s.chase, next);
    uint32_t at = 0;
    start = Now();
    for (int r = 0; r < 256; ++r) at = remote[at];
    if (part == 0) {
      g_ns[3] = Now() - start;
      g_ns[7] = at;
    }
  }
  cluster.sync();
  start = Now();
  for (int r = 0; r < 256; ++r) __syncthreads();
  if (threadIdx.x == 0 && part == 0) g_ns[4] = Now() - start;
  cluster.sync();
  start = Now();
  for (int r = 0; r < 64; ++r) cluster.sync();
  if (threadIdx.x == 0 && part == 0) g_ns[5] = Now() - start;
}

int main() {
  cudaLaunchAttribute attribute;
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = kParts;
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  const int shared_bytes = sizeof(Shared) > 116 * 1024 ? sizeof(Shared) : 116 * 1024;
  cudaFuncSetAttribute(Latency, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes);
  cudaFuncSetAttribute(Latency, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(kParts);
  config.blockDim = dim3(512);
  config.dynamicSmemBytes = shared_bytes;
  config.attrs = &attribute;
  config.numAttrs = 1;
  for (int trial = 0; trial < 3; ++trial) {
    int dummy = 0;
    void* arguments[] = {&dummy};
    cudaError_t error =
        cudaLaunchKernelExC(&config, reinterpret_cast<const void*>(&Latency), arguments);
    if (error == cudaSuccess) error = cudaDeviceSynchronize();
    if (error != cudaSuccess) {
      std::printf("error: %s\n", cudaGetErrorString(error));
      return 1;
    }
    unsigned long long ns[8];
    cudaMemcpyFromSymbol(ns, g_ns, sizeof(ns));
    std::printf(
        "ring hop %.0f ns | exchange (warp 0 waits, others run ahead) %.0f ns | exchange with "
        "two __syncthreads %.0f ns | remote ld %.0f ns | __syncthreads %.1f ns | cluster.sync "
        "%.0f ns\n",
        ns[0] / double(kRounds * kParts), ns[1] / double(kExchangeRounds),
        ns[2] / double(kExchangeRounds), ns[3] / 256.0, ns[4] / 256.0, ns[5] / 64.0);
  }
  return 0;
}
