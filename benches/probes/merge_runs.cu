// merge_topk for rows that arrive as a few sorted runs (the lists of top_k(sorted=True) calls:
// a running top-k over key chunks, split-KV decode), alone: the algorithm of
// benches/probes/merge_runs_model.py on the GPU, checked against a host reference and timed
// against the read floor. Not in the product: this probe says whether the path is worth it.
// A persistent 512-thread block an SM (192 KB of shared memory), a row at a time:
// 1. The row's 64-bit rank keys R = ordered key << 32 | ~column (0: column < 0 or NaN) into
//    shared memory; every place whose R is above its left neighbour's starts a run. More than
//    kMaxRuns runs: the row is not this path's (the probe flags it; the product would take its
//    existing path).
// 2. Runs cut to k; a tree of pairwise merges, each output cut to k (places into the row,
//    16-bit, ping-ponged). A level's outputs are one range split evenly over the threads: a
//    thread finds its first output's source by a binary search of its pair (the co-rank,
//    ties to the left run), then merges its share one output at a time.
// 3. The last sequence's first min(k, candidates) places are written, in rank order.
// The kernel: merge_runs_kernel.cuh; the rows and the reference: merge_runs_rows.h (both also
// run on the host by merge_runs_on_host.cc). Build and run: bash benches/probes/merge_runs.sh
// (prints a table; exit status 1 on a mismatch).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "benches/probes/merge_runs_kernel.cuh"
#include "benches/probes/merge_runs_rows.h"

using jax_topk::Bf16Values;
using jax_topk::F32Values;

namespace {

template <typename Values>
struct Run {
  using Bits = typename Values::Bits;
  Bits* values;
  int32_t* indices;
  Bits* out_values;
  int32_t* out_indices;
  int64_t rows;
  int width, k, grid;
  void Launch(bool prefetch, cudaStream_t stream = 0) const {
    merge_runs::MergeRunsKernel<Values>
        <<<grid, merge_runs::kThreads, sizeof(merge_runs::Shared), stream>>>(
            values, indices, rows, width, k, prefetch, out_values, out_indices);
  }
};

// Runs one case on the device; returns the mismatching rows (and prints the first).
template <typename Values>
int64_t Check(const char* name, std::mt19937& rng, int64_t rows, merge_runs::Shape shape, int kind,
              int sms) {
  using Bits = typename Values::Bits;
  const merge_runs::Case<Values> check(rng, rows, shape, kind, merge_runs::kMaxRuns);
  const int k = check.k;
  Run<Values> run{nullptr, nullptr,     nullptr, nullptr,
                  rows,    check.width, k,       static_cast<int>(std::min<int64_t>(rows, sms))};
  cudaMalloc(&run.values, check.values.size() * sizeof(Bits));
  cudaMalloc(&run.indices, check.indices.size() * 4);
  cudaMalloc(&run.out_values, rows * k * sizeof(Bits));
  cudaMalloc(&run.out_indices, rows * k * 4);
  cudaMemcpy(run.values, check.values.data(), check.values.size() * sizeof(Bits),
             cudaMemcpyHostToDevice);
  cudaMemcpy(run.indices, check.indices.data(), check.indices.size() * 4, cudaMemcpyHostToDevice);
  run.Launch(false);
  std::vector<Bits> got_values(rows * k);
  std::vector<int32_t> got_indices(rows * k);
  cudaMemcpy(got_values.data(), run.out_values, rows * k * sizeof(Bits), cudaMemcpyDeviceToHost);
  cudaMemcpy(got_indices.data(), run.out_indices, rows * k * 4, cudaMemcpyDeviceToHost);
  const cudaError_t status = cudaDeviceSynchronize();
  const int64_t bad = check.Mismatches(name, got_values, got_indices, merge_runs::kNotRuns,
                                       cudaGetErrorString(status));
  cudaFree(run.values);
  cudaFree(run.indices);
  cudaFree(run.out_values);
  cudaFree(run.out_indices);
  return bad + (status != cudaSuccess);
}

float MedianUs(std::vector<float> ms) {
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2] * 1000.0f;
}

