// Rank order's sort of 2048 winners a block, alone: the two key-value sorts the filtered kernel
// used (by column over 18 bits, then by key descending over 32) against one keys-only sort of a
// 26-bit composite (8 key bits of a bfloat16 row's winners, 18 column bits) at 4, 5 and 6 radix
// bits a pass. Blocks of 512 threads with ~110 KB of shared memory (two an SM, as the kernel).
// Build: nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a rank_sort_radix.cu
#include <cstdio>
#include <cub/block/block_radix_sort.cuh>

constexpr int kThreads = 512, kItems = 4, kSmem = 110 * 1024, kRepeats = 64;

template <int kVariant>
__global__ void __launch_bounds__(kThreads, 2) SortLoop(const unsigned* in, unsigned* out) {
  extern __shared__ __align__(16) unsigned char smem[];
  unsigned keys[kItems], cols[kItems];
  for (int j = 0; j < kItems; ++j) {
    const unsigned v = in[blockIdx.x * 2048 + threadIdx.x * kItems + j];
    keys[j] = v;
    cols[j] = v & 0x3FFFF;
  }
  for (int r = 0; r < kRepeats; ++r) {
    if constexpr (kVariant == 0) {
      using Kv = cub::BlockRadixSort<unsigned, kThreads, kItems, unsigned>;
      Kv sort(*reinterpret_cast<typename Kv::TempStorage*>(smem));
      sort.Sort(cols, keys, 0, 18);
      __syncthreads();
      sort.SortDescendingBlockedToStriped(keys, cols, 0, 32);
    } else {
      using K = cub::BlockRadixSort<unsigned, kThreads, kItems, cub::NullType, kVariant>;
      K(*reinterpret_cast<typename K::TempStorage*>(smem))
          .SortDescendingBlockedToStriped(keys, 0, 26);
    }
    __syncthreads();
    for (int j = 0; j < kItems; ++j) keys[j] = keys[j] * 2654435761u >> 6;  // reshuffle, 26 bits
  }
  for (int j = 0; j < kItems; ++j)
    out[blockIdx.x * 2048 + threadIdx.x + kThreads * j] = keys[j] ^ cols[j];
}

template <int kVariant>
float Time(const unsigned* in, unsigned* out, int blocks) {
  cudaFuncSetAttribute(SortLoop<kVariant>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  SortLoop<kVariant><<<blocks, kThreads, kSmem>>>(in, out);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaEventRecord(a);
  SortLoop<kVariant><<<blocks, kThreads, kSmem>>>(in, out);
  cudaEventRecord(b);
  cudaEventSynchronize(b);
  float ms;
  cudaEventElapsedTime(&ms, a, b);
  return ms * 1000 / kRepeats;  // us for one sort in every block at once
}

int main() {
  const int blocks = 264;
  unsigned *in, *out;
  cudaMalloc(&in, blocks * 2048 * 4);
  cudaMalloc(&out, blocks * 2048 * 4);
  unsigned* host = new unsigned[blocks * 2048];
  unsigned x = 1;
  for (int i = 0; i < blocks * 2048; ++i) host[i] = (x = x * 1664525u + 1013904223u) >> 6;
  cudaMemcpy(in, host, blocks * 2048 * 4, cudaMemcpyHostToDevice);
  printf("rank sort of 2048 winners, us a sort (264 blocks at once):\n");
  printf("  two kv sorts (18 + 32 bits, 4-bit digits): %.2f\n", Time<0>(in, out, blocks));
  printf("  composite 26 bits, 4-bit digits: %.2f\n", Time<4>(in, out, blocks));
  printf("  composite 26 bits, 5-bit digits: %.2f\n", Time<5>(in, out, blocks));
  printf("  composite 26 bits, 6-bit digits: %.2f\n", Time<6>(in, out, blocks));
  printf("  status: %s\n", cudaGetErrorString(cudaGetLastError()));
}
