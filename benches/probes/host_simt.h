// Runs a CUDA kernel on the host, for a probe's logic before any device time: one std::thread a
// CUDA thread, a std::barrier for __syncthreads, std::atomic_ref for shared-memory atomics,
// blocks one after another with their own dynamic shared memory. Enough for kernels of block
// barriers, atomics and the full-warp shuffles and reductions below (each a rendezvous of the
// warp's 32 threads; no other warp intrinsics, no clusters); it checks results, never speed.
// Include it before the kernel's header, in a C++20 host translation unit.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <barrier>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
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

// A warp's meeting place for its shuffles and reductions: every lane posts its value, all
// meet, each reads what it needs, all meet again before the slots are reused.
struct Warp {
  std::barrier<> meet{32};
  std::array<uint64_t, 32> posted{};
};
inline std::vector<Warp>* block_warps = nullptr;

// Runs kernel() as a grid of `grid` blocks of `threads` threads with `shared_bytes` of
// dynamic shared memory, filled with 0xA5 bytes as a device's holds whatever was there.
template <typename Kernel>
void Launch(unsigned grid, unsigned threads, size_t shared_bytes, Kernel kernel) {
  if (threads % 32 != 0) std::abort();  // full warps only (the shuffles' meeting places)
  grid_size = {grid, 1, 1};
  block_size = {threads, 1, 1};
  std::vector<std::max_align_t> shared((shared_bytes + sizeof(std::max_align_t) - 1) /
                                       sizeof(std::max_align_t));
  for (unsigned block = 0; block < grid; ++block) {
    block_shared = reinterpret_cast<unsigned char*>(shared.data());
    std::memset(block_shared, 0xA5, shared.size() * sizeof(std::max_align_t));
    std::barrier<> barrier(threads);
    block_barrier = &barrier;
    std::vector<Warp> warps(threads / 32);  // full warps only
    block_warps = &warps;
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

template <typename T>
T atomicMax(T* address, T value) {
  std::atomic_ref<T> word(*address);
  T seen = word.load();
  while (seen < value && !word.compare_exchange_weak(seen, value)) {
  }
  return seen;
}

namespace host_simt {

// Every lane of the calling thread's warp posts `value`; returns all 32 (the mask is ignored:
// full warps only).
template <typename T>
std::array<T, 32> WarpPosts(T value) {
  static_assert(sizeof(T) <= sizeof(uint64_t), "a value fits a slot");
  Warp& warp = (*block_warps)[thread_index.x / 32];
  uint64_t slot = 0;
  std::memcpy(&slot, &value, sizeof(T));
  warp.posted[thread_index.x % 32] = slot;
  warp.meet.arrive_and_wait();
  std::array<T, 32> all;
  for (int lane = 0; lane < 32; ++lane) std::memcpy(&all[lane], &warp.posted[lane], sizeof(T));
  warp.meet.arrive_and_wait();
  return all;
}

}  // namespace host_simt

template <typename T>
T __shfl_up_sync(unsigned, T value, int offset) {
  const int lane = static_cast<int>(host_simt::thread_index.x % 32);
  const std::array<T, 32> all = host_simt::WarpPosts(value);
  return lane >= offset ? all[lane - offset] : value;
}

template <typename T>
T __shfl_sync(unsigned, T value, int source) {
  return host_simt::WarpPosts(value)[source & 31];  // CUDA takes the lane modulo 32
}

inline unsigned __reduce_add_sync(unsigned, unsigned value) {
  unsigned sum = 0;
  for (unsigned v : host_simt::WarpPosts(value)) sum += v;
  return sum;
}

inline unsigned __reduce_max_sync(unsigned, unsigned value) {
  const std::array<unsigned, 32> all = host_simt::WarpPosts(value);
  return *std::max_element(all.begin(), all.end());
}

inline unsigned __reduce_min_sync(unsigned, unsigned value) {
  const std::array<unsigned, 32> all = host_simt::WarpPosts(value);
  return *std::min_element(all.begin(), all.end());
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
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) {
  return {x, y, z, w};
}

// What a kernel header takes from the device side (see merge_runs_kernel.cuh).
inline unsigned char* DynamicShared() {
  return host_simt::block_shared;
}
inline void PrefetchRangeToL2(const void*, size_t) {}