template <typename Values>
float TimeUs(const Run<Values>& run, bool prefetch) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<float> ms;
  for (int repeat = 0; repeat < 21; ++repeat) {
    cudaEventRecord(start);
    run.Launch(prefetch);
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float elapsed;
    cudaEventElapsedTime(&elapsed, start, stop);
    if (repeat > 0) ms.push_back(elapsed);
  }
  return MedianUs(ms);
}

// The copy rate (bytes read plus written a second) of a device-to-device copy of `bytes`.
double CopyRate(size_t bytes) {
  void *a, *b;
  cudaMalloc(&a, bytes);
  cudaMalloc(&b, bytes);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<float> ms;
  for (int repeat = 0; repeat < 21; ++repeat) {
    cudaEventRecord(start);
    cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float elapsed;
    cudaEventElapsedTime(&elapsed, start, stop);
    if (repeat > 0) ms.push_back(elapsed);
  }
  cudaFree(a);
  cudaFree(b);
  return 2.0 * bytes / (MedianUs(ms) * 1e-6);
}

template <typename Values>
void Bench(const char* dtype, std::mt19937& rng, int sms, double copy_rate) {
  using Bits = typename Values::Bits;
  const int64_t rows = 5536;
  const int lists = 8, per_list = 2048, k = 2048, width = lists * per_list;
  std::vector<Bits> values;
  std::vector<int32_t> indices;
  merge_runs::MakeRows<Values>(rng, rows, lists, per_list, 0, &values, &indices);
  Run<Values> run{nullptr, nullptr, nullptr, nullptr, rows, width, k, sms};
  cudaMalloc(&run.values, values.size() * sizeof(Bits));
  cudaMalloc(&run.indices, indices.size() * 4);
  cudaMalloc(&run.out_values, rows * k * sizeof(Bits));
  cudaMalloc(&run.out_indices, rows * k * 4);
  cudaMemcpy(run.values, values.data(), values.size() * sizeof(Bits), cudaMemcpyHostToDevice);
  cudaMemcpy(run.indices, indices.data(), indices.size() * 4, cudaMemcpyHostToDevice);
  const double floor_us = rows * width * (sizeof(Bits) + 4.0) / copy_rate * 1e6;
  for (const bool prefetch : {false, true}) {
    const float us = TimeUs(run, prefetch);
    std::printf("| %s | 5536 x 8 x 2048 sorted lists | %s | %.1f | %.1f | %.2fx |\n", dtype,
                prefetch ? "next row into L2" : "no prefetch", us, floor_us, us / floor_us);
  }
  cudaFree(run.values);
  cudaFree(run.indices);
  cudaFree(run.out_values);
  cudaFree(run.out_indices);
}

}  // namespace

int main() {
  int device = 0, sms = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  cudaFuncSetAttribute(merge_runs::MergeRunsKernel<F32Values>,
                       cudaFuncAttributeMaxDynamicSharedMemorySize, sizeof(merge_runs::Shared));
  cudaFuncSetAttribute(merge_runs::MergeRunsKernel<Bf16Values>,
                       cudaFuncAttributeMaxDynamicSharedMemorySize, sizeof(merge_runs::Shared));
  std::mt19937 rng(15);
  const int64_t bad = merge_runs::ForEveryCheck(
      [&](auto values, const char* name, merge_runs::Shape shape, int kind) {
        return Check<decltype(values)>(name, rng, 300, shape, kind, sms);
      });
  const double copy_rate = CopyRate(size_t{1} << 30);
  std::printf("\ncopy rate %.2f TB/s (read + write)\n\n", copy_rate / 1e12);
  std::printf(
      "| dtype | shape | variant | us | read floor us | x floor |\n| --- | --- | --- | --- | --- | "
      "--- |\n");
  Bench<F32Values>("float32", rng, sms, copy_rate);
  Bench<Bf16Values>("bfloat16", rng, sms, copy_rate);
  std::printf("\n%s\n", bad == 0 ? "every check exact" : "MISMATCHES: see above");
  return bad == 0 ? 0 : 1;
}
