// Runs a CUDA kernel on the host, for a probe's logic before any device time: one std::thread a
// CUDA thread, a std::barrier for __syncthreads, std::atomic_ref for shared-memory atomics,
// blocks one after another with their own dynamic shared memory. Enough for kernels of block
// barriers and atomics only (no warp intrinsics, no clusters); it checks results, never speed.
// Include it before the kernel's header, in a C++20 host translation unit.
#pragma once

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)

namespace host_simt {

struct Index {
  unsigned x = 0, y = 0, z = 0;
};

inline thread_local Index thread_index, block_index;
inline Index grid_size, block_size;
inline std::barrier<>* block_barrier = nullptr;
inline unsigned char* block_shared = nullptr;

// Runs kernel() as a grid of `grid` blocks of `threads` threads with `shared_bytes` of
// dynamic shared memory, filled with 0xA5 bytes as a device's holds whatever was there.
template <typename Kernel>
void Launch(unsigned grid, unsigned threads, size_t shared_bytes, Kernel kernel) {
  grid_size = {grid, 1, 1};
  block_size = {threads, 1, 1};
  std::vector<std::max_align_t> shared((shared_bytes + sizeof(std::max_align_t) - 1) /
                                       sizeof(std::max_align_t));
  for (unsigned block = 0; block < grid; ++block) {
    block_shared = reinterpret_cast<unsigned char*>(shared.data());
    std::memset(block_shared, 0xA5, shared.size() * sizeof(std::max_align_t));
    std::barrier<> barrier(threads);
    block_barrier = &barrier;
    std::vector<std::thread> workers;
    for (unsigned thread = 0; thread < threads; ++thread) {
      workers.emplace_back([&, thread] {
        thread_index = {thread, 0, 0};
        block_index = {block, 0, 0};
        kernel();
      });
    }
    for (std::thread& worker : workers) worker.join();
  }
}

}  // namespace host_simt

#define threadIdx (host_simt::thread_index)
#define blockIdx (host_simt::block_index)
#define gridDim (host_simt::grid_size)
#define blockDim (host_simt::block_size)

inline void __syncthreads() {
  host_simt::block_barrier->arrive_and_wait();
}

template <typename T>
T atomicAdd(T* address, T value) {
  return std::atomic_ref<T>(*address).fetch_add(value);
}

using std::max;
using std::min;

// CUDA's vector types, for 16- and 8-byte loads.
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct alignas(16) int4 {
  int x, y, z, w;
};
struct alignas(8) uint2 {
  unsigned x, y;
};

// What a kernel header takes from the device side (see merge_runs_kernel.cuh).
inline unsigned char* DynamicShared() {
  return host_simt::block_shared;
}
inline void PrefetchRangeToL2(const void*, size_t) {}
