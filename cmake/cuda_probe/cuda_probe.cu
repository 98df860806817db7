// What the CUDA extension needs of a toolchain, in a few lines (cmake/JaxTopkCuda.cmake builds
// it): CUB and bfloat16 headers, cooperative groups, sm_80 warp reductions, and the static
// runtime linked into a shared library.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cub/block/block_radix_sort.cuh>

__global__ void ProbeKernel(const __nv_bfloat16* in, unsigned* out) {
  using Sort = cub::BlockRadixSort<unsigned, 32, 1>;
  __shared__ typename Sort::TempStorage storage;
  unsigned key[1] = {static_cast<unsigned>(__bfloat162float(in[threadIdx.x]))};
  Sort(storage).Sort(key);
  cooperative_groups::this_thread_block().sync();
  out[threadIdx.x] = __reduce_add_sync(0xffffffffu, key[0]);
}

extern "C" const char* JaxTopkCudaProbe(const __nv_bfloat16* in, unsigned* out) {
  ProbeKernel<<<1, 32>>>(in, out);
  return cudaGetErrorString(cudaGetLastError());
}
